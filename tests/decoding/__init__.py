"""Tests of eagle2_local/decoding/: the target's verification, acceptance, grammars, stopping, stats."""
