"""Tests of pipeline/reporting/."""
