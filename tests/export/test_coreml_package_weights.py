"""A CoreML package's weights read back out of it (pipeline/export/coreml.py), as export_coreml's gate reads them:
the tiny student converted to fp16, int8 and 4-bit packages, its weights decompressed and loaded into the PyTorch
model the package came from, and the digest that ties the weights gated to the package that ships."""

import copy
import shutil

import numpy as np
import pytest
import torch

from pipeline.data import qa_windows
from pipeline.export import coreml
from pipeline.export.gates import GateError, failure_lines, gate_questions
from tests.stage_fixtures import EXPORT_RELAXED, build_tiny_artifacts, tiny_config, tiny_qa_model_dir


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """The tiny student's model folder, its data, and its packages: fp16, int8 (blockwise from iOS18, affine for
    iOS17), 4-bit one table per tensor and 4-bit one table per group of channels, each with the PyTorch-side
    compressed model it was converted from."""
    root = tmp_path_factory.mktemp("coreml_weights")
    cfg = tiny_config(export=EXPORT_RELAXED)
    paths = build_tiny_artifacts(root, cfg)
    student = tiny_qa_model_dir(root, paths, cfg, distilbert=True)
    grouped = copy.deepcopy(cfg.export.coreml)
    grouped.palettization_granularity = "per_grouped_channel"
    ios17 = copy.deepcopy(cfg.export.coreml)
    ios17.minimum_deployment_target = "iOS17"
    settings = {"fp16": ("fp16", cfg.export.coreml), "int8": ("int8", cfg.export.coreml),
                "int8-ios17": ("int8", ios17), "4bit": ("4bit", cfg.export.coreml), "4bit-grouped": ("4bit", grouped)}
    built = {"cfg": cfg, "student": student, "data": paths["data"], "root": root}
    for name, (variant, ccfg) in settings.items():
        mask_input = ccfg.minimum_deployment_target == "iOS18"
        compressed = coreml.compress(coreml.load_wrapped(student, mask_input), variant, ccfg)
        coreml.convert(compressed, ccfg, root / f"{name}.mlpackage")
        built[name] = (root / f"{name}.mlpackage", compressed, mask_input)
    return built


def stand_in(packages, name):
    path, _, mask_input = packages[name]
    return coreml.stand_in_from_package(coreml.load_wrapped(packages["student"], mask_input), path)


def test_an_fp16_package_gives_back_the_models_weights_at_float16(packages):
    model, record = stand_in(packages, "fp16")
    original = dict(coreml.load_wrapped(packages["student"], True).named_parameters())
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, original[name].half().float()), name
    assert record["parameters"] == record["loaded"] == record["tensors"] == len(original)
    assert record["decompressed"] == {} and record["shared"] == {}


@pytest.mark.parametrize("name, op", [("int8", "constexpr_blockwise_shift_scale"),
                                      ("int8-ios17", "constexpr_affine_dequantize"),
                                      ("4bit", "constexpr_lut_to_dense")])
def test_compressed_packages_give_back_what_coremltools_compressed(packages, name, op):
    model, record = stand_in(packages, name)
    _, compressed, _ = packages[name]
    compressed = dict(compressed.named_parameters())
    original = dict(coreml.load_wrapped(packages["student"], True).named_parameters())
    # 2 layers x 6 linear + the QA head + word and position tables, decompressed by the package's own ops
    assert record["decompressed"] == {op: 15} and record["parameters"] == len(original)
    matrices = [name for name, parameter in model.named_parameters() if parameter.dim() == 2]
    assert len(matrices) == 15
    for matrix in matrices:
        read_back, expected = model.get_parameter(matrix), compressed[matrix].detach()
        # the compressed weights, within one float16 step at the tensor's largest value (the package dequantizes
        # in float16)...
        assert (read_back - expected).abs().max() <= expected.abs().max() * 2 ** -10, matrix
        # ...and not the float32 ones they were compressed from, though close to them
        difference = (read_back - original[matrix]).abs().max()
        assert 0 < difference <= original[matrix].abs().max() * (2 / 127 if name.startswith("int8") else 0.5)
        if name == "4bit":  # one 16-entry lookup table per tensor
            assert read_back.unique().numel() <= 16


def test_tensors_the_converter_stored_once_are_read_back_for_each_parameter(tmp_path):
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    # 128-wide untrained LayerNorms are all equal: coremltools keeps one of each tensor (const_deduplication)
    torch.manual_seed(0)
    DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=50, dim=128, n_layers=2, n_heads=2, hidden_dim=128,
                                                    max_position_embeddings=128)).save_pretrained(tmp_path / "wide")
    cfg = tiny_config(export=EXPORT_RELAXED).export.coreml
    coreml.convert(coreml.load_wrapped(tmp_path / "wide", True), cfg, tmp_path / "wide.mlpackage")
    model, record = coreml.stand_in_from_package(coreml.load_wrapped(tmp_path / "wide", True),
                                                 tmp_path / "wide.mlpackage")
    original = dict(coreml.load_wrapped(tmp_path / "wide", True).named_parameters())
    # one tensor for each group of equal parameters (the LayerNorms' ones and zeros, the zero biases)
    assert record["tensors"] == record["parameters"] - len(record["shared"]) < record["parameters"]
    assert all(torch.equal(original[name], original[twin]) for name, twin in record["shared"].items())
    layer_norm = "model.distilbert.embeddings.LayerNorm.weight"
    assert record["shared"]["model.distilbert.transformer.layer.1.output_layer_norm.weight"] == layer_norm
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, original[name].half().float()), name


def test_a_package_other_than_the_gated_one_fails_the_weight_check(packages):
    """The gate's digest of the weights it read back tells the package it scored from one written with another
    setting: here a lookup table per group of channels where the gated one has one per tensor."""
    _, record = stand_in(packages, "4bit")
    gated, other = packages["4bit"][0], packages["4bit-grouped"][0]
    coreml.verify_gated_weights(gated, record["weights_sha256"])
    with pytest.raises(GateError, match="not the ones its gate scored"):
        coreml.verify_gated_weights(other, record["weights_sha256"])
    for name in ("fp16", "int8"):
        with pytest.raises(GateError, match="not the ones its gate scored"):
            coreml.verify_gated_weights(packages[name][0], record["weights_sha256"])


def gate_inputs(packages):
    from transformers import AutoTokenizer

    cfg, student = packages["cfg"], packages["student"]
    questions = gate_questions(packages["data"], student, cfg)
    features = qa_windows.validation_windows(questions.records, AutoTokenizer.from_pretrained(student), cfg.squad)
    return questions, features, cfg


def test_the_dev_gate_scores_the_weights_read_from_the_package(packages):
    questions, features, cfg = gate_inputs(packages)
    path = packages["4bit"][0]
    report = coreml.package_dev_report(path, coreml.load_wrapped(packages["student"], True), questions, features,
                                       cfg, "4bit.mlpackage")
    assert report["executed"] == "weights read from the package, run in PyTorch at float16"
    assert report["read_back"]["weights_sha256"] == coreml.weights_digest(coreml.package_weights(path))
    assert report["read_back"]["decompressed"] == {"constexpr_lut_to_dense": 15}
    assert report["passed"] is True and set(report["gates"]) == {"answer_agreement", "f1_drop"}
    # the answers are the read-back model's, in float16
    model, _ = stand_in(packages, "4bit")
    expected = coreml.proxy_predictions(model, questions.records, features, cfg)
    from pipeline.runtime import squad

    assert report["f1"] == round(squad.squad_v1_scores(questions.gold, expected)["f1"], 3)


def test_a_package_whose_weights_cannot_be_read_back_is_rejected_with_the_reason(packages, tmp_path):
    questions, features, cfg = gate_inputs(packages)
    broken = tmp_path / "broken.mlpackage"
    shutil.copytree(packages["int8"][0], broken)
    shutil.rmtree(broken / "Data" / "com.apple.CoreML" / "weights")
    wide = tmp_path / "wide"  # a package of another architecture than the model it is gated as
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    DistilBertForQuestionAnswering(DistilBertConfig(vocab_size=50, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                                                    max_position_embeddings=128)).save_pretrained(wide)
    coreml.convert(coreml.load_wrapped(wide, True), cfg.export.coreml, tmp_path / "wide.mlpackage")
    for path, reason in ((broken, "could not be read"), (tmp_path / "wide.mlpackage", "of another shape")):
        report = coreml.package_dev_report(path, coreml.load_wrapped(packages["student"], True), questions,
                                           features, cfg, path.name)
        assert report["passed"] is False and report["verdict"] == "rejected" and report["f1"] is None
        assert reason in report["read_back"]["error"] and reason in report["gates"]["weights_read_back"]["judged_by"]
        # the bundle's message when no package passed names the gate and both numbers
        [line] = failure_lines([{"name": path.name, "gates": report["gates"]}])
        assert f"weights_read_back {report['read_back']['loaded']}, needs >= 38" in line
