"""The shared training loop: logging, accumulation, and bit-for-bit resume after a crash."""

import json

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from pipeline.plan.config import TrainConfig
from pipeline.training.batching import count_optimizer_steps, epoch_batches
from pipeline.training.loop import train

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

    def collate(indices, generator=None):
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
    # 40 examples in batches of 8: 5 micro-batches per epoch
    assert count_optimizer_steps(TrainConfig(epochs=2, batch_size=8, grad_accum_steps=1), 5) == (10, 10)
    assert count_optimizer_steps(TrainConfig(epochs=1, batch_size=8, grad_accum_steps=2), 5) == (3, 6)
    assert count_optimizer_steps(TrainConfig(max_steps=7, batch_size=8, grad_accum_steps=4), 5) == (7, 28)


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
        train(module=model, compute_loss=lambda batch: {}, examples=[0, 1], collate=lambda indices, generator=None: {}, cfg=TrainConfig(),
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


# --------------------------------------------------------------------------------------------------------------
# The loop's parts, one by one (fast; each pins a behaviour a resumed or distributed run relies on)
# --------------------------------------------------------------------------------------------------------------


def test_metrics_round_and_report_throughput_per_process_too():
    from pipeline.training.loop import TrainResult

    result = TrainResult(steps=10, micro_batches=20, train_seconds=12.34567, tokens_per_second=1001.26,
                         final_terms={"loss": 0.1234567, "kd": 2.0}, peak_memory_mib=512.36, resumed_from_step=4,
                         device="cpu", processes=2, effective_batch_size=32, mixed_precision="bf16",
                         first_step_seconds=3.14159, parameter_digests=("0123456789abcdef", "0123456789abcdef"))
    assert result.as_metrics() == {
        "steps": 10, "train_seconds": 12.346, "tokens_per_second": 1001.3, "tokens_per_second_per_process": 500.6,
        "processes": 2, "effective_batch_size": 32, "mixed_precision": "bf16",
        "final_loss_terms": {"loss": 0.123457, "kd": 2.0}, "peak_memory_mib": 512.4, "resumed_from_step": 4,
        "device": "cpu", "first_step_seconds": 3.142,
        "parameter_digests_by_rank": ["0123456789abcdef", "0123456789abcdef"],
    }


def test_the_parameter_digest_changes_with_the_least_change_of_one_weight_and_ends_the_run(tmp_path):
    from pipeline.training.processes import parameter_digest

    model, result = run_training(tmp_path, small_cfg(max_steps=2))
    assert result.parameter_digests == (parameter_digest(model),)  # one process: its own digest
    twin = TinyRegressor()
    twin.load_state_dict(model.state_dict())
    assert parameter_digest(twin) == parameter_digest(model)
    with torch.no_grad():
        weight = twin.layers[2].weight
        weight[0, 3] = torch.nextafter(weight[0, 3], torch.tensor(float("inf")))  # one bit of one weight
    assert parameter_digest(twin) != parameter_digest(model)


def test_adamw_decays_matrices_only_and_takes_the_configured_settings():
    from pipeline.training.loop import build_optimizer

    module = torch.nn.ModuleDict({"linear": torch.nn.Linear(4, 3), "norm": torch.nn.LayerNorm(3),
                                  "frozen": torch.nn.Linear(2, 2)})
    module["frozen"].requires_grad_(False)
    cfg = TrainConfig(learning_rate=0.02, weight_decay=0.05, adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-7)
    optimizer = build_optimizer(module, cfg, torch.device("cpu"))

    decay, no_decay = optimizer.param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([3, 4])]  # the weight matrix only
    assert sorted(tuple(p.shape) for p in no_decay["params"]) == [(3,), (3,), (3,)]  # bias, LayerNorm weight/bias
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.05, 0.0)
    for group in optimizer.param_groups:
        assert (group["lr"], group["betas"], group["eps"]) == (0.02, (0.8, 0.95), 1e-7)
        assert group["fused"] is False  # fused kernels are for CUDA tensors
    assert isinstance(optimizer, torch.optim.AdamW)


def test_a_global_batch_is_split_by_rank_and_a_short_one_padded_with_its_first_examples():
    from pipeline.training.batching import shard

    assert shard([5, 6, 7], 0, 1) == [5, 6, 7]
    assert shard([1, 2, 3, 4, 5], 0, 2) == [1, 3, 5] and shard([1, 2, 3, 4, 5], 1, 2) == [2, 4, 1]
    assert [shard([1, 2, 3, 4, 5, 6, 7], rank, 3) for rank in range(3)] == [[1, 4, 7], [2, 5, 1], [3, 6, 2]]
    assert shard([9], 1, 3) == [9]


def test_the_data_order_is_a_fixed_function_of_seed_and_epoch():
    n, seed = 12, 3
    expected = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + 2)).tolist()
    assert sum(epoch_batches(n, 5, seed, epoch=2), []) == expected  # changing this changes every trained model
    assert [len(batch) for batch in epoch_batches(n, 5, seed, epoch=2)] == [5, 5, 2]
    assert epoch_batches(n, 5, seed, 1) != epoch_batches(n, 5, seed, 2)
    assert epoch_batches(n, 4, seed, 0, shuffle=False) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(ValueError, match="3 example lengths for 12 examples"):
        epoch_batches(n, 4, seed, 0, lengths=[1, 2, 3])


def test_step_counts_cover_every_process_and_never_fall_to_zero():
    from pipeline.training.batching import examples_per_batch_plan, rank_batches
    from pipeline.training.processes import ProcessGroup

    # 20 examples, 4 per rank and micro-batch, 2 ranks: 3 micro-batches per rank and epoch (the last padded)
    plan = examples_per_batch_plan(20, 4, seed=1, world_size=2)
    per_rank = [rank_batches(plan, 0, ProcessGroup(rank=rank, world_size=2)) for rank in (0, 1)]
    assert [len(batches) for batches in per_rank] == [3, 3]
    assert sorted(sum((list(b) for batches in per_rank for b in batches), []))[:20] == list(range(20))
    assert count_optimizer_steps(TrainConfig(epochs=1, batch_size=4), len(per_rank[0])) == (3, 3)
    assert count_optimizer_steps(TrainConfig(epochs=0.01, batch_size=8), 2) == (1, 1)
    assert count_optimizer_steps(TrainConfig(max_steps=5, grad_accum_steps=3), 1000) == (5, 15)


def test_the_micro_batch_stream_yields_exactly_the_remaining_batches_of_this_rank():
    from pipeline.training.batching import micro_batch_stream
    from pipeline.training.processes import ProcessGroup

    examples = list(range(10))

    def stream(start, total, lengths=None, group=ProcessGroup()):
        return list(micro_batch_stream(examples, lambda items, generator: items, 4, 5, start, total, lengths=lengths, group=group))

    full = stream(0, 7)
    assert len(full) == 7 and full[:3] == epoch_batches(10, 4, 5, 0)  # 3 batches per epoch, then epoch 1
    assert full[3:6] == epoch_batches(10, 4, 5, 1)
    assert stream(4, 7) == full[4:]
    lengths = [(i * 7) % 5 for i in examples]
    assert stream(0, 3, lengths=lengths) == epoch_batches(10, 4, 5, 0, lengths=lengths)
    ranks = [stream(0, 2, group=ProcessGroup(rank=rank, world_size=2)) for rank in (0, 1)]
    globals_ = epoch_batches(10, 8, 5, 0)
    assert ranks[1][0] == globals_[0][1::2] and ranks[0][1] == globals_[1][0::2] and ranks[1][1] == globals_[1][1::2]


def test_resuming_drops_the_log_lines_written_after_the_checkpoint(tmp_path):
    from pipeline.training.checkpoints import truncate_log_after

    truncate_log_after(tmp_path / "missing.jsonl", 3)
    assert not (tmp_path / "missing.jsonl").exists()
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 2, "loss": 1}\n\n{"note": "no step"}\n{"step": 3}\n{"step": 4}\n')
    truncate_log_after(log, 3)
    assert log.read_text() == '{"step": 2, "loss": 1}\n{"note": "no step"}\n{"step": 3}\n'


def _save(tmp_path, step, fingerprint="run", keep=5, checkpoint_dir=None):
    from pipeline.training.checkpoints import save_checkpoint

    module = TinyRegressor()
    optimizer = torch.optim.AdamW(module.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return save_checkpoint(checkpoint_dir or tmp_path / "ckpt", step, module, optimizer, scheduler, fingerprint, keep)


def test_checkpoints_are_listed_in_step_order_and_only_the_newest_kept(tmp_path):
    from pipeline.training.checkpoints import _checkpoint_dirs

    nested = tmp_path / "a" / "b" / "ckpt"
    for step in (3, 6, 9):
        _save(tmp_path, step, keep=2, checkpoint_dir=nested)
    assert [p.name for p in _checkpoint_dirs(nested)] == ["step-00000006", "step-00000009"]
    state = json.loads((nested / "step-00000009" / "trainer_state.json").read_text())
    assert state == {"step": 9, "fingerprint": "run", "world_size": 1}
    assert not (nested / "step-00000009" / "scaler.pt").exists()  # no loss scaling without fp16
    (nested / "step-10").mkdir()  # a hand-named folder: ordered by its number, not its name
    (nested / "step-00000099").write_text("a file, not a checkpoint")
    (nested / "step-x").mkdir()
    assert [p.name for p in _checkpoint_dirs(nested)] == ["step-00000006", "step-00000009", "step-10"]
    assert _checkpoint_dirs(tmp_path / "nowhere") == []


def test_the_newest_usable_checkpoint_is_chosen_and_unusable_newer_ones_removed(tmp_path, caplog):
    from pipeline.outputs.manifests import ManifestError
    from pipeline.training.checkpoints import latest_checkpoint

    checkpoints = tmp_path / "ckpt"
    _save(tmp_path, 3)
    _save(tmp_path, 6)
    _save(tmp_path, 9, fingerprint="another-config")
    (checkpoints / "step-00000012").mkdir()  # killed while writing: no trainer_state.json
    with caplog.at_level("WARNING"):
        assert latest_checkpoint(checkpoints, "run") == checkpoints / "step-00000006"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-00000003", "step-00000006"]
    assert "step-00000012: it is incomplete" in caplog.text and "step-00000009: it belongs to a run" in caplog.text

    assert latest_checkpoint(checkpoints, "run", world_size=2) is None  # saved by one process
    assert list(checkpoints.iterdir()) == []

    _save(tmp_path, 3)
    (checkpoints / "step-00000003" / "optimizer.pt").write_bytes(b"damaged")
    with pytest.raises(ManifestError, match=r"optimizer\.pt.*delete .*step-00000003 to resume"):
        latest_checkpoint(checkpoints, "run")


def test_cpu_runs_pick_the_cpu_without_autocast(monkeypatch):
    from pipeline.training.run_settings import maybe_compile, mixed_precision, peak_memory_mib, resolve_device, use_bf16

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    cpu = torch.device("cpu")
    assert resolve_device(TrainConfig(device="cpu")) == cpu
    if not torch.cuda.is_available():
        assert resolve_device(TrainConfig(device="auto")) == cpu
        with pytest.raises(RuntimeError, match="train.device is 'cuda' but no CUDA device is available"):
            resolve_device(TrainConfig(device="cuda"))
    assert mixed_precision(TrainConfig(bf16=True), cpu) == "no" and not use_bf16(TrainConfig(bf16=True), cpu)
    module = torch.nn.Linear(2, 2)
    assert maybe_compile(module, TrainConfig(torch_compile=True), cpu) is module
    assert peak_memory_mib(cpu) > 10  # this process's peak resident set, in MiB


def test_the_launcher_environment_and_the_run_settings_are_applied(monkeypatch):
    import random

    from pipeline.training.processes import ProcessGroup, process_group_from_env
    from pipeline.training.run_settings import prepare_run

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert process_group_from_env() == ProcessGroup(0, 0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    group = process_group_from_env()
    assert group == ProcessGroup(3, 1, 4) and group.distributed and not group.is_main
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name)

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # whatever the session runs with (tests/conftest.py: 1), cpu_threads must change it
        assert prepare_run(TrainConfig(device="cpu", cpu_threads=1), seed=11) == torch.device("cpu")
        assert torch.get_num_threads() == 1
        draws = (random.random(), torch.rand(1).item())
        prepare_run(TrainConfig(device="cpu"), seed=11)
        assert (random.random(), torch.rand(1).item()) == draws  # both generators seeded
        assert torch.get_num_threads() == 1  # null cpu_threads leaves the rule's setting alone
    finally:
        torch.set_num_threads(threads)


def test_token_weights_come_from_the_plan_and_make_a_per_token_mean_over_every_rank(tmp_path):
    from pipeline.training.batching import planned_token_weights
    from pipeline.training.processes import ProcessGroup, all_ranks_sum, all_ranks_sum_tensors

    tokens = [10, 30, 60, 5, 15, 20, 7, 3]  # example i has tokens[i] loss tokens
    # Two ranks, batch b for rank b % 2: rank 0 takes [0], [2], [4, 5]; rank 1 takes [1], [3], [6, 7].
    plan = lambda epoch: [[0], [1], [2], [3], [4, 5], [6, 7]]  # noqa: E731
    one_step = dict(start_step=0, total_steps=1, grad_accum_steps=3)
    weights = [next(planned_token_weights(plan, tokens, group=ProcessGroup(rank, 0, 2), **one_step)) for rank in (0, 1)]
    assert [[count for count, _ in rank] for rank in weights] == [[10, 60, 35], [30, 5, 10]]
    # DDP averages gradients over the ranks: sum(weight x mean) / world_size is the step's per-token mean.
    token_losses = {example: torch.full((count,), float(example)) for example, count in enumerate(tokens)}
    means = [[torch.cat([token_losses[e] for e in batch]).mean() for batch in plan(0)[rank::2]] for rank in (0, 1)]
    averaged = sum(weight * mean for rank in (0, 1) for (_, weight), mean in zip(weights[rank], means[rank])) / 2
    assert torch.isclose(averaged, torch.cat(list(token_losses.values())).mean())
    # One process: shares of its own step; a resumed run gets the same weights for the steps that remain.
    single = list(planned_token_weights(plan, tokens, start_step=0, total_steps=4, grad_accum_steps=3))
    assert [weight for _, weight in single[0]] == [10 / 100, 30 / 100, 60 / 100]
    assert list(planned_token_weights(plan, tokens, start_step=2, total_steps=4, grad_accum_steps=3)) == single[2:]

    cpu = torch.device("cpu")
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        two = ProcessGroup(world_size=2)  # one real process standing in for two: sums over the ranks
        assert all_ranks_sum([1.5, 2.0], two, cpu) == [1.5, 2.0]
        assert all_ranks_sum_tensors([torch.tensor(0.5), torch.tensor(2.0)], [3, 4], two, cpu) == [0.5, 2.0, 3.0, 4.0]
        assert all_ranks_sum([7], ProcessGroup(), cpu) == [7]
    finally:
        torch.distributed.destroy_process_group()


def test_micro_batches_of_unequal_tokens_give_the_gradient_of_the_steps_per_token_mean(tmp_path):
    # Examples are "sequences" of 1 to 9 tokens; each micro-batch's loss is the mean over its own tokens. The
    # optimizer step must see the gradient of the mean over every token of the step, as one big batch gives it.
    lengths = [1, 9, 4, 2, 7, 3]
    generator = torch.Generator().manual_seed(0)
    features = [torch.randn(n, 4, generator=generator) for n in lengths]
    targets = [torch.randn(n, generator=generator) for n in lengths]
    plan = lambda epoch: [[0, 1], [2], [3, 4, 5]]  # noqa: E731  # 10, 4 and 12 tokens
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    def collate(indices, generator=None):
        return {"x": torch.cat([features[i] for i in indices]), "y": torch.cat([targets[i] for i in indices]),
                "n_tokens": sum(lengths[i] for i in indices), "loss_tokens": sum(lengths[i] for i in indices)}

    def compute_loss(batch):
        loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"])
        return {"loss": loss}

    seen = {}

    def record(optimizer, args, kwargs):
        seen.update({id(p): p.grad.detach().clone() for group in optimizer.param_groups for p in group["params"]})

    handle = register_optimizer_step_pre_hook(record)
    try:
        train(module=model, compute_loss=compute_loss, examples=list(range(len(lengths))), collate=collate,
              cfg=small_cfg(max_steps=1, grad_accum_steps=3, max_grad_norm=0.0), seed=0, device=torch.device("cpu"),
              checkpoint_dir=tmp_path / "ckpt", log_path=tmp_path / "log.jsonl", fingerprint="f", batch_plan=plan,
              example_tokens=lengths)
    finally:
        handle.remove()

    def gradient(loss_of):
        reference = torch.nn.Linear(4, 1)
        reference.load_state_dict(initial)
        loss_of(reference).backward()
        return {name: parameter.grad for name, parameter in reference.named_parameters()}

    def mean_loss(reference, indices):
        batch = collate(indices)
        return torch.nn.functional.mse_loss(reference(batch["x"]).squeeze(-1), batch["y"])

    per_token = gradient(lambda reference: mean_loss(reference, range(len(lengths))))
    per_micro_batch = gradient(lambda reference: sum(mean_loss(reference, batch) for batch in plan(0)) / 3)
    for name, expected in per_token.items():
        assert torch.allclose(seen[id(getattr(model, name))], expected, rtol=1e-5, atol=1e-7), name
        assert not torch.allclose(per_micro_batch[name], expected, rtol=1e-3), name  # the weighting matters here


def test_a_collate_that_counts_loss_tokens_needs_the_plans_example_tokens(tmp_path):
    model = TinyRegressor()
    collate = lambda indices, generator=None: {"x": torch.zeros(len(indices), 4), "loss_tokens": len(indices)}  # noqa
    common = dict(module=model, compute_loss=lambda batch: {"loss": model(batch["x"]).sum()},
                  examples=list(range(8)), collate=collate, cfg=small_cfg(max_steps=1), seed=0,
                  device=torch.device("cpu"), checkpoint_dir=tmp_path / "c", log_path=tmp_path / "l.jsonl",
                  fingerprint="x", description="demo")
    with pytest.raises(ValueError, match="demo: the collate reports loss_tokens but train\\(\\) got no example_tokens"):
        train(**common)
    with pytest.raises(ValueError, match="demo: a micro-batch has 8 loss tokens but the plan counts 16"):
        train(**common, example_tokens=[2] * 8)


def test_logged_figures_are_the_interval_means_and_the_run_totals(tmp_path, caplog):
    weight = torch.nn.Parameter(torch.zeros(2))
    module = torch.nn.Module()
    module.weight = weight
    calls = {"n": 0}

    def compute_loss(batch):
        calls["n"] += 1  # micro-batch k reports loss k and aux 2k
        return {"loss": (weight * 0).sum() + calls["n"], "aux": torch.tensor(2.0 * calls["n"])}

    def collate(indices, generator=None):  # example i has i % 3 + 1 real tokens out of 4
        mask = torch.tensor([[1] * (i % 3 + 1) + [0] * (3 - i % 3) for i in indices])
        return {"attention_mask": mask}

    cfg = TrainConfig(max_steps=3, batch_size=4, grad_accum_steps=2, learning_rate=0.1, warmup_ratio=0.5,
                      log_every=2, checkpoint_every=100, group_by_length=False)
    log_path = tmp_path / "logs" / "demo" / "log.jsonl"  # folders made as needed
    with caplog.at_level("INFO"):
        result = train(module=module, compute_loss=compute_loss, examples=list(range(12)), collate=collate, cfg=cfg,
                       seed=0, device=torch.device("cpu"), checkpoint_dir=tmp_path / "ckpt",
                       log_path=log_path, fingerprint="f", description="demo")
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [(r["step"], r["epoch"], r["loss"], r["aux"], r["effective_batch_size"]) for r in records] == [
        (2, 1.3333, 2.5, 5.0, 8),  # micro-batches 1-4; 2 steps x 2 x 4 examples of 12
        (3, 2.0, 5.5, 11.0, 8),  # micro-batches 5-6
    ]
    # warm-up int(0.5 x 3) = 1 step, then linear decay to 0 at step 3
    assert records[0]["lr"] == pytest.approx(0.05) and records[1]["lr"] == 0.0
    assert all(record["tokens_per_second"] > 0 for record in records)
    assert result.final_terms == {"aux": 11.0, "loss": 5.5}
    assert (result.steps, result.micro_batches, result.effective_batch_size) == (3, 6, 8)
    assert (result.device, result.mixed_precision, result.processes) == ("cpu", "no", 1)
    assert 0 < result.train_seconds < 60 and result.peak_memory_mib > 10
    tokens = 2 * sum(i % 3 + 1 for i in range(12))  # two epochs' worth of micro-batches, every example twice
    assert result.tokens_per_second * result.train_seconds == pytest.approx(tokens)
    assert "demo: 1 process(es) x 2 micro-batches per step, 3 steps; precision no on cpu; 0 loader worker(s)" in caplog.text
    assert "demo step=2 epoch=1.3333" in caplog.text


class NotATensor:
    """A pickled object of a class torch.load(weights_only=True) does not allow: what a tampered file could hold."""


def _load_into_fresh(path):
    from pipeline.training.checkpoints import load_checkpoint

    module = TinyRegressor()
    optimizer = torch.optim.AdamW(module.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return load_checkpoint(path, module, optimizer, scheduler, torch.device("cpu"))


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng-rank0.pt"])
def test_checkpoint_files_are_loaded_as_weights_only(tmp_path, name):
    import pickle

    path = _save(tmp_path, 3)
    assert _load_into_fresh(path) == 3
    torch.save({"state": NotATensor()}, path / name)
    with pytest.raises(pickle.UnpicklingError):
        _load_into_fresh(path)


def test_a_checkpoint_of_another_model_is_refused_naming_it(tmp_path):
    from safetensors.torch import save_file

    path = _save(tmp_path, 3)
    tensors = {name: tensor.detach().clone() for name, tensor in TinyRegressor().state_dict().items()}
    save_file(tensors | {"extra.weight": torch.zeros(2)}, str(path / "model.safetensors"))
    with pytest.raises(RuntimeError, match="extra.weight"):  # safetensors' strict load refuses it
        _load_into_fresh(path)


def test_a_checkpoint_without_its_manifest_is_discarded(tmp_path):
    from pipeline.training.checkpoints import latest_checkpoint

    kept = _save(tmp_path, 3)
    newer = _save(tmp_path, 6)
    (newer / "manifest.json").unlink()
    assert latest_checkpoint(tmp_path / "ckpt", "run") == kept and not newer.exists()


def test_no_examples_is_an_error_and_length_grouping_reaches_the_batches(tmp_path):
    model = TinyRegressor()
    seen = []

    def collate(indices, generator=None):
        seen.append(list(indices))
        return {"input_ids": torch.ones(len(indices), 2, dtype=torch.long), "x": torch.zeros(len(indices), 4)}

    def compute_loss(batch):
        return {"loss": model(batch["x"]).sum()}

    common = dict(module=model, compute_loss=compute_loss, collate=collate, seed=3, device=torch.device("cpu"),
                  checkpoint_dir=tmp_path / "ckpt", log_path=tmp_path / "log.jsonl", fingerprint="f",
                  description="demo")
    with pytest.raises(ValueError, match="demo: no training examples"):
        train(examples=[], cfg=small_cfg(), **common)
    result = train(examples=[0], cfg=small_cfg(max_steps=1, batch_size=1), **common)
    assert result.steps == 1
    seen.clear()
    train(examples=list(range(N_EXAMPLES)), cfg=small_cfg(max_steps=5, group_by_length=True),
          example_lengths=LENGTHS, **common)
    assert seen == epoch_batches(N_EXAMPLES, 8, 3, 0, lengths=LENGTHS)
