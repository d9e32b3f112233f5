"""Planning: what Snakemake imports while it plans (typed config, stage command lines, code inputs, the
registry of models and study runs, data-source and deploy planning). Torch-free: tests/test_import_layers.py."""
