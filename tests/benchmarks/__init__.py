"""Tests of benchmarks/."""
