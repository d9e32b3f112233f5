"""What every verdict and figure is measured with: intervals over questions, the one timer, and the benchmark's
machinery (its entries, the runners, the worker processes, peers in turn, profiles, the machine)."""
