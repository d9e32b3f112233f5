"""The shared training loop: logging, accumulation, and bit-for-bit resume after a crash."""

import json

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from pipeline.config import TrainConfig
from pipeline.train import count_optimizer_steps, epoch_batches, train

N_EXAMPLES = 40
LENGTHS = [(index * 7) % 13 + 1 for index in range(N_EXAMPLES)]  # stand-in token counts


class TinyRegressor(torch.nn.Module):
    """Small enough for milliseconds; dropout makes the global RNG matter, as in real models."""

    def __init__(self, dropout=0.2):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(dropout), torch.nn.Linear(8, 1))

    def forward(self, x):
        return self.layers(x).squeeze(-1)


def make_data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(N_EXAMPLES, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return x, y


def run_training(tmp_path, cfg, crash_at_micro_batch=None, fingerprint="run-a", seed=7, dropout=0.2):
    torch.manual_seed(seed)
    model = TinyRegressor(dropout)
    x, y = make_data()
    calls = {"n": 0}

    def compute_loss(batch):
        calls["n"] += 1
        if crash_at_micro_batch is not None and calls["n"] == crash_at_micro_batch:
            raise RuntimeError("simulated crash")
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        return {"loss": loss, "mse": loss.detach()}

    def collate(indices):
        return {"x": x[indices], "y": y[indices], "input_ids": torch.ones(len(indices), 3, dtype=torch.long)}

    result = train(
        module=model, compute_loss=compute_loss, examples=list(range(N_EXAMPLES)), collate=collate, cfg=cfg,
        seed=seed, device=torch.device("cpu"), checkpoint_dir=tmp_path / "checkpoints",
        log_path=tmp_path / "log.jsonl", fingerprint=fingerprint, example_lengths=LENGTHS,
    )
    return model, result


def small_cfg(**overrides):
    values = dict(max_steps=10, batch_size=8, learning_rate=0.05, warmup_ratio=0.2, log_every=2, checkpoint_every=3,
                  group_by_length=False)
    values.update(overrides)
    return TrainConfig(**values)


def test_logs_every_n_steps_with_terms_lr_and_throughput(tmp_path):
    _, result = run_training(tmp_path, small_cfg())
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10]
    for record in records:
        assert {"loss", "mse", "lr", "tokens_per_second", "epoch"} <= record.keys()
    assert records[-1]["lr"] == pytest.approx(0.0)  # linear decay ends at zero
    assert result.steps == 10 and result.resumed_from_step == 0
    assert not (tmp_path / "checkpoints").exists()  # a finished run cleans its checkpoints up


@pytest.mark.parametrize("group_by_length", [False, True])
def test_crash_then_rerun_resumes_and_matches_an_uninterrupted_run(tmp_path, group_by_length):
    reference, _ = run_training(tmp_path / "clean", small_cfg(group_by_length=group_by_length))

    with pytest.raises(RuntimeError, match="simulated crash"):
        run_training(tmp_path / "crashed", small_cfg(group_by_length=group_by_length), crash_at_micro_batch=8)
    checkpoints = sorted(p.name for p in (tmp_path / "crashed" / "checkpoints").iterdir())
    assert checkpoints == ["step-00000006"]  # keep_checkpoints=1: only the newest, no temporary folders

    resumed, result = run_training(tmp_path / "crashed", small_cfg(group_by_length=group_by_length))
    assert result.resumed_from_step == 6 and result.steps == 10
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    steps_logged = [json.loads(l)["step"] for l in (tmp_path / "crashed" / "log.jsonl").read_text().splitlines()]
    assert steps_logged == [2, 4, 6, 8, 10]  # lines past the checkpoint are not duplicated


def test_checkpoint_of_another_config_is_not_resumed(tmp_path):
    with pytest.raises(RuntimeError):
        run_training(tmp_path, small_cfg(), crash_at_micro_batch=8, fingerprint="old-config")
    _, result = run_training(tmp_path, small_cfg(), fingerprint="new-config")
    assert result.resumed_from_step == 0


def test_gradient_accumulation_matches_one_large_batch(tmp_path):
    # Epoch order depends only on (seed, epoch), so 2 x 4 micro-batches cover the same 8 examples as 1 x 8.
    cfg_large = small_cfg(max_steps=1, batch_size=8, warmup_ratio=0.0)
    cfg_accumulated = small_cfg(max_steps=1, batch_size=4, grad_accum_steps=2, warmup_ratio=0.0)
    assert epoch_batches(N_EXAMPLES, 8, 7, 0)[0] == sum(epoch_batches(N_EXAMPLES, 4, 7, 0)[:2], [])
    # Dropout would draw different masks for 1x8 and 2x4; compare without it.
    large, _ = run_training(tmp_path / "a", cfg_large, dropout=0.0)
    accumulated, _ = run_training(tmp_path / "b", cfg_accumulated, dropout=0.0)
    initial, _ = run_training(tmp_path / "c", small_cfg(max_steps=1, learning_rate=1e-12), dropout=0.0)
    for name, tensor in large.state_dict().items():
        assert torch.allclose(tensor, accumulated.state_dict()[name], atol=1e-6), name
        assert not torch.allclose(tensor, initial.state_dict()[name], atol=1e-4), name  # the step did move them


def test_step_count_from_epochs_and_accumulation():
    assert count_optimizer_steps(TrainConfig(epochs=2, batch_size=8, grad_accum_steps=1), 40) == (10, 10)
    assert count_optimizer_steps(TrainConfig(epochs=1, batch_size=8, grad_accum_steps=2), 40) == (3, 6)
    assert count_optimizer_steps(TrainConfig(max_steps=7, batch_size=8, grad_accum_steps=4), 40) == (7, 28)


def test_length_grouped_batches_cover_every_example_once_with_similar_lengths():
    generator = torch.Generator().manual_seed(3)
    lengths = torch.randint(10, 200, (2000,), generator=generator).tolist()
    grouped = epoch_batches(len(lengths), 16, seed=7, epoch=0, lengths=lengths)
    shuffled = epoch_batches(len(lengths), 16, seed=7, epoch=0)
    assert sorted(i for batch in grouped for i in batch) == list(range(len(lengths)))

    def padded_tokens(batches):  # what a batch padded to its longest example costs
        return sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)

    assert padded_tokens(grouped) < 0.7 * padded_tokens(shuffled)
    assert grouped == epoch_batches(len(lengths), 16, seed=7, epoch=0, lengths=lengths)  # depends on (seed, epoch) only
    assert grouped != epoch_batches(len(lengths), 16, seed=7, epoch=1, lengths=lengths)


def test_group_by_length_needs_the_stage_to_pass_lengths(tmp_path):
    model = TinyRegressor()
    with pytest.raises(ValueError, match="example_lengths"):
        train(module=model, compute_loss=lambda batch: {}, examples=[0, 1], collate=lambda indices: {}, cfg=TrainConfig(),
              seed=0, device=torch.device("cpu"), checkpoint_dir=tmp_path / "c", log_path=tmp_path / "l.jsonl",
              fingerprint="x")


def gradients_at_first_step(tmp_path, cfg) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as the first optimizer step sees it (after accumulation, before the update)."""
    seen = {}

    def record(optimizer, args, kwargs):
        if not seen:
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    seen[id(parameter)] = parameter.grad.detach().clone()

    handle = register_optimizer_step_pre_hook(record)
    try:
        model, _ = run_training(tmp_path, cfg, dropout=0.0)
    finally:
        handle.remove()
    return {name: seen[id(parameter)] for name, parameter in model.named_parameters()}


def test_accumulated_gradients_equal_the_gradient_of_one_large_batch(tmp_path):
    # The step must see the mean-loss gradient of the 8 examples, whether computed as 1 x 8 or 2 x 4 or 4 x 2
    # (each micro-batch loss divided by the accumulation count). Adam hides a wrong scale in the weights, so
    # this compares gradients. Clipping is off so the raw gradients are compared.
    large = gradients_at_first_step(tmp_path / "a", small_cfg(max_steps=1, batch_size=8, max_grad_norm=0.0))
    for batch_size, accumulation in ((4, 2), (2, 4)):
        cfg = small_cfg(max_steps=1, batch_size=batch_size, grad_accum_steps=accumulation, max_grad_norm=0.0)
        accumulated = gradients_at_first_step(tmp_path / f"b{accumulation}", cfg)
        for name, gradient in large.items():
            assert gradient.abs().sum() > 0, name
            assert torch.allclose(accumulated[name], gradient, rtol=1e-5, atol=1e-7), (name, accumulation)


def test_clipping_bounds_the_accumulated_gradient_norm(tmp_path):
    clipped = gradients_at_first_step(tmp_path, small_cfg(max_steps=1, batch_size=4, grad_accum_steps=2,
                                                          max_grad_norm=0.01))
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in clipped.values()]))
    assert norm.item() == pytest.approx(0.01, rel=1e-4)
