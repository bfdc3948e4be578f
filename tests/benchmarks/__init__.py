"""Tests of the scripts in benchmarks/ (tables, synthetic models, the oracle, recorded curves)."""
