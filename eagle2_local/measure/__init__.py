"""Measuring this machine: the tree budget's calibration (timings and their checks), its on-disk cache,
micro-benchmarks of verify and draft costs, and ``bench`` (plain and eagle2-local side by side)."""
