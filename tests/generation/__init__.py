"""Tests of eagle2_local/generation/: the generation loop."""
