"""Tests of eagle2_local/bench/: the bench harness, prompt sets, results."""
