"""Target deploy on the other BERT-family models users bring: ELECTRA and MobileBERT QA models, each a tiny model of
that type with its own WordPiece vocabulary, fine-tuned for a few steps on the real SQuAD sample, taken by
deploy_model, exported to ONNX (fp32 and the fused graph, its fusions checked for that type), quantized to int8,
converted to CoreML, gated, bundled, and answered by the torch-free Python answerer and the JavaScript client.

The stages run as the deploy DAG runs them (rules/export.smk), once per type for the whole module."""

import json
import shutil

import numpy as np
import onnxruntime
import pytest
from huggingface_hub import ModelCard

from pipeline.export import coreml, onnx_graph
from pipeline.plan import model_types
from pipeline.export.gates import GateError
from pipeline.plan.deploy import DeployError, check_local_model
from pipeline.runtime import answering
from pipeline.stages import bundle, deploy_model, export_coreml, export_onnx, prepare_data, quantize
from tests.paths import PROJECT_ROOT, SHARED_SQUAD_SAMPLE
from tests.deploy_run import TINY_QA_CONFIGS, tiny_qa_model_with_its_own_vocabulary
from tests.stage_fixtures import tiny_config

CLIENT = PROJECT_ROOT / "clients" / "web"
N_QUESTIONS = 60  # the dev questions a deploy scores here; the models were fine-tuned on the sample's others
NAMES = {"electra": ("ELECTRA", "ElectraForQuestionAnswering"),
         "mobilebert": ("MobileBERT", "MobileBertForQuestionAnswering")}


@pytest.fixture(scope="module", params=["electra", "mobilebert"])
def deployed_family(request, tmp_path_factory) -> dict:
    """A tiny fine-tuned QA model of the type through the deploy stages: prepare_data, deploy_model, export_onnx,
    quantize_onnx, export_coreml and bundle (configs/test.yaml, whose compressed-variant gates are relaxed)."""
    if not SHARED_SQUAD_SAMPLE.is_file():
        pytest.skip(f"real SQuAD sample not found at {SHARED_SQUAD_SAMPLE} (../shared is absent)")
    import torch

    model_type, root = request.param, tmp_path_factory.mktemp(request.param)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        tiny_qa_model_with_its_own_vocabulary(root / "my-qa-model", SHARED_SQUAD_SAMPLE, model_type,
                                              fine_tune_steps=60)
    cfg = tiny_config(deploy={"model": str(root / "my-qa-model")},
                      data={"squad_dev": str(SHARED_SQUAD_SAMPLE), "max_dev_examples": N_QUESTIONS},
                      # the bundle's choice is not what is tested here, nor the x86 target (tests/stages/test_export.py)
                      export={"quantize": {"latency_runs": 5, "openvino": False}})
    paths = {name: root / name for name in ("data", "deployed_model", "onnx", "quantized", "coreml", "bundle")}
    prepare_data.run(cfg, paths["data"])
    metrics = {"deploy_model": deploy_model.run(cfg, paths["data"], paths["deployed_model"])}
    metrics["export_onnx"] = export_onnx.run(cfg, paths["deployed_model"], paths["data"], paths["onnx"])
    metrics["quantize"] = quantize.run(cfg, paths["onnx"], paths["deployed_model"], paths["data"], paths["quantized"])
    metrics["export_coreml"] = export_coreml.run(cfg, paths["deployed_model"], paths["data"], paths["coreml"])
    metrics["bundle"] = bundle.run(cfg, paths["onnx"], paths["quantized"], paths["coreml"], paths["deployed_model"], paths["data"],
                                   paths["bundle"])
    return {"model_type": model_type, "cfg": cfg, "source": root / "my-qa-model", **paths, "metrics": metrics}


def dev_examples(data_dir):
    records = [json.loads(line) for line in (data_dir / "dev.jsonl").read_text().splitlines()]
    return [{"id": r["id"], "question": r["question"], "context": r["context"]} for r in records]


def test_the_model_is_taken_and_its_card_names_its_type(deployed_family):
    name, architecture = NAMES[deployed_family["model_type"]]
    check_local_model(str(deployed_family["source"]), deployed_family["cfg"])  # the planning check takes the folder
    metrics = deployed_family["metrics"]["deploy_model"]
    assert metrics["model_type"] == deployed_family["model_type"] and metrics["architecture"] == architecture
    assert metrics["n_examples"] == N_QUESTIONS and metrics["f1"] > 0  # fine-tuned: some answers overlap the gold
    card = ModelCard.load(deployed_family["deployed_model"] / "README.md")
    assert f"{name} question-answering model ({architecture}) from {deployed_family['source']}" in card.text
    assert deployed_family["model_type"] in card.data.tags and card.data.license is None
    bundle_card = (deployed_family["bundle"] / "README.md").read_text()
    assert f"- exported from: {deployed_family['deployed_model']} ({name})" in bundle_card


def test_the_onnx_graphs_take_token_types_match_pytorch_and_have_the_types_fusions(deployed_family):
    export = deployed_family["metrics"]["export_onnx"]
    assert export["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert export["rejected"] == [] and max(export["parity"].values()) <= 1e-4
    for variant in ("fp32", "optimized"):  # the torch-free answerer gives PyTorch's answers
        assert export[variant]["answer_agreement_with_pytorch"] >= 0.98, variant
    fused = export["optimized"]["fused_ops"]
    if deployed_family["model_type"] == "electra":  # BERT's fusions: one Attention a layer, a skip-LayerNorm a sublayer
        assert (fused["Attention"], fused["SkipLayerNormalization"], fused["EmbedLayerNormalization"]) == (2, 4, 1)
    else:  # MobileBERT with NoNorm, as released: nothing matches (pipeline/plan/model_types.py says why)
        assert fused["Attention"] + fused["MultiHeadAttention"] + fused["SkipLayerNormalization"] == 0
    name, _ = NAMES[deployed_family["model_type"]]
    attention = fused["Attention"] + 1  # one the optimizer was not expected to find
    with pytest.raises(GateError, match=rf"Attention/MultiHeadAttention {attention}, expected .* per layer in {name}"):
        onnx_graph.check_fusions({**fused, "Attention": attention}, deployed_family["model_type"], 2, "here")


def test_token_types_change_the_logits_so_the_parity_gates_see_an_answerer_that_drops_them(deployed_family):
    """Segment embeddings are part of these models: a window fed all-zero token types (an answerer that left the
    input out) gives logits beyond the parity tolerance, so the gates above would have caught it."""
    answerer = answering.QuestionAnswerer.with_squad_settings(
        deployed_family["onnx"] / "fp32" / "model.onnx", deployed_family["onnx"] / "fp32" / "tokenizer.json",
        deployed_family["cfg"].squad, threads=1)
    windows = answerer.windows(dev_examples(deployed_family["data"])[:8])
    assert windows.token_type_ids.max() == 1
    start, _ = answering.window_logits(answerer.session, windows)
    windows.token_type_ids[:] = 0
    start_without, _ = answering.window_logits(answerer.session, windows)
    real = windows.attention_mask.astype(bool)
    assert np.abs(start - start_without)[real].max() > 100 * deployed_family["cfg"].export.gates.max_abs_logit_diff


def test_int8_graphs_are_built_gated_and_one_is_bundled(deployed_family):
    report = deployed_family["metrics"]["quantize"]
    assert set(report["variants"]) == {"int8", "int8-fused-qoperator-channel-attfp32"}
    assert report["bundle_choice"] in report["variants"] and report["variants"]["int8"]["passed"]
    assert report["variants"]["int8"]["ops"].get("MatMulInteger", 0) > 0
    config = json.loads((deployed_family["bundle"] / "qa_config.json").read_text())
    assert [i["name"] for i in config["onnx"]["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert "`token_type_ids` = 0 on [CLS], the question and its [SEP]" in (deployed_family["bundle"] / "README.md").read_text()
    bundled = deployed_family["metrics"]["bundle"]
    # the 60 dev questions are split by paragraph into gated and tuning ones (pipeline/export/dev_split.py)
    assert bundled["n_questions"] == report["n_questions"] == len(report["gated_ids"]) < N_QUESTIONS
    assert bundled["ort_answers_equal_onnx"] == 1.0
    # The bundle as an app opens it: its answers are the ones its metrics were scored on.
    answers = answering.QuestionAnswerer.from_bundle(deployed_family["bundle"]).predict(dev_examples(deployed_family["data"]))
    predictions = json.loads((deployed_family["quantized"] / report["bundle_choice"] / "predictions.json").read_text())
    assert {qid: answers[qid] for qid in predictions} == predictions


def test_coreml_packages_are_converted_checked_and_bundled(deployed_family):
    report = deployed_family["metrics"]["export_coreml"]
    package = report["packages"]["4bit"]  # configs/test.yaml converts the 4-bit variant
    assert [i["name"] for i in package["inputs"]] == ["input_ids", "attention_mask"]
    assert package["dev"]["passed"], package["dev"]  # its gates, or why its weights could not be read back
    assert (deployed_family["bundle"] / "coreml" / "4bit.mlpackage").is_dir()
    assert package["compressed_weight_ops"]["constexpr_lut_to_dense"] >= 2 * 6, package[  # the layers' projections
        "compressed_weight_ops"]


def test_the_coreml_wrapper_matches_the_model_and_its_fp16_mask_stays_finite(deployed_family):
    """The wrapper derives token types inside (after the first [SEP]) and masks with a finite fp16 score."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(deployed_family["deployed_model"]).eval()
    wrapped = coreml.load_wrapped(deployed_family["deployed_model"], mask_input=True)
    answerer = answering.QuestionAnswerer.with_squad_settings(
        deployed_family["onnx"] / "fp32" / "model.onnx", deployed_family["deployed_model"] / "tokenizer.json",
        deployed_family["cfg"].squad)
    windows = answerer.windows(dev_examples(deployed_family["data"])[:4])
    ids, mask = torch.from_numpy(windows.input_ids), torch.from_numpy(windows.attention_mask)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask,
                         token_type_ids=torch.from_numpy(windows.token_type_ids)).start_logits
        got, _ = wrapped(ids.int(), mask.int())
        half, _ = wrapped.half()(ids.int(), mask.int())
    real = mask.bool()
    assert torch.allclose(got[real], expected[real], atol=1e-4)
    assert torch.isfinite(half).all()


@pytest.mark.skipif(shutil.which("node") is None or not (CLIENT / "node_modules" / "onnxruntime-web").is_dir(),
                    reason="Node.js or clients/web/node_modules is missing (install Node 20, then `npm ci` in clients/web)")
def test_the_javascript_client_gives_the_python_answerers_windows_token_types_and_answers(deployed_family, tmp_path):
    from clients.web.scripts import check_parity
    questions = tmp_path / "questions.json"
    questions.write_text(json.dumps(dev_examples(deployed_family["data"])))
    report = check_parity.parity(deployed_family["bundle"], questions, ["node", "web"])
    for backend, figures in report["backends"].items():
        assert figures["windows_differing"] == 0, (backend, figures["first_differences"])
        assert figures["answer_agreement"] == 1.0, (backend, figures["answers_differing"])
        assert figures["answer_spans_same"] == N_QUESTIONS and figures["utf16_spans_wrong"] == [], backend


@pytest.mark.parametrize("model_type", [*TINY_QA_CONFIGS, "distilbert"])
def test_the_attention_shape_read_from_config_json_is_transformers_own(model_type, tmp_path):
    from transformers import AutoConfig

    shapes = {**TINY_QA_CONFIGS, "distilbert": dict(dim=32, n_heads=4, hidden_dim=64, n_layers=2)}
    config = AutoConfig.for_model(model_type, vocab_size=100, **shapes[model_type])
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    width = getattr(config, "true_hidden_size", config.hidden_size)  # MobileBERT attends at its bottleneck width
    assert model_types.attention_shape(saved, "here") == (config.num_attention_heads, width)
    del saved["n_heads" if model_type == "distilbert" else "num_attention_heads"]
    with pytest.raises(ValueError, match="here: no (n_heads|num_attention_heads)"):
        model_types.attention_shape(saved, "here")
    with pytest.raises(ValueError, match="here: model_type 'roberta' is not one the export path takes"):
        model_types.attention_shape({**saved, "model_type": "roberta"}, "here")


def test_a_type_the_exporters_do_not_take_is_refused_naming_the_folder_its_type_and_what_it_lacks(tmp_path):
    from transformers import AlbertConfig

    AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                 intermediate_size=32).save_pretrained(tmp_path / "albert-qa")
    with pytest.raises(DeployError) as refused:
        check_local_model(str(tmp_path / "albert-qa"), tiny_config(deploy={"model": str(tmp_path / "albert-qa")}))
    message = str(refused.value)
    assert f"deploy.model {tmp_path / 'albert-qa'}: model_type 'albert' is not one the exporters take" in message
    assert "BERT (bert), DistilBERT (distilbert), ELECTRA (electra), MobileBERT (mobilebert)" in message
    assert "its tokenizer is SentencePiece" in message and "no CoreML wrapper" in message
