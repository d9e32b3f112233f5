"""Benchmarks and evidence scripts, run as modules from the project root: `python -m benchmarks.<name>`. They
import each other (and `pipeline`) as packages, so tests import them as any module."""
