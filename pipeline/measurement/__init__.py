"""What every verdict and figure is measured with: intervals over questions, latency taken in turn (numpy only)."""
