"""`python -m benchmarks.distill_throughput`: runs the command line (cli.main)."""

from benchmarks.distill_throughput.cli import main

if __name__ == "__main__":
    main()
