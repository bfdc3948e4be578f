"""Tests of eagle2_local/tree/: draft trees, proposals, sampling warpers, top-k."""
