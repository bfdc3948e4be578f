"""Tests of eagle2_local/hub/: models and heads by Hugging Face repository name."""
