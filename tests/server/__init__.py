"""Tests of eagle2_local/server/: eagle2-local serve."""
