"""Full-size architectures (DistilBERT-base, BERT-base) for sizes and latency: the model (random weights unless
named), random token windows for parity and calibration, their int8 graphs and their CoreML packages.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import numpy as np

from pipeline.data import qa_windows
from pipeline.export import int8
from pipeline.outputs.artifacts import directory_size_bytes, megabytes
from pipeline.plan.config import PipelineConfig
from pipeline.runtime import answering

PARITY_WINDOWS, PARITY_LENGTH = 4, 128
Architecture = Literal["distilbert", "bert-base"]  # the full-size models this module builds


def save_full_size(architecture: str, out_dir: Path, pretrained: str | None, seed: int) -> int:
    """The full-size QA model as a save_pretrained folder; returns its parameter count."""
    import torch
    from transformers import (BertConfig, BertForQuestionAnswering, DistilBertConfig,
                              DistilBertForQuestionAnswering)

    model_class, config_class = {"distilbert": (DistilBertForQuestionAnswering, DistilBertConfig),
                                 "bert-base": (BertForQuestionAnswering, BertConfig)}[architecture]
    if pretrained:
        model = model_class.from_pretrained(pretrained)
    else:
        torch.manual_seed(seed)
        model = model_class(config_class())  # the defaults are the base sizes: 768 wide, 30522 tokens, 512 positions
    model.save_pretrained(out_dir, safe_serialization=True)
    return model.num_parameters()


def random_windows(vocab_size: int, seed: int, count: int = PARITY_WINDOWS) -> answering.Windows:
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(5, vocab_size, size=(count, PARITY_LENGTH)).astype(np.int64)
    attention_mask = np.ones_like(input_ids)
    attention_mask[1::2, PARITY_LENGTH // 2:] = 0  # half the windows padded, as real batches are
    return answering.Windows([str(i) for i in range(count)], input_ids, attention_mask,  # one segment
                          np.zeros_like(input_ids), [[None] * PARITY_LENGTH] * count)


def random_calibration(graph_path: Path, vocab_size: int, seed: int) -> list[dict[str, np.ndarray]]:
    """The feeds a full-size graph's static int8 is calibrated on: random weights make calibrated scales
    meaningless beyond their graph shape, so a few random windows (each runs the full-size fp32 graph once)."""
    return int8.calibration_feeds(random_windows(vocab_size, seed), graph_path, PARITY_WINDOWS)


def build_int8_recipes(onnx_dir: Path, out_dir: Path, recipes: dict[str, int8.Int8Recipe], cfg: PipelineConfig,
                       vocab_size: int, graphs_dir: Path, int4_block_size: int | None = None) -> list[str]:
    """The int8 recipes (and 4-bit blocks unless int4_block_size is None) of a full-size ONNX export, each in its own
    folder of out_dir; returns the variant names. Random weights make calibrated scales meaningless beyond their
    graph shape: a few random windows calibrate the static recipes (each runs the full-size fp32 graph once)."""
    settings = int8.quantization_settings(cfg.export.quantize)
    calibration = random_windows(vocab_size, cfg.seed + 1)
    return int8.build_variants(onnx_dir, out_dir, settings, recipes, calibration, PARITY_WINDOWS, int4_block_size,
                               int4_embeddings=True, graphs_dir=graphs_dir)


def torch_logits(model_dir: Path, windows: answering.Windows) -> tuple[np.ndarray, np.ndarray]:
    import torch
    from transformers import AutoModelForQuestionAnswering

    model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    with torch.no_grad():
        inputs = {"input_ids": torch.from_numpy(windows.input_ids),
                  "attention_mask": torch.from_numpy(windows.attention_mask)}
        with_token_types = inputs | {"token_type_ids": torch.from_numpy(windows.token_type_ids)}
        output = model(**qa_windows.model_inputs(with_token_types, model))
    return output.start_logits.numpy(), output.end_logits.numpy()


def export_npu_graph(pytorch_dir: Path, npu_dir: Path, cfg: PipelineConfig, vocab_size: int) -> dict:
    """The Android NPU graph (pipeline/export/npu_graph.py) at PARITY_LENGTH, calibrated on random windows: its size
    and operators. One length only: every length's graph holds the same weights, so the same bytes."""
    import shutil

    from pipeline.export import coreml, npu_graph

    scratch = npu_dir / "float-graphs"
    scratch.mkdir(parents=True)
    float_graphs = npu_graph.export_float_graphs(coreml.load_wrapped(pytorch_dir, mask_input=True), [PARITY_LENGTH],
                                                 scratch)
    graphs = npu_graph.quantize_graphs(float_graphs, random_windows(vocab_size, cfg.seed + 1), PARITY_WINDOWS,
                                       npu_dir)
    shutil.rmtree(scratch)
    record = npu_graph.graph_record(graphs[PARITY_LENGTH])
    return {"path": f"{npu_graph.NPU_FOLDER}/{record['file']}", "sequence_length": PARITY_LENGTH,
            "size_mb": megabytes(record["bytes"]), **{key: record[key] for key in ("inputs", "dynamic_ops", "nnapi")},
            "built": "one length (each length's graph holds the same weights)"}


def export_coreml_packages(pytorch_dir: Path, coreml_dir: Path, cfg: PipelineConfig, out_dir: Path) -> dict:
    # Imported here: coremltools loads only where packages are built.
    from pipeline.export import coreml
    from pipeline.export.neural_engine import converted_module

    # The size goal counts every weight, so the full-size export palettizes the embedding tables too.
    coreml_cfg = dataclasses.replace(cfg.export.coreml, palettize_embeddings=True,
                                     sequence_lengths=cfg.export.full_size.coreml_sequence_lengths)
    coreml_dir.mkdir()
    packages = {}
    for variant in coreml_cfg.variants:
        wrapped = coreml.load_wrapped(pytorch_dir, coreml_cfg.minimum_deployment_target == "iOS18")
        path = coreml_dir / f"{variant}.mlpackage"
        coreml.convert(converted_module(wrapped, variant, coreml_cfg), coreml_cfg, path)
        info = coreml.read_package(path)
        coreml.check_package(info, variant, coreml_cfg,
                                    coreml.weight_matrix_count(wrapped.model, variant, coreml_cfg),
                                    f"{out_dir}/coreml/{path.name}")
        packages[variant] = {"path": f"coreml/{path.name}", "size_mb": megabytes(directory_size_bytes(path)), **info}
    return packages
