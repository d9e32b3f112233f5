"""Stage distill_squad: every objective end to end from the config, and bad configs caught before training."""

import json

import pytest
import torch
from transformers import BertConfig, DistilBertForMaskedLM

from pipeline.distillation import squad_objectives
from pipeline.plan.config import ConfigError
from pipeline.stages import distill_squad
from tests.stage_fixtures import build_tiny_artifacts, tiny_config


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return build_tiny_artifacts(tmp_path_factory.mktemp("tiny"))


def run_distill_squad(artifacts, tmp_path, teacher=True, **distill_squad_overrides):
    cfg = tiny_config(distill_squad=distill_squad_overrides)
    return distill_squad.run(
        cfg, artifacts["student"], artifacts["qa_teacher"] if teacher else None, artifacts["data"],
        tmp_path / "out", tmp_path / "work", ce_only=not teacher,
    )


def logged_terms(tmp_path) -> set[str]:
    """Every term logged by the run (a two-phase TinyBERT run logs different terms in each phase)."""
    lines = (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()
    return set().union(*(json.loads(line) for line in lines))


@pytest.mark.parametrize(
    "objectives, expected_terms",
    [
        (["distilbert"], {"task", "kd"}),
        (["distilbert", "pkd"], {"task", "kd", "pkd"}),  # PKD = CE + KD + patient loss
        (["tinybert"], {"task", "tb_attention", "tb_hidden", "tb_embedding", "tb_prediction"}),
        (["distilbert", "pkd", "tinybert"], {"task", "kd", "pkd", "tb_attention", "tb_hidden"}),
    ],
)
def test_each_objective_trains_end_to_end_and_reports_dev_scores(artifacts, tmp_path, objectives, expected_terms):
    metrics = run_distill_squad(artifacts, tmp_path, objectives=objectives)
    assert metrics["objectives"] == objectives
    assert 0.0 <= metrics["f1"] <= 100.0
    assert metrics["steps"] == 4  # TinyBERT's two steps share the budget: 2 + 2
    assert expected_terms <= logged_terms(tmp_path)
    assert metrics["teacher_f1"] == 2.0  # read from the teacher's metrics.json
    assert (tmp_path / "out" / "model.safetensors").is_file()
    # Logits suffice for distilbert alone, and for TinyBERT's prediction step unless PKD needs hidden states.
    assert metrics["teacher_logits_cached"] == ("pkd" not in objectives)


def test_teacher_logit_cache_is_reused_across_runs(artifacts, tmp_path):
    first = run_distill_squad(artifacts, tmp_path)
    cache_files = list((tmp_path / "work").glob("teacher_logits-*.safetensors"))
    assert len(cache_files) == 1
    second = run_distill_squad(artifacts, tmp_path)
    assert second["f1"] == first["f1"]  # same seed, same cached targets: same model


def test_ce_only_baseline_uses_no_teacher(artifacts, tmp_path):
    metrics = run_distill_squad(artifacts, tmp_path, teacher=False)
    assert metrics["objectives"] == [] and "teacher_f1" not in metrics
    assert logged_terms(tmp_path) >= {"task", "loss"} and "kd" not in logged_terms(tmp_path)
    # The output folder answers through transformers' QA pipeline (DistilBERT takes no token_type_ids).
    import transformers

    answerer = transformers.pipeline("question-answering", model=str(tmp_path / "out"), device="cpu")
    context = "The company was founded in Lisbon in 1901."
    answer = answerer(question="Where was the company founded?", context=context)
    assert context[answer["start"] : answer["end"]] == answer["answer"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"objectives": ["distilbert", "mystery"]}, r"distill_squad\.objectives\[1\]"),
        ({"distilbert": {"temperature": 0}}, r"distill_squad\.distilbert\.temperature"),
        ({"pkd": {"weight": -1.0}}, r"distill_squad\.pkd\.weight"),
        ({"alpha_task": -0.5}, r"distill_squad\.alpha_task"),
    ],
)
def test_bad_config_values_fail_at_load_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        tiny_config(distill_squad=overrides)


def test_pkd_without_its_soft_target_term_is_refused_naming_the_missing_objective():
    with pytest.raises(ConfigError, match=r"distill_squad\.objectives.*pkd.*add 'distilbert'"):
        tiny_config(distill_squad={"objectives": ["pkd"]})
    with pytest.raises(ConfigError, match="add 'distilbert'"):
        tiny_config(distill_squad={"objectives": ["pkd", "tinybert"]})
    assert tiny_config(distill_squad={"objectives": ["pkd", "distilbert"]}).distill_squad.objectives == ["pkd", "distilbert"]


def test_a_student_with_another_vocabulary_than_the_teacher_is_refused_naming_both(artifacts, tmp_path):
    from transformers import AutoTokenizer

    other = tmp_path / "other student"
    tokenizer = AutoTokenizer.from_pretrained(artifacts["student"])
    tokenizer.add_tokens(["zzqword"])  # one token more than the teacher reads
    tokenizer.save_pretrained(other)
    DistilBertForMaskedLM.from_pretrained(artifacts["student"]).save_pretrained(other)
    cfg = tiny_config()
    with pytest.raises(ConfigError, match=r"distill_squad: the student .*other student and the teacher .* have "
                                          r"different vocabularies \((\d+) and (?!\1)\d+ tokens.*student.pretrained"):
        distill_squad.run(cfg, other, artifacts["qa_teacher"], artifacts["data"], tmp_path / "out", tmp_path / "work")
    assert not (tmp_path / "out").exists()


def test_layer_mapping_outside_the_teacher_fails_before_training(artifacts, tmp_path):
    with pytest.raises(ConfigError, match=r"distill_squad\.tinybert\.layer_mapping"):
        run_distill_squad(artifacts, tmp_path, objectives=["tinybert"], tinybert={"layer_mapping": [5]})
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_width_mismatch_without_projection_fails_naming_the_key(artifacts):
    student_config = DistilBertForMaskedLM.config_class.from_pretrained(artifacts["student"])
    student_config.dim = student_config.dim * 2
    teacher_config = BertConfig.from_pretrained(artifacts["qa_teacher"])
    cfg = tiny_config(distill_squad={"objectives": ["tinybert"], "tinybert": {"projection": False}}).distill_squad
    with pytest.raises(ConfigError, match=r"distill_squad\.tinybert\.projection"):
        squad_objectives.distillation_plan(cfg, student_config, teacher_config)
    cfg_with_projection = tiny_config(distill_squad={"objectives": ["tinybert"]}).distill_squad
    student_config.n_heads = teacher_config.num_attention_heads
    plan = squad_objectives.distillation_plan(cfg_with_projection, student_config, teacher_config)
    assert plan["needs_projection"] is True


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_word_embeddings_keeps_only_the_word_embeddings_fixed(artifacts, tmp_path, freeze):
    from safetensors.torch import load_file

    cfg = tiny_config(squad={"freeze_word_embeddings": freeze})
    distill_squad.run(cfg, artifacts["student"], None, artifacts["data"], tmp_path / "out", tmp_path / "work",
                      ce_only=True)
    before, after = load_file(artifacts["student"] / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    words = "distilbert.embeddings.word_embeddings.weight"
    assert torch.equal(before[words], after[words]) == freeze
    positions = "distilbert.embeddings.position_embeddings.weight"
    assert not torch.equal(before[positions], after[positions])


# ---------------------------------------------------------------- which positions the KD term covers


def tiny_windows(artifacts, n_examples=8):
    from transformers import AutoTokenizer

    from pipeline.data import qa_windows
    from pipeline.data.squad_loading import load_squad

    tokenizer = AutoTokenizer.from_pretrained(artifacts["student"])
    examples, _ = load_squad(str(artifacts["data"] / "train.jsonl"))
    windows = qa_windows.train_window_tensors(examples.select(range(n_examples)), tokenizer, tiny_config().squad)
    return tokenizer, windows


def tiny_models(artifacts):
    from transformers import BertForQuestionAnswering, DistilBertForQuestionAnswering

    torch.manual_seed(0)
    student = DistilBertForQuestionAnswering.from_pretrained(artifacts["student"]).eval()
    teacher = distill_squad.freeze(BertForQuestionAnswering.from_pretrained(artifacts["qa_teacher"]))
    return student, teacher


def test_kd_positions_are_cls_and_the_context_tokens_only(artifacts):
    tokenizer, windows = tiny_windows(artifacts)
    keep = squad_objectives.kd_positions(windows, tokenizer.sep_token_id)
    for row, input_ids in enumerate(windows["input_ids"].tolist()):
        seps = [k for k, token in enumerate(input_ids) if token == tokenizer.sep_token_id]
        assert len(seps) == 2 and input_ids[0] == tokenizer.cls_token_id
        expected = [0] + list(range(seps[0] + 1, seps[1]))  # [CLS] and what lies between the two [SEP]s
        assert keep[row].nonzero().flatten().tolist() == expected


def test_kd_term_is_invariant_to_teacher_logits_outside_cls_and_context(artifacts):
    from pipeline.data import qa_windows

    tokenizer, windows = tiny_windows(artifacts)
    student, teacher = tiny_models(artifacts)
    cfg = tiny_config().distill_squad
    loss = squad_objectives.SquadDistillationLoss(student, teacher, cfg, {}, None, tokenizer.sep_token_id)
    generator = torch.Generator().manual_seed(0)
    windows["teacher_start_logits"] = torch.randn(windows["input_ids"].shape, generator=generator)
    windows["teacher_end_logits"] = torch.randn(windows["input_ids"].shape, generator=generator)
    batch = qa_windows.window_collate(windows)(list(range(len(windows["input_ids"]))))
    kd = loss(batch)["kd"]

    # Question tokens, both [SEP]s and padding, found from the tokens themselves (not from kd_positions).
    outside = torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
    for row, input_ids in enumerate(batch["input_ids"].tolist()):
        first_sep, last_sep = [k for k, token in enumerate(input_ids) if token == tokenizer.sep_token_id]
        outside[row, 1 : first_sep + 1] = True
        outside[row, last_sep:] = True
    assert (outside & (batch["attention_mask"] == 0)).any() and (outside & (batch["attention_mask"] == 1)).any()
    for name in ("teacher_start_logits", "teacher_end_logits"):
        changed = dict(batch)
        changed[name] = batch[name] + outside * torch.randn(batch[name].shape, generator=generator) * 50
        assert torch.allclose(loss(changed)["kd"], kd, rtol=1e-6, atol=0), name
    context = dict(batch)
    context["teacher_start_logits"] = batch["teacher_start_logits"].clone()
    context["teacher_start_logits"][:, 0] += 5.0  # [CLS] (the no-answer label) counts
    assert not torch.allclose(loss(context)["kd"], kd, rtol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_the_training_loss_is_the_weighted_sum_of_the_tested_terms_at_the_configured_temperature(artifacts,
                                                                                                temperature):
    from pipeline.data import qa_windows
    from pipeline.distillation.losses import qa_distillation_loss, qa_task_loss

    tokenizer, windows = tiny_windows(artifacts)
    student, teacher = tiny_models(artifacts)
    cfg = tiny_config(distill_squad={"objectives": ["distilbert"], "alpha_task": 0.3,
                                     "distilbert": {"weight": 0.7, "temperature": temperature}}).distill_squad
    loss = squad_objectives.SquadDistillationLoss(student, teacher, cfg, {}, None, tokenizer.sep_token_id)
    batch = qa_windows.window_collate(windows)(list(range(len(windows["input_ids"]))))
    terms = loss(batch)
    with torch.no_grad():
        student_out = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        teacher_out = teacher(**qa_windows.model_inputs(batch, teacher))
    kd = qa_distillation_loss(student_out.start_logits, student_out.end_logits, teacher_out.start_logits,
                              teacher_out.end_logits, squad_objectives.kd_positions(batch, tokenizer.sep_token_id),
                              temperature)
    task = qa_task_loss(student_out.start_logits, student_out.end_logits, batch["start_positions"],
                        batch["end_positions"])
    assert torch.allclose(terms["kd"], kd, rtol=1e-5) and torch.allclose(terms["task"], task, rtol=1e-5)
    assert torch.allclose(terms["loss"], 0.3 * task + 0.7 * kd, rtol=1e-5)


TERM_WEIGHTS = {"task": 0.3, "kd": 0.7, "pkd": 5.0, "tb_attention": 0.5, "tb_hidden": 2.0, "tb_embedding": 3.0,
                "tb_prediction": 0.25}


@pytest.mark.parametrize("objectives", [["tinybert"], ["distilbert", "pkd"]])
def test_the_training_loss_is_the_weighted_sum_of_each_tested_term(artifacts, objectives):
    from pipeline.data import qa_windows
    from pipeline.distillation import losses

    tokenizer, windows = tiny_windows(artifacts)
    student, teacher = tiny_models(artifacts)
    cfg = tiny_config(distill_squad={
        "objectives": objectives, "alpha_task": TERM_WEIGHTS["task"],
        "distilbert": {"weight": TERM_WEIGHTS["kd"], "temperature": 2.0}, "pkd": {"weight": TERM_WEIGHTS["pkd"]},
        "tinybert": {"attention_weight": TERM_WEIGHTS["tb_attention"], "hidden_weight": TERM_WEIGHTS["tb_hidden"],
                     "embedding_weight": TERM_WEIGHTS["tb_embedding"],
                     "prediction_weight": TERM_WEIGHTS["tb_prediction"], "temperature": 3.0},
    }).distill_squad
    plan = squad_objectives.distillation_plan(cfg, student.config, teacher.config)
    loss = squad_objectives.SquadDistillationLoss(student, teacher, cfg, plan, None, tokenizer.sep_token_id)
    batch = qa_windows.window_collate(windows)(list(range(len(windows["input_ids"]))))
    terms = loss(batch)

    # Each term again, straight from the tested functions of pipeline/distillation/losses.py.
    mask = batch["attention_mask"]
    with torch.no_grad(), losses.AttentionScoreRecorder(student) as student_scores:
        s = student(input_ids=batch["input_ids"], attention_mask=mask, output_hidden_states=True)
    with torch.no_grad(), losses.AttentionScoreRecorder(teacher) as teacher_scores:
        t = teacher(**qa_windows.model_inputs(batch, teacher), output_hidden_states=True)
    expected = {"task": losses.qa_task_loss(s.start_logits, s.end_logits, batch["start_positions"],
                                            batch["end_positions"])}
    if "distilbert" in objectives:
        keep = squad_objectives.kd_positions(batch, tokenizer.sep_token_id)
        expected["kd"] = losses.qa_distillation_loss(s.start_logits, s.end_logits, t.start_logits, t.end_logits,
                                                     keep, 2.0)
        layers = plan["pkd_teacher_layers"]
        expected["pkd"] = losses.pkd_patient_loss([s.hidden_states[i + 1][:, 0] for i in range(len(layers))],
                                                  [t.hidden_states[k + 1][:, 0] for k in layers])
    else:
        layers = plan["tinybert_teacher_layers"]
        expected["tb_attention"] = losses.tinybert_attention_loss(student_scores.scores,
                                                                  [teacher_scores.scores[k] for k in layers], mask)
        expected["tb_hidden"] = losses.tinybert_hidden_loss(list(s.hidden_states[1:]),
                                                            [t.hidden_states[k + 1] for k in layers], None, mask)
        expected["tb_embedding"] = losses.tinybert_embedding_loss(s.hidden_states[0], t.hidden_states[0], None, mask)
        expected["tb_prediction"] = losses.tinybert_prediction_loss(s.start_logits, s.end_logits, t.start_logits,
                                                                    t.end_logits, 3.0)
    assert set(terms) == {"loss", *expected}
    for name, value in expected.items():
        assert torch.allclose(terms[name], value, rtol=1e-5, atol=1e-7), name
    total = sum(TERM_WEIGHTS[name] * value for name, value in expected.items())
    assert torch.allclose(terms["loss"], total, rtol=1e-5), (terms["loss"], total)


def test_cached_teacher_logits_match_the_live_teacher_in_the_training_precision(artifacts):
    from pipeline.data import qa_windows

    tokenizer, windows = tiny_windows(artifacts)
    student, teacher = tiny_models(artifacts)
    batch = qa_windows.window_collate(windows)(list(range(len(windows["input_ids"]))))
    length, real = batch["input_ids"].shape[1], batch["attention_mask"].bool()

    fp32 = distill_squad.teacher_window_logits(teacher, windows, 3, "cpu", autocast_bf16=False)
    bf16 = distill_squad.teacher_window_logits(teacher, windows, 3, "cpu", autocast_bf16=True)
    with torch.no_grad():
        live_fp32 = teacher(**qa_windows.model_inputs(batch, teacher)).start_logits
        with torch.autocast("cpu", dtype=torch.bfloat16):  # what the training loop does on a bf16 device
            live_bf16 = teacher(**qa_windows.model_inputs(batch, teacher)).start_logits.float()
    assert fp32["teacher_start_logits"].dtype == bf16["teacher_start_logits"].dtype == torch.float32
    assert torch.allclose(fp32["teacher_start_logits"][:, :length][real], live_fp32[real], atol=1e-5)
    bf16_gap = (bf16["teacher_start_logits"][:, :length][real] - live_bf16[real]).abs().max()
    fp32_gap = (fp32["teacher_start_logits"][:, :length][real] - live_bf16[real]).abs().max()
    assert bf16_gap < 0.5 * fp32_gap, (bf16_gap, fp32_gap)  # closer to the live bf16 teacher than fp32 targets

    # Through the loss: the KD term from cached logits equals the one from the live teacher.
    cfg = tiny_config().distill_squad
    loss = squad_objectives.SquadDistillationLoss(student, teacher, cfg, {}, None, tokenizer.sep_token_id)
    cached = qa_windows.window_collate(windows | fp32)(list(range(len(windows["input_ids"]))))
    assert torch.allclose(loss(cached)["kd"], loss(batch)["kd"], rtol=1e-5)


def test_a_cache_that_does_not_match_the_windows_fails_naming_the_file(artifacts, tmp_path):
    from safetensors.torch import save_file

    _, windows = tiny_windows(artifacts)
    student, teacher = tiny_models(artifacts)
    cache = tmp_path / "teacher_logits.safetensors"
    logits, seconds = distill_squad.cached_teacher_logits(teacher, windows, 4, "cpu", cache)
    assert seconds > 0 and logits["teacher_start_logits"].shape == windows["input_ids"].shape
    again, seconds_again = distill_squad.cached_teacher_logits(None, windows, 4, "cpu", cache)  # no teacher needed
    assert seconds_again == seconds and torch.equal(again["teacher_end_logits"], logits["teacher_end_logits"])

    fewer = {name: tensor[:-1] for name, tensor in windows.items()}
    with pytest.raises(ValueError, match=rf"{cache}: teacher_\w+_logits has shape \[{len(windows['input_ids'])}, .*but there are {len(windows['input_ids']) - 1} training windows"):
        distill_squad.cached_teacher_logits(teacher, fewer, 4, "cpu", cache)
    save_file({"teacher_start_logits": logits["teacher_start_logits"]}, str(cache))
    with pytest.raises(ValueError, match=rf"{cache}.*teacher_end_logits"):
        distill_squad.cached_teacher_logits(teacher, windows, 4, "cpu", cache)
    cache.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=rf"{cache}: unreadable"):
        distill_squad.cached_teacher_logits(teacher, windows, 4, "cpu", cache)


def test_cache_time_is_part_of_the_reported_training_time(artifacts, tmp_path):
    first = run_distill_squad(artifacts, tmp_path)
    assert first["teacher_logits_cached"] and first["teacher_cache_seconds"] > 0
    log_tokens_per_second = [json.loads(line)["tokens_per_second"]
                             for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    assert first["train_seconds"] > first["teacher_cache_seconds"]
    assert first["tokens_per_second"] < max(log_tokens_per_second)  # the loop's own rate leaves the cache out
    second = run_distill_squad(artifacts, tmp_path)  # the cache is reused and still counted
    assert second["teacher_cache_seconds"] == first["teacher_cache_seconds"]


def test_the_teacher_stays_frozen_and_out_of_the_optimizer(artifacts, tmp_path, monkeypatch):
    seen = {"teacher_states": [], "trained": []}
    real_call, real_train = squad_objectives.SquadDistillationLoss.__call__, distill_squad.train

    def spy_call(self, batch):
        teacher = self.teacher
        seen["teacher_states"].append((teacher.training, [p for p in teacher.parameters() if p.requires_grad]))
        seen["teacher"] = teacher
        return real_call(self, batch)

    def spy_train(**kwargs):
        seen["trained"] = [id(p) for p in kwargs["module"].parameters()]
        return real_train(**kwargs)

    monkeypatch.setattr(squad_objectives.SquadDistillationLoss, "__call__", spy_call)
    monkeypatch.setattr(distill_squad, "train", spy_train)
    # distilbert + pkd runs the teacher live every batch (no logit cache).
    run_distill_squad(artifacts, tmp_path, objectives=["distilbert", "pkd"])

    assert len(seen["teacher_states"]) == 4
    for training, trainable in seen["teacher_states"]:
        assert training is False and trainable == []
    teacher_parameters = {id(p) for p in seen["teacher"].parameters()}
    assert seen["trained"] and not teacher_parameters & set(seen["trained"])


# ---------------------------------------------------------------- teacher-labelled augmented windows


def test_augmented_windows_join_training_with_teacher_targets_only(artifacts, tmp_path):
    cfg = tiny_config(distill_squad={"augmentation": {"copies": 2, "replace_probability": 0.5, "top_k": 3}})
    metrics = distill_squad.run(cfg, artifacts["student"], artifacts["qa_teacher"], artifacts["data"],
                                tmp_path / "out", tmp_path / "work", mlm_teacher_dir=artifacts["mlm_teacher"])
    assert metrics["n_augmented_windows"] == 2 * metrics["n_train_windows"] > 0
    cache = next((tmp_path / "work").glob("teacher_logits-*.safetensors"))
    from safetensors.torch import load_file
    assert load_file(cache)["teacher_start_logits"].shape[0] == 3 * metrics["n_train_windows"]
    # The CE-only baseline never sees augmented windows, whatever the config says.
    baseline = distill_squad.run(cfg, artifacts["student"], None, artifacts["data"], tmp_path / "ce", tmp_path / "ce_work",
                                 ce_only=True)
    assert baseline["n_augmented_windows"] == 0


def test_augmentation_without_a_masked_lm_teacher_fails_before_training(artifacts, tmp_path):
    cfg = tiny_config(distill_squad={"augmentation": {"copies": 1}})
    with pytest.raises(ConfigError, match=r"augmentation\.copies > 0 needs the masked-LM teacher"):
        distill_squad.run(cfg, artifacts["student"], artifacts["qa_teacher"], artifacts["data"], tmp_path / "out",
                          tmp_path / "work")
    assert not (tmp_path / "out").exists()


def test_task_loss_skips_windows_without_a_gold_span():
    from types import SimpleNamespace

    from pipeline.distillation.losses import qa_task_loss

    torch.manual_seed(0)
    out = SimpleNamespace(start_logits=torch.randn(3, 6, requires_grad=True), end_logits=torch.randn(3, 6))
    batch = {"start_positions": torch.tensor([2, -1, 4]), "end_positions": torch.tensor([3, -1, 5]),
             "has_gold": torch.tensor([True, False, True])}
    loss = squad_objectives.SquadDistillationLoss.task_loss(out, batch)
    keep = torch.tensor([0, 2])
    expected = qa_task_loss(out.start_logits[keep], out.end_logits[keep], torch.tensor([2, 4]), torch.tensor([3, 5]))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    none = squad_objectives.SquadDistillationLoss.task_loss(out, batch | {"has_gold": torch.zeros(3, dtype=torch.bool)})
    assert none.item() == 0.0 and none.requires_grad  # a batch of augmented windows only: no NaN, no task signal


# ---------------------------------------------------------------- TinyBERT's two steps


def test_tinybert_trains_intermediate_layers_first_then_the_prediction_layer():
    cfg = tiny_config(distill_squad={"objectives": ["tinybert", "distilbert"], "train": {"epochs": 3.0, "max_steps": None},
                                     "tinybert": {"intermediate_share": 0.25}}).distill_squad
    (first_name, first), (second_name, second) = squad_objectives.training_phases(cfg)
    assert (first_name, second_name) == ("intermediate", "prediction")
    assert first.train.epochs == 0.75 and second.train.epochs == 2.25  # the configured budget, split
    assert first.train.max_steps is None and second.train.max_steps is None
    by_steps = tiny_config(distill_squad={"objectives": ["tinybert"], "train": {"max_steps": 10},
                                          "tinybert": {"intermediate_share": 0.3}}).distill_squad
    assert [phase.train.max_steps for _, phase in squad_objectives.training_phases(by_steps)] == [3, 7]
    assert first.objectives == ["tinybert"] and first.alpha_task == 0 and first.tinybert.prediction_weight == 0
    assert min(first.tinybert.attention_weight, first.tinybert.hidden_weight, first.tinybert.embedding_weight) > 0
    assert second.objectives == ["tinybert", "distilbert"] and second.alpha_task == cfg.alpha_task
    assert second.tinybert.attention_weight == second.tinybert.hidden_weight == second.tinybert.embedding_weight == 0
    assert second.tinybert.prediction_weight == cfg.tinybert.prediction_weight
    assert not squad_objectives.logits_suffice(first) and squad_objectives.logits_suffice(second)
    # share 0: every term in one run; other objectives: one run.
    together = tiny_config(distill_squad={"objectives": ["tinybert"], "tinybert": {"intermediate_share": 0}})
    assert [name for name, _ in squad_objectives.training_phases(together.distill_squad)] == ["main"]
    distilbert = tiny_config(distill_squad={"objectives": ["distilbert"]})
    assert [name for name, _ in squad_objectives.training_phases(distilbert.distill_squad)] == ["main"]


def test_a_two_phase_run_logs_both_phases_and_reuses_a_finished_first_phase(artifacts, tmp_path):
    metrics = run_distill_squad(artifacts, tmp_path, objectives=["tinybert"], train={"epochs": 2.0})
    phases = metrics["phases"]
    assert [phase["phase"] for phase in phases] == ["intermediate", "prediction"]
    assert metrics["steps"] == sum(phase["steps"] for phase in phases) and all(p["steps"] > 0 for p in phases)
    assert metrics["teacher_logits_cached"]  # the prediction phase reads logits only
    records = [json.loads(line) for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == sorted(r["step"] for r in records) and records[-1]["step"] == metrics["steps"]
    intermediate = [r for r in records if r["phase"] == "intermediate"]
    prediction = [r for r in records if r["phase"] == "prediction"]
    assert intermediate and prediction
    assert "tb_hidden" in intermediate[-1] and "tb_prediction" not in intermediate[-1]
    assert "tb_prediction" in prediction[-1] and "tb_hidden" not in prediction[-1]
    # A rerun (as after a crash in the second phase) loads the finished first phase instead of training it again.
    finished = list((tmp_path / "work").glob("intermediate-*.safetensors"))
    assert len(finished) == 1
    again = run_distill_squad(artifacts, tmp_path, objectives=["tinybert"], train={"epochs": 2.0})
    assert again["phases"][0] == phases[0] and again["f1"] == metrics["f1"]
    assert metrics["resumed_from_step"] == 0 and again["resumed_from_step"] == phases[0]["steps"]
