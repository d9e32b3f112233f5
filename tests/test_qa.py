"""QA batching glue: dynamic trimming keeps every per-position tensor aligned."""

import torch

from pipeline.qa import window_collate


def test_window_collate_trims_inputs_and_cached_teacher_logits_together():
    attention_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    windows = {
        "input_ids": torch.arange(10).view(2, 5),
        "attention_mask": attention_mask,
        "teacher_start_logits": torch.randn(2, 5),
        "start_positions": torch.tensor([1, 0]),
    }
    batch = window_collate(windows)([1, 0])
    assert batch["input_ids"].shape == (2, 3) and batch["teacher_start_logits"].shape == (2, 3)
    assert torch.equal(batch["teacher_start_logits"], windows["teacher_start_logits"][[1, 0], :3])
    assert torch.equal(batch["start_positions"], torch.tensor([0, 1]))
