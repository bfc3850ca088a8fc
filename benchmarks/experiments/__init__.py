"""The papers' §5 reproductions and the cost-model experiments (``python -m benchmarks.experiments.<name>``)."""
