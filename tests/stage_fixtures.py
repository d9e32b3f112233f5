"""Tiny real artifacts for stage tests: a generated world, a trained tokenizer, a small BERT teacher."""

from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM, BertForQuestionAnswering

from pipeline.outputs.artifacts import atomic_write_json
from pipeline.plan.config import PipelineConfig, load_config
from pipeline.stages import init_student, prepare_data, tokenize_corpus, tokenizer
from pipeline.stages.teacher import teacher_config_from_scratch
from tests.paths import PROJECT_ROOT


def tiny_bert_config(**overrides) -> BertConfig:
    """A BERT small enough for millisecond unit tests."""
    fields = dict(vocab_size=50, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32,
                  max_position_embeddings=64)
    fields.update(overrides)
    return BertConfig(**fields)


def tiny_config(**overrides) -> PipelineConfig:
    return load_config(PROJECT_ROOT / "configs" / "test.yaml", overrides=overrides)


def build_tiny_artifacts(root: Path, cfg: PipelineConfig | None = None) -> dict[str, Path]:
    """data, tokenizer, the tokenized corpus, an (untrained) MLM teacher and QA teacher and an initialised student."""
    cfg = cfg or tiny_config()
    paths = {name: root / name for name in ("data", "tokenizer", "corpus", "mlm_teacher", "qa_teacher", "student")}
    prepare_data.run(cfg, paths["data"])
    tokenizer.run(cfg, paths["data"], paths["tokenizer"])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(paths["tokenizer"])
    with torch.random.fork_rng():  # the same weights in every session, whatever ran before; the caller's stream stays
        torch.manual_seed(0)
        mlm_teacher = BertForMaskedLM(teacher_config_from_scratch(cfg, tok))
        mlm_teacher.save_pretrained(paths["mlm_teacher"])
        tok.save_pretrained(paths["mlm_teacher"])
        qa_teacher = BertForQuestionAnswering.from_pretrained(paths["mlm_teacher"])
    qa_teacher.save_pretrained(paths["qa_teacher"])
    tok.save_pretrained(paths["qa_teacher"])
    atomic_write_json(paths["qa_teacher"] / "metrics.json", {"exact_match": 1.0, "f1": 2.0})
    tokenize_corpus.run(cfg, paths["data"], paths["tokenizer"], paths["corpus"], workers=1)
    init_student.run(cfg, str(paths["mlm_teacher"]), paths["tokenizer"], paths["student"])
    return paths


def tiny_qa_model_dir(root: Path, paths: dict[str, Path], cfg: PipelineConfig, distilbert: bool = True) -> Path:
    """A QA model folder as a QA stage writes it: weights, tokenizer, dev predictions.json and metrics.json.

    The weights are random (seeded): export stages compare exports against the PyTorch model, not against gold.
    """
    import torch
    from transformers import AutoTokenizer, DistilBertForQuestionAnswering, BertForQuestionAnswering

    from pipeline.data import qa_windows
    from pipeline.data.squad_loading import load_squad

    torch.manual_seed(0)
    source = paths["student"] if distilbert else paths["qa_teacher"]
    model_class = DistilBertForQuestionAnswering if distilbert else BertForQuestionAnswering
    model = model_class.from_pretrained(source).eval()
    tokenizer = AutoTokenizer.from_pretrained(paths["tokenizer"])
    dev, _ = load_squad(str(paths["data"] / "dev.jsonl"))
    metrics, predictions = qa_windows.evaluate_qa(model, tokenizer, dev, cfg.squad, torch.device("cpu"))
    out = root / ("distilbert_qa" if distilbert else "bert_qa")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    atomic_write_json(out / "predictions.json", predictions)
    atomic_write_json(out / "metrics.json", metrics)
    return out


# Random tiny models have near-flat logits, so int8 rounding flips many answers: the export stages run with the
# compressed-variant gates relaxed (tests/stages/test_export.py exercises the gates on their own), every CoreML variant,
# the whole int8 search grid at per-channel scales (every graph, both formats, both attention settings) and the
# 4-bit graph (configs/test.yaml leaves both to these tests).
EXPORT_RELAXED = {
    "gates": {"min_answer_agreement": 0.0, "max_f1_drop": 100.0},
    "coreml": {"sequence_lengths": [64, 128], "variants": ["fp16", "int8", "4bit", "ane"]},
    "quantize": {"search_graphs": ["plain", "fused", "fused-no-attention"], "search_formats": ["qoperator", "qdq"],
                 "search_per_channel": [True], "search_attention_int8": [False, True], "int4": True},
}


def export_tiny_student(root: Path) -> dict:
    """A tiny random DistilBERT student through export_onnx, quantize_onnx, export_coreml, export_npu and bundle (the pipeline's
    own stages), with the data, tokenizer and teacher it was built from. Callers read these files; they never
    change them (tests that damage a file damage a copy)."""
    from pipeline.stages import bundle, export_coreml, export_npu, export_onnx, quantize

    cfg = tiny_config(export=EXPORT_RELAXED)
    paths = build_tiny_artifacts(root, cfg)
    student = tiny_qa_model_dir(root, paths, cfg, distilbert=True)
    export_onnx.run(cfg, student, paths["data"], root / "onnx_student")
    quantize.run(cfg, root / "onnx_student", student, paths["data"], root / "quantized")
    export_coreml.run(cfg, student, paths["data"], root / "coreml")
    export_npu.run(cfg, student, paths["data"], root / "npu")
    bundle.run(cfg, root / "onnx_student", root / "quantized", root / "coreml", student, paths["data"], root / "bundle",
               npu_dir=root / "npu")
    return {"root": root, "cfg": cfg, "paths": paths, "data": paths["data"], "student": student,
            "onnx_student": root / "onnx_student", "quantized": root / "quantized", "coreml": root / "coreml",
            "npu": root / "npu", "bundle": root / "bundle"}
