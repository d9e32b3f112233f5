"""Tests of pipeline/measurement/."""
