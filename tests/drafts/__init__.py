"""Tests of eagle2_local/drafts/: every draft engine (EAGLE heads, draft models, lookups, MTP, assistants)."""
