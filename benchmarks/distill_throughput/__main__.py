"""`python -m benchmarks.distill_throughput`: runs the command line (cli.main)."""

from benchmarks.distill_throughput.cli import main
from pipeline.startup import libraries_loaded

if __name__ == "__main__":
    libraries_loaded()  # collection resumes (benchmarks/__init__.py)
    main()
