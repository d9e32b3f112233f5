"""The Neural Engine layout of a DistilBERT QA model (pipeline/export/neural_engine.py): the same logits and answers as
the standard CoreML wrapper, (B, C, 1, S) tensors and 1x1 convolutions throughout, and a package converted from it
that coreml.py reads, checks and gates as it does the standard one. Its speed on the Neural Engine cannot be
measured here (CoreML runs only on macOS)."""

from collections import Counter

import pytest
import torch

from pipeline.data import qa_windows
from pipeline.export import coreml
from pipeline.export.neural_engine import NeuralEngineQuestionAnswering, neural_engine_twin
from pipeline.export.gates import gate_questions
from tests.stage_fixtures import (EXPORT_RELAXED, build_tiny_artifacts, tiny_bert_config, tiny_config,
                                  tiny_qa_model_dir)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny DistilBERT student, its gated dev questions and windows, and the fp16 package of its twin."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("neural_engine")
    cfg = tiny_config(export=EXPORT_RELAXED)
    paths = build_tiny_artifacts(root, cfg)
    student = tiny_qa_model_dir(root, paths, cfg, distilbert=True)
    mask_input = cfg.export.coreml.minimum_deployment_target == "iOS18"
    path = root / "ane.mlpackage"
    coreml.convert(neural_engine_twin(coreml.load_wrapped(student, mask_input)), cfg.export.coreml, path)
    questions = gate_questions(paths["data"], student, cfg)
    features = qa_windows.validation_windows(questions.records, AutoTokenizer.from_pretrained(student), cfg.squad)
    return {"cfg": cfg, "student": student, "mask_input": mask_input, "path": path, "questions": questions,
            "features": features}


def padded_batches(vocab_size: int, pad_token_id: int, lengths=(64, 128)):
    """Batches of random tokens with padding at the end of some rows (none, some, most), at two lengths."""
    generator = torch.Generator().manual_seed(0)
    short, long = lengths
    for length, real in ((short, (short, short * 5 // 8, 7)), (long, (long, long * 25 // 32, 3, long // 2 + 1))):
        ids = torch.randint(0, vocab_size, (len(real), length), generator=generator, dtype=torch.int32)
        ids[ids == pad_token_id] = pad_token_id + 1
        mask = (torch.arange(length)[None, :] < torch.tensor(real)[:, None]).to(torch.int32)
        yield ids.masked_fill(mask == 0, pad_token_id), mask


def run(model, ids, mask):
    with torch.no_grad():
        return model(ids, mask) if model.mask_input else model(ids)


@pytest.mark.parametrize("mask_input", [True, False])
def test_the_twin_gives_the_standard_wrappers_logits(built, mask_input):
    wrapped = coreml.load_wrapped(built["student"], mask_input)
    twin = neural_engine_twin(wrapped)
    assert twin.mask_input is mask_input and isinstance(twin, NeuralEngineQuestionAnswering)
    for ids, mask in padded_batches(wrapped.model.config.vocab_size, wrapped.pad_token_id):
        for expected, found in zip(run(wrapped, ids, mask), run(twin, ids, mask)):
            assert found.shape == expected.shape == ids.shape
            torch.testing.assert_close(found, expected, atol=1e-4, rtol=1e-4)


def test_sinusoidal_positions_and_another_activation_are_read_as_they_are():
    from transformers import DistilBertConfig, DistilBertForQuestionAnswering

    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=50, dim=16, n_layers=2, n_heads=4, hidden_dim=24, max_position_embeddings=64,
                              sinusoidal_pos_embds=True, activation="relu")
    wrapped = coreml.CoreMLQuestionAnswering(DistilBertForQuestionAnswering(config).eval(), 0, -1, False)
    for ids, mask in padded_batches(50, 0, lengths=(32, 64)):
        for expected, found in zip(run(wrapped, ids, mask), run(neural_engine_twin(wrapped), ids, mask)):
            torch.testing.assert_close(found, expected, atol=1e-4, rtol=1e-4)


def test_the_twin_gives_the_standard_wrappers_answers(built):
    cfg, records, features = built["cfg"], built["questions"].records, built["features"]
    wrapped = coreml.load_wrapped(built["student"], built["mask_input"])
    expected = coreml.proxy_predictions(wrapped, records, features, cfg, half=False)
    assert coreml.proxy_predictions(neural_engine_twin(wrapped), records, features, cfg, half=False) == expected


def test_the_twin_is_in_the_neural_engine_layout(built):
    wrapped = coreml.load_wrapped(built["student"], True)
    twin = neural_engine_twin(wrapped)
    config = wrapped.model.config
    assert not any(isinstance(module, torch.nn.Linear) for module in twin.modules())
    convs = {name: module for name, module in twin.named_modules() if isinstance(module, torch.nn.Conv2d)}
    # q, k, v, out, the FFN's two per layer, and the QA head: each its Linear's weight as [out, in, 1, 1]
    assert len(convs) == 6 * config.n_layers + 1
    linears = dict(wrapped.named_modules())
    for name, conv in convs.items():
        assert conv.kernel_size == (1, 1) and conv.groups == 1, name
        linear = linears["model.qa_outputs" if name == "qa_outputs" else
                         "model.distilbert.transformer.layer." + name.removeprefix("layers.")]
        assert torch.equal(conv.weight, linear.weight[:, :, None, None]) and torch.equal(conv.bias, linear.bias)
    # (B, C, 1, S) from the embeddings on
    shapes = {}

    def record(name):
        def hook(module, inputs, output):
            shapes[name] = tuple(output.shape)
        return hook

    hooks = [module.register_forward_hook(record(name))
             for name, module in (("embeddings", twin.embeddings), ("layer", twin.layers[0]),
                                  ("ffn", twin.layers[0].ffn.lin1), ("norm", twin.layers[-1].output_layer_norm))]
    ids = torch.ones(3, 64, dtype=torch.int32)
    run(twin, ids, ids)
    for hook in hooks:
        hook.remove()
    assert shapes == {"embeddings": (3, config.dim, 1, 64), "layer": (3, config.dim, 1, 64),
                      "ffn": (3, config.hidden_dim, 1, 64), "norm": (3, config.dim, 1, 64)}


def test_the_package_holds_convolutions_and_the_enumerated_lengths(built):
    import coremltools as ct

    cfg, path = built["cfg"], built["path"]
    info = coreml.read_package(path)
    coreml.check_package(info, "fp16", cfg.export.coreml, 0, path.name)
    assert [sorted(shape[1] for shape in model_input["enumerated_shapes"]) for model_input in info["inputs"]] == \
        [[64, 128]] * 2
    # The MIL program's ops, read from the spec as read_package reads them
    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    function = spec.mlProgram.functions["main"]
    ops = Counter(op.type for op in function.block_specializations[function.opset].operations)
    n_layers = coreml.load_wrapped(built["student"], True).n_layers
    # 6 projections per layer and the QA head, and each layer norm's scale and shift (2 per layer, the embeddings')
    assert ops["conv"] == 6 * n_layers + 1 + 2 * n_layers + 1
    assert ops["layer_norm"] == 2 * n_layers + 1  # the channel-axis normalization fused into one op each
    assert ops["einsum"] == 2 * 2 * n_layers  # scores and weighted values, per head (2 heads)
    assert "linear" not in ops and "matmul" not in ops
    assert ops["transpose"] == 1 + n_layers  # the embeddings to (B, C, 1, S), and each layer's keys


def test_the_packages_weights_read_back_into_the_twin(built):
    wrapped = coreml.load_wrapped(built["student"], built["mask_input"])
    twin = neural_engine_twin(wrapped)
    stand_in, record = coreml.stand_in_from_package(neural_engine_twin(wrapped), built["path"])
    parameters = dict(twin.named_parameters())
    assert record["parameters"] == record["loaded"] == record["tensors"] == len(parameters)
    # every tensor read by its own name: none shared, none taken as an identity the converter dropped
    assert record["decompressed"] == {} and record["shared"] == {}
    for name, parameter in stand_in.named_parameters():
        assert torch.equal(parameter, parameters[name].half().float()), name
    # the stand-in runs at float16 as the package does: what the twin computes at float16, and the standard
    # wrapper's float32 logits to float16 rounding
    for ids, mask in padded_batches(wrapped.model.config.vocab_size, wrapped.pad_token_id):
        standard = run(wrapped, ids, mask)
        for expected, found, full in zip(run(twin.half(), ids, mask), run(stand_in.half(), ids, mask), standard):
            assert found.dtype == torch.float16 and torch.isfinite(found).all()
            torch.testing.assert_close(found.float(), expected.float(), atol=1e-2, rtol=1e-2)
            torch.testing.assert_close(found.float(), full, atol=1e-2, rtol=1e-2)
    # the twin's weights are its own: halving it left the standard wrapper in float32
    assert all(parameter.dtype == torch.float32 for parameter in wrapped.parameters())


def test_the_dev_gate_scores_the_twins_package(built):
    questions, features, cfg = built["questions"], built["features"], built["cfg"]
    twin = neural_engine_twin(coreml.load_wrapped(built["student"], built["mask_input"]))
    report = coreml.package_dev_report(built["path"], twin, questions, features, cfg, "ane.mlpackage")
    assert report["passed"] is True and report["executed"] == coreml.EXECUTED
    assert report["read_back"]["loaded"] == report["read_back"]["parameters"] == len(list(twin.parameters()))


def test_a_model_with_token_types_is_refused_naming_its_type():
    from transformers import BertForQuestionAnswering

    wrapped = coreml.CoreMLQuestionAnswering(BertForQuestionAnswering(tiny_bert_config()).eval(), 0, 3, True)
    with pytest.raises(ValueError, match="DistilBERT.*'bert'"):
        neural_engine_twin(wrapped)


def test_export_coreml_leaves_the_layout_out_for_a_bert_saying_why():
    assert coreml.variants_for("distilbert", ["4bit", "ane"]) == (["4bit", "ane"], {})
    variants, not_built = coreml.variants_for("bert", ["4bit", "ane"])
    assert variants == ["4bit"] and not_built == {"ane": "the Neural Engine layout is built for DistilBERT; this "
                                                         "model is bert"}
