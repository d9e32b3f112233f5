"""Data: SQuAD loading and validation, the synthetic world, the MLM corpus (generated, written, read), masking,
the QA windows as tensors, task-stage augmentation."""
