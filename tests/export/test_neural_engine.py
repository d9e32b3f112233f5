"""The Neural Engine layout of a DistilBERT (pipeline/export/neural_engine.py): the same answers as the standard model,
the layout Apple's guidance asks for, and a CoreML package whose own weights read back into it, as export_coreml's
gate reads them."""

import shutil

import numpy as np
import pytest
import torch

from pipeline.export import coreml, neural_engine
from tests.stage_fixtures import EXPORT_RELAXED, build_tiny_artifacts, tiny_config, tiny_qa_model_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny DistilBERT student (its layer norms moved off their identity, as training moves them) and BERT
    teacher, and the student's ane package."""
    root = tmp_path_factory.mktemp("neural_engine")
    cfg = tiny_config(export=EXPORT_RELAXED)
    paths = build_tiny_artifacts(root, cfg)
    student = tiny_qa_model_dir(root, paths, cfg, distilbert=True)
    teacher = tiny_qa_model_dir(root, paths, cfg, distilbert=False)
    wrapped = coreml.load_wrapped(student, True)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    package = root / "ane.mlpackage"
    coreml.convert(coreml.compress(wrapped, "ane", cfg.export.coreml), cfg.export.coreml, package)
    return {"cfg": cfg, "student": student, "teacher": teacher, "wrapped": wrapped, "package": package,
            "untrained": coreml.load_wrapped(student, True)}


def padded_batch(lengths, width=64):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (len(lengths), width), generator=generator, dtype=torch.int32)
    mask = torch.zeros(len(lengths), width, dtype=torch.int32)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        ids[row, length:] = 0
    return ids, mask


@pytest.mark.parametrize("mask_input", [True, False])
def test_the_layout_gives_the_standard_models_logits_on_padded_windows(models, mask_input):
    wrapped = coreml.load_wrapped(models["student"], mask_input)
    twin = neural_engine.neural_engine_twin(coreml.load_wrapped(models["student"], mask_input))
    ids, mask = padded_batch([64, 40, 17])
    with torch.no_grad():
        expected = wrapped(ids, mask) if mask_input else wrapped(ids)
        found = twin(ids, mask) if mask_input else twin(ids)
    real = mask.bool()
    for want, got in zip(expected, found):
        assert (want - got).abs()[real].max() < 1e-4
        assert torch.equal(want.masked_fill(~real, 0).argmax(dim=1), got.masked_fill(~real, 0).argmax(dim=1))


def test_every_projection_is_a_1x1_convolution_on_channels_first_tensors(models):
    twin = neural_engine.neural_engine_twin(models["wrapped"])
    assert not any(isinstance(module, torch.nn.Linear) for module in twin.modules())
    convolutions = [module for module in twin.modules() if isinstance(module, torch.nn.Conv2d)]
    assert len(convolutions) == 6 * len(twin.layers) + 1 and all(c.kernel_size == (1, 1) for c in convolutions)
    shapes = []
    twin.layers[0].register_forward_hook(lambda module, inputs, output: shapes.append(tuple(output.shape)))
    ids, mask = padded_batch([64, 30])
    with torch.no_grad():
        twin(ids, mask)
    assert shapes == [(2, twin.layers[0].ffn_in.in_channels, 1, 64)]  # (B, C, 1, S)


def test_a_bert_is_refused_by_name(models):
    with pytest.raises(ValueError, match="built for DistilBERT; this model is 'bert'"):
        neural_engine.neural_engine_twin(coreml.load_wrapped(models["teacher"], True))
    variants, not_built = coreml.variants_for("bert", ["4bit", "ane"])
    assert variants == ["4bit"] and "DistilBERT" in not_built["ane"]


def package_ops(path):
    import coremltools as ct

    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    function = spec.mlProgram.functions["main"]
    return {operation.type for operation in function.block_specializations[function.opset].operations}


def test_the_package_runs_convolutions_with_the_enumerated_lengths(models):
    info = coreml.read_package(models["package"])
    assert [sorted(s[1] for s in i["enumerated_shapes"]) for i in info["inputs"]] == [[64, 128], [64, 128]]
    ops = package_ops(models["package"])
    assert "conv" in ops and "linear" not in ops and "layer_norm" in ops


def test_the_packages_weights_read_back_into_the_layout_and_answer_as_it_does_at_float16(models):
    twin = neural_engine.neural_engine_twin(models["wrapped"])
    stand_in, record = coreml.stand_in_from_package(neural_engine.neural_engine_twin(models["untrained"]),
                                                    models["package"])
    assert record["parameters"] == record["loaded"] == record["tensors"] and record["shared"] == {}
    for name, parameter in stand_in.named_parameters():
        assert torch.equal(parameter, dict(twin.named_parameters())[name].half().float()), name
    ids, mask = padded_batch([64, 50])
    with torch.no_grad():
        found = stand_in.half()(ids, mask)
        expected = twin.half()(ids, mask)
    for want, got in zip(expected, found):
        assert torch.equal(want, got)


def test_identity_layer_norms_the_converter_leaves_out_read_as_themselves(models, tmp_path):
    """An untrained model's layer norms scale by ones and shift by zeros: the converter removes those no-ops, so the
    package does not hold them; every other weight still reads back by name."""
    cfg = models["cfg"]
    path = tmp_path / "ane.mlpackage"
    coreml.convert(coreml.compress(models["untrained"], "ane", cfg.export.coreml), cfg.export.coreml, path)
    twin = neural_engine.neural_engine_twin(coreml.load_wrapped(models["student"], True))
    _, record = coreml.stand_in_from_package(twin, path)
    norms = {name for name, _ in twin.named_parameters() if "norm" in name}
    assert set(record["shared"]) == norms and set(record["shared"].values()) == {"(identity, not stored)"}
    assert record["loaded"] == record["parameters"] == record["tensors"] + len(norms)
    # a weight the converter kept cannot be passed off as an identity: changed, the package fails its read-back
    with torch.no_grad():
        twin.layers[0].attention_norm.weight.mul_(2.0)
    with pytest.raises(coreml.UnreadWeights, match="not in the package"):
        coreml.stand_in_from_package(twin, path)
