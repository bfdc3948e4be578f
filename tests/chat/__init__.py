"""Tests of eagle2_local/chat/: chat templates, conversations, tool calls."""
