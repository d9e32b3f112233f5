"""Tests of pipeline/training/."""
