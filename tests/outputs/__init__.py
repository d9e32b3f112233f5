"""Tests of pipeline/outputs/."""
