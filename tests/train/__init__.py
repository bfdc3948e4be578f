"""Tests of eagle2_local/train/: training EAGLE-3 heads."""
