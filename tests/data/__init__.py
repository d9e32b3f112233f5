"""Tests of pipeline/data/."""
