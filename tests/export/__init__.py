"""Tests of pipeline/export/."""
