"""Tests of pipeline/distillation/."""
