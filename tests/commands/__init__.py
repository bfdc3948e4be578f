"""Tests of eagle2_local/commands/: the eagle2-local command line."""
