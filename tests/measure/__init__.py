"""Tests of eagle2_local/measure/: calibration, the cost cache, machine load."""
