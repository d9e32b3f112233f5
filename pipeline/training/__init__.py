"""The training loop every training stage shares, by job: `loop` (train()), `batching` (the batch plan and the
loader), `checkpoints` (save, choose, resume), `processes` (ranks, DDP, sums over ranks) and `run_settings`
(threads, seeds, device, precision) that a stage applies before it builds its models."""
