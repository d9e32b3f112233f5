"""Tests of pipeline/stages/."""
