"""Tests of pipeline/plan/."""
