"""Tests of pipeline/runtime/."""
