"""Target deploy (pipeline/plan/deploy.py, stage deploy_model, the deploy DAG): an existing QA model exported, gated,
bundled and benchmarked as it is, with no training; models the exporters cannot take are refused with the reason."""

import json
import re
import subprocess

import pytest
from huggingface_hub import ModelCard
from transformers import BertForMaskedLM, BertForQuestionAnswering, BertTokenizerFast, RobertaConfig

from pipeline.export.int8_tuning import CPU_PLUGIN_REFUSED
from pipeline.plan.config import ConfigError
from pipeline.plan.deploy import DeployError, check_local_model, deploy_root, load_deployable
from pipeline.runtime import squad
from tests.dag_run import snakemake_command
from tests.dev_split_records import assert_tuning_steps_read_no_gated_question
from tests.deploy_run import answerable_questions, tiny_qa_model_with_its_own_vocabulary
from tests.dry_run import command_line_dry_run
from tests.stage_fixtures import tiny_bert_config, tiny_config

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "river", "flows", "north", "who", "what"]


def wordpiece_tokenizer(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(WORDS + [f"w{i}" for i in range(50 - len(WORDS))]) + "\n")
    return BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))


def deploying(folder):
    return tiny_config(deploy={"model": str(folder)})


def qa_config(**overrides):
    """A tiny BERT with as many positions as configs/test.yaml's longest CoreML length."""
    return tiny_bert_config(**{"max_position_embeddings": 128, **overrides})


def test_a_deploy_build_goes_to_a_folder_named_after_the_model(tmp_path, monkeypatch):
    assert deploy_root(tiny_config(deploy={"model": "distilbert-base-cased-distilled-squad"})) == \
        "artifacts/deploy/distilbert-base-cased-distilled-squad"
    assert deploy_root(tiny_config(deploy={"model": "owner/bert-qa", "revision": "v1.0"})) == \
        "artifacts/deploy/owner--bert-qa--v1.0"
    assert deploy_root(tiny_config(output_root="out", deploy={"model": "./models/my qa/"})) == "out/deploy/my-qa"
    (tmp_path / "qa").mkdir()
    monkeypatch.chdir(tmp_path / "qa")
    # "." and ".." name real folders: never the output root itself
    assert deploy_root(tiny_config(deploy={"model": "."})) == "artifacts/deploy/qa"
    assert deploy_root(tiny_config(deploy={"model": ".."})) == f"artifacts/deploy/{tmp_path.name}"
    with pytest.raises(ConfigError, match="deploy.model: empty"):
        tiny_config(deploy={"model": " "})


def test_a_qa_model_with_a_wordpiece_tokenizer_loads(tmp_path):
    BertForQuestionAnswering(qa_config()).save_pretrained(tmp_path / "qa")
    wordpiece_tokenizer(tmp_path / "qa").save_pretrained(tmp_path / "qa")
    model, tokenizer = load_deployable(deploying(tmp_path / "qa"))
    assert type(model).__name__ == "BertForQuestionAnswering" and not model.training
    assert tokenizer.is_fast
    check_local_model(str(tmp_path / "qa"), deploying(tmp_path / "qa"))  # the planning check passes too


def saved_by_transformers_5(folder):
    """Rewrite a save_pretrained folder's config.json as transformers 5.x writes it: `dtype` (no `torch_dtype`), its
    version, the decoder keys spelled out, and none of the keys 5.x no longer writes for BERT."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["dtype"] = config.pop("torch_dtype", None) or config.get("dtype") or "float32"
    for key in ("position_embedding_type", "use_cache", "classifier_dropout"):
        config.pop(key, None)
    config.update({"transformers_version": "5.23.0", "is_decoder": False, "add_cross_attention": False,
                   "tie_word_embeddings": True})
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def test_a_qa_model_saved_by_transformers_5_deploys(tmp_path):
    import torch

    original = BertForQuestionAnswering(qa_config()).eval()
    original.save_pretrained(tmp_path / "qa")
    wordpiece_tokenizer(tmp_path / "qa").save_pretrained(tmp_path / "qa")
    config = saved_by_transformers_5(tmp_path / "qa")
    assert "torch_dtype" not in config and config["dtype"] == "float32"
    cfg = deploying(tmp_path / "qa")
    check_local_model(str(tmp_path / "qa"), cfg)  # the planning check
    model, tokenizer = load_deployable(cfg)  # deploy_model's loading
    assert type(model).__name__ == "BertForQuestionAnswering" and model.dtype == torch.float32 and tokenizer.is_fast
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), original.state_dict().values()))


def test_a_base_model_without_a_trained_qa_head_is_refused(tmp_path):
    BertForMaskedLM(qa_config()).save_pretrained(tmp_path / "mlm")
    wordpiece_tokenizer(tmp_path / "mlm").save_pretrained(tmp_path / "mlm")
    with pytest.raises(DeployError, match="no trained question-answering head.*qa_outputs"):
        load_deployable(deploying(tmp_path / "mlm"))


def test_an_architecture_the_exporters_do_not_take_is_refused_at_planning_and_in_the_stage(tmp_path):
    RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=32).save_pretrained(tmp_path / "roberta")
    roberta = deploying(tmp_path / "roberta")
    for check in (lambda: check_local_model(str(tmp_path / "roberta"), roberta), lambda: load_deployable(roberta)):
        with pytest.raises(DeployError, match="model_type 'roberta' is not one the exporters take"):
            check()
    with pytest.raises(DeployError, match="no config.json"):
        check_local_model(str(tmp_path / "nothing-here"), deploying(tmp_path / "nothing-here"))


def test_a_model_with_fewer_positions_than_the_windows_or_coreml_lengths_is_refused(tmp_path):
    BertForQuestionAnswering(qa_config(max_position_embeddings=100)).save_pretrained(tmp_path / "short")
    wordpiece_tokenizer(tmp_path / "short").save_pretrained(tmp_path / "short")
    cfg = deploying(tmp_path / "short")  # windows of squad.max_seq_length, CoreML lengths up to 128
    message = "has 100 positions; .*export.coreml.sequence_lengths asks for 128: set them to at most 100"
    with pytest.raises(DeployError, match=message):
        check_local_model(str(tmp_path / "short"), cfg)
    with pytest.raises(DeployError, match=message):
        load_deployable(cfg)


def test_a_tokenizer_other_than_wordpiece_is_refused(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    BertForQuestionAnswering(qa_config()).save_pretrained(tmp_path / "bpe")
    bpe = Tokenizer(models.BPE(vocab={w: i for i, w in enumerate(WORDS)}, merges=[], unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="[UNK]").save_pretrained(tmp_path / "bpe")
    with pytest.raises(DeployError, match="not a WordPiece tokenizer"):
        load_deployable(deploying(tmp_path / "bpe"))


def test_target_deploy_without_a_model_says_what_to_set(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"output_root: {json.dumps(str(tmp_path / 'out'))}\n")
    _python, _module_flag, _snakemake, *arguments = snakemake_command(tmp_path, config, "-n", target="deploy")
    completed = command_line_dry_run(arguments, cwd=tmp_path)  # the command line, in this process
    assert completed.returncode != 0 and "target deploy needs deploy.model" in completed.stdout + completed.stderr


@pytest.mark.integration
def test_the_documented_offline_deploy_runs_as_written(documented_offline_deploy):
    """docs/deploy.md's offline command, run exactly as written in a copy of the project with ./my-qa-model and
    ./my-dev.json beside it: no MLM corpus, no tokenizer training, no training rule, no full-size build; every
    export gated against this model's own PyTorch answers; the bundle, benchmark and report describe it. The
    command runs once per test run (tests/deploy_run.py)."""
    project, command = documented_offline_deploy.project, documented_offline_deploy.command
    environment, completed = documented_offline_deploy.environment, documented_offline_deploy.completed
    answerable = answerable_questions(project / "my-dev.json")  # counted from the file, as a user would
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    ran = set(re.findall(r"^(?:local)?rule (\w+):$", completed.stderr, flags=re.M))
    assert ran == {"prepare_data", "deploy_model", "export_onnx", "quantize_onnx", "export_coreml", "export_npu", "bundle",
                   "benchmark", "benchmark_web", "report", "deploy"}
    assert "starts with './'" not in completed.stderr
    root = project / "artifacts" / "deploy" / "my-qa-model"
    data = json.loads((root / "data" / "metrics.json").read_text())
    assert data["deploy"] and data["n_train_examples"] == 0 and data["n_dev_examples"] == answerable
    assert sorted(path.name for path in (root / "data").glob("[!.]*")) == ["dev.json", "dev.jsonl", "manifest.json",
                                                                         "metrics.json"]
    deployed = json.loads((root / "deployed_model" / "metrics.json").read_text())
    assert deployed["source"] == "./my-qa-model" and deployed["fine_tuned_here"] is False
    predictions = json.loads((root / "deployed_model" / "predictions.json").read_text())
    assert len(predictions) == deployed["n_examples"] == answerable
    export = json.loads((root / "onnx" / "deployed" / "export.json").read_text())
    quantized = json.loads((root / "quantized" / "deployed" / "quantize.json").read_text())
    # The dev file is smaller than export.gates.dev_questions + the tuning questions: it is split by paragraph,
    # the gates score one part and the int8 search tunes on the other, as written in the documented command.
    gated = quantized["gated_ids"]
    assert quantized["dev_split"] == data["dev_split"] and 0 < len(gated) < answerable
    assert len(gated) + len(quantized["tuning_ids"]) == answerable and not set(gated) & set(quantized["tuning_ids"])
    # the gates hold the exports to this model's own answers on the gated questions
    gold = {record["id"]: record["answers"]["text"] for record in map(json.loads, (root / "data" / "dev.jsonl")
                                                                      .read_text().splitlines())}
    pytorch_f1 = squad.squad_v1_scores({qid: gold[qid] for qid in gated}, {qid: predictions[qid] for qid in gated})
    assert export["pytorch"]["f1"] == quantized["pytorch_f1"] == round(pytorch_f1["f1"], 3)
    assert export["fp32"]["passed"] and export["optimized"]["passed"]
    # the accuracy-aware int8 ran: static (qdq) recipes calibrated on tuning questions only
    assert any("qdq" in name for name in quantized["variants"])
    # the x86 target is built unless this machine's OpenVINO CPU plugin refuses the model (narrowed SIMD)
    assert all(why.startswith(CPU_PLUGIN_REFUSED) for why in quantized["left_out_targets"].values())
    assert quantized["reads"]["static_calibration"]
    for step, ids in quantized["reads"].items():
        assert set(ids) <= set(quantized["tuning_ids"]) and not set(ids) & set(gated), step
    # Every int8 tuning step read held-out dev questions only; every stage scored the gated ones
    assert_tuning_steps_read_no_gated_question(root / "quantized" / "deployed", root / "onnx" / "deployed",
                                               root / "bundle")
    # The static (qdq) recipes were calibrated on those held-out questions, and built
    qdq = [name for name, recipe in quantized["int8_recipes"].items() if recipe["format"] == "qdq"]
    assert qdq and all(quantized["variants"][name]["path"] for name in qdq)
    agreement = quantized["variants"]["int8"]["gates"]["answer_agreement"]
    assert agreement["minimum"] is None and agreement["passed"] is None  # recorded, not a gate (configs/deploy.yaml)
    bundle = json.loads((root / "bundle" / "metrics.json").read_text())
    assert bundle["n_questions"] == len(gated) and (root / "bundle" / "model.fp32.onnx").is_file()
    if quantized["bundle_choice"]:
        assert (root / "bundle" / "model.int8.ort").is_file() and bundle["int8_note"] is None
    else:  # the bundle ships without int8 and says why in one line, at the end of the run too
        assert (root / "bundle" / "model.fp32.ort").is_file() and bundle["int8_note"] in completed.stdout
    summary = json.loads((root / "report" / "summary.json").read_text())
    assert set(summary["models"]) == {"deployed"} and summary["models"]["deployed"]["f1"] == deployed["f1"]
    ort_item = "deployed/ort-int8" if quantized["bundle_choice"] else "deployed/ort-fp32"
    # a BERT: its NPU graphs are built and checked on the QNN HTP emulation (or say why not); the Neural Engine
    # layout is DistilBERT's, so its package is not built, saying why
    assert any(item["name"].startswith("deployed/npu-int8-static") for item in summary["artifacts"])
    emulator = summary["npu"]["deployed"]["emulator"]
    assert emulator["ran"] is True or emulator["reason"]
    assert "deployed/coreml-ane" not in {item["name"] for item in summary["artifacts"]}
    coreml = json.loads((root / "coreml" / "deployed" / "coreml.json").read_text())
    assert "DistilBERT" in coreml["not_built"]["ane"]
    assert summary["full_size"] == [] and ort_item in {item["name"] for item in summary["artifacts"]}
    assert [item["what"] for item in summary["skipped_timings"]] == ["Chromium timings (onnxruntime-web in a page)"]
    assert {"onnx-node", "onnx-web"} <= {item["format"] for item in summary["artifacts"]}  # Node's timings ran
    shipped_variant = f"onnx-{quantized['bundle_choice']}" if quantized["bundle_choice"] else "onnx-fp32"
    assert any(row["shipped"] and row["variant"] == shipped_variant for row in summary["gates"])
    report_text = (root / "report" / "report.md").read_text()
    assert report_text.startswith("# ./my-qa-model, deployed as it is") and "## Training" not in report_text
    assert "## Gates: what ships" in report_text and "Not timed on this machine: Chromium timings" in report_text
    # the dev file holds fewer questions than export.gates.dev_questions: the report says how many were scored
    assert (f"{len(gated)} gated dev questions (a dev set smaller than export.gates.dev_questions 1000 plus the "
            "int8 tuning questions is split between them") in report_text
    card = ModelCard.load(root / "deployed_model" / "README.md")
    assert card.data.license is None and card.data.eval_results[1].metric_value == deployed["f1"]
    assert not any((root / stage).exists() for stage in ("teacher", "distill_squad", "tokenizer", "corpus", "full_size"))
    # Editing a file inside the local model folder plans the build again from deploy_model on.
    readme = project / "my-qa-model" / "tokenizer_config.json"
    readme.write_text(readme.read_text().replace("}", ', "edited": true}', 1))
    planned = subprocess.run(command + " -n", shell=True, cwd=project, env=environment, capture_output=True,
                             text=True, check=True)
    assert "deploy_model" in planned.stdout and "bundle" in planned.stdout and "prepare_data" not in planned.stdout


def test_the_readme_command_plans_the_deploy_dag_with_no_training_rule(tmp_path):
    """`snakemake deploy --configfile configs/deploy.yaml` over the default config (a dry run: no hub access)."""
    from tests.paths import PROJECT_ROOT
    from tests.dry_run import dry_run

    completed = dry_run(tmp_path, [PROJECT_ROOT / "configs" / "deploy.yaml"], {"output_root": str(tmp_path / "out")},
                        target="deploy")
    planned = {line.split()[-1].rstrip(":") for line in completed.stdout.splitlines()
               if line.startswith(("rule ", "localrule "))}
    assert planned == {"prepare_data", "deploy_model", "export_onnx", "quantize_onnx", "export_coreml", "export_npu", "bundle",
                       "benchmark", "benchmark_web", "report", "deploy"}
    assert f"{tmp_path / 'out'}/deploy/distilbert-base-cased-distilled-squad/bundle" in completed.stdout


def test_prepare_data_for_a_deploy_writes_the_dev_set_only(squad2_dev_sample, tmp_path):
    from pipeline.plan.data_sources import configured_local_paths
    from pipeline.stages import prepare_data

    cfg = tiny_config(deploy={"model": "owner/qa"}, data={"squad": "squad", "squad_dev": str(squad2_dev_sample),
                                                          "corpus": "synthetic", "max_dev_examples": 50})
    assert configured_local_paths(cfg) == {"data.squad_dev": str(squad2_dev_sample)}  # no corpus, no hub train set
    metrics = prepare_data.run(cfg, tmp_path / "data")
    assert metrics["deploy"] and metrics["n_train_examples"] == 0 and metrics["n_dev_examples"] == 50
    assert metrics["squad_source"] == str(squad2_dev_sample) and metrics["dev_source_key"] == "data.squad_dev"
    assert not (tmp_path / "data" / "train.jsonl").exists() and not (tmp_path / "data" / "corpus.txt").exists()
    assert len((tmp_path / "data" / "dev.jsonl").read_text().splitlines()) == 50
    missing = tiny_config(deploy={"model": "owner/qa"}, data={"squad_dev": str(tmp_path / "nowhere.json")})
    with pytest.raises(Exception, match="data.squad_dev: .*nowhere.json"):
        prepare_data.run(missing, tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_deploy_model_answers_with_the_models_own_predictions(squad2_dev_sample, tmp_path):
    """deploy_model.run on a tiny local QA model: its predictions are the ones that model gives (and another
    model's differ), saved beside the model with the scores and the card."""
    import torch

    from pipeline.data import qa_windows
    from pipeline.data.squad_loading import load_squad
    from pipeline.stages import deploy_model, prepare_data

    tiny_qa_model_with_its_own_vocabulary(tmp_path / "qa", squad2_dev_sample)
    torch.manual_seed(1)
    other = BertForQuestionAnswering(BertForQuestionAnswering.from_pretrained(tmp_path / "qa").config)
    cfg = tiny_config(deploy={"model": str(tmp_path / "qa")},
                      data={"squad_dev": str(squad2_dev_sample), "max_dev_examples": 40})
    prepare_data.run(cfg, tmp_path / "data")
    metrics = deploy_model.run(cfg, tmp_path / "data", tmp_path / "deployed")
    predictions = json.loads((tmp_path / "deployed" / "predictions.json").read_text())
    dev, _ = load_squad(str(tmp_path / "data" / "dev.jsonl"))
    tokenizer = BertTokenizerFast.from_pretrained(tmp_path / "qa")
    model = BertForQuestionAnswering.from_pretrained(tmp_path / "qa").eval()
    own_metrics, own = qa_windows.evaluate_qa(model, tokenizer, dev, cfg.squad, torch.device("cpu"))
    assert predictions == own and metrics["f1"] == own_metrics["f1"] and len(predictions) == 40
    _, others = qa_windows.evaluate_qa(other.eval(), tokenizer, dev, cfg.squad, torch.device("cpu"))
    assert others != predictions
    saved = BertForQuestionAnswering.from_pretrained(tmp_path / "deployed").eval()
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), model.state_dict().values()))
    assert metrics["fine_tuned_here"] is False and metrics["model_type"] == "bert"
