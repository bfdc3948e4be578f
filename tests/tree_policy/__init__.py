"""Tests of eagle2_local/tree_policy/: how big each round's tree is (the auto budget and its parts)."""
