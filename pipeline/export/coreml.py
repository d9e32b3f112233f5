"""CoreML mlprogram packages of a QA model: the fp16-safe wrapper, weight compression on the PyTorch side
(coremltools.optimize.torch), conversion, the package read back as a spec and checked, and its dev gate on Linux
(CoreML prediction runs only on macOS): the package's own weights read back out of it, decompressed, and run in
the PyTorch model they were converted from, at float16 (Float16Products).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from pipeline.export.gates import REJECTED, GateError, GateQuestions, compressed_model_report
from pipeline.outputs.artifacts import directory_size_bytes
from pipeline.plan.config import ConfigError, CoreMLConfig, PipelineConfig
from pipeline.plan.model_types import model_type_of
from pipeline.runtime import squad

# Added to masked attention scores. torch.finfo(float32).min overflows to -inf in float16 and can turn a softmax
# into NaN; -1e4 is finite in float16 and still gives masked keys a weight of exp(-1e4) = 0.
MASKED_SCORE = -1.0e4
SPEC_VERSION_TARGET = {7: "iOS16", 8: "iOS17", 9: "iOS18"}
# MIL ops that hold compressed weights, per variant (int8 is blockwise from iOS18, affine before).
COMPRESSED_WEIGHT_OPS = {"int8": ("constexpr_blockwise_shift_scale", "constexpr_affine_dequantize"),
                         "4bit": ("constexpr_lut_to_dense",)}
# Variants whose weights stay float16: nothing to compress, nothing for the fallback to tune. ane: the standard
# weights in the Neural Engine layout (pipeline/export/neural_engine.py), for DistilBERT.
FLOAT_VARIANTS = ("fp16", "ane")
NEURAL_ENGINE_TYPES = ("distilbert",)
# What a package's dev gate runs (coreml.json's dev.executed): CoreML itself runs only on macOS.
EXECUTED = "weights read from the package, run in PyTorch at float16"
# The converter names a weight by its traced module path with "_" for "." and a suffix: "_to_fp16" where it cast a
# float32 const, "_cast_fp16" where a constexpr op decompresses it.
CONVERTER_SUFFIXES = ("_to_fp16", "_cast_fp16")


class CoreMLQuestionAnswering(torch.nn.Module):
    """A QA model of an exportable type (pipeline/plan/model_types.py: BERT, DistilBERT, ELECTRA, MobileBERT)
    with the inputs a CoreML package takes and an explicit, fp16-safe mask."""

    def __init__(self, model: torch.nn.Module, pad_token_id: int, sep_token_id: int, mask_input: bool):
        super().__init__()
        self.model, self.mask_input = model, mask_input
        self.pad_token_id, self.sep_token_id = pad_token_id, sep_token_id
        self.model_type = model.config.model_type
        self.token_types = model_type_of(self.model_type, type(model).__name__).token_types
        self.n_layers = model.config.num_hidden_layers

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        if not self.mask_input:
            attention_mask = (input_ids != self.pad_token_id).to(torch.int32)
        encoder_model = getattr(self.model, self.model.base_model_prefix)  # .bert, .distilbert, .electra, .mobilebert
        if self.token_types:
            is_sep = (input_ids == self.sep_token_id).to(torch.int32)
            token_type_ids = ((torch.cumsum(is_sep, dim=1) - is_sep) > 0).to(torch.int32)  # after the first [SEP]
            hidden = encoder_model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        else:
            hidden = encoder_model.embeddings(input_ids)
        if hasattr(encoder_model, "embeddings_project"):  # ELECTRA with embeddings narrower than its layers
            hidden = encoder_model.embeddings_project(hidden)
        additive_mask = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * MASKED_SCORE
        if self.model_type == "distilbert":
            hidden = encoder_model.transformer(x=hidden, attn_mask=additive_mask, head_mask=[None] * self.n_layers,
                                               return_dict=False)[0]
        else:  # MobileBERT's encoder indexes head_mask by layer; the others take the list too
            hidden = encoder_model.encoder(hidden, attention_mask=additive_mask, head_mask=[None] * self.n_layers,
                                           return_dict=False)[0]
        start_logits, end_logits = self.model.qa_outputs(hidden).split(1, dim=-1)
        return start_logits.squeeze(-1), end_logits.squeeze(-1)


def load_wrapped(model_dir: Path, mask_input: bool) -> CoreMLQuestionAnswering:
    from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

    # sdpa attention takes the additive float mask as it is (the eager DistilBERT path would rebuild it); ELECTRA
    # and MobileBERT have only the eager attention, which adds the mask as it is.
    model_type = model_type_of(AutoConfig.from_pretrained(model_dir).model_type, f"{model_dir}/config.json")
    model = AutoModelForQuestionAnswering.from_pretrained(
        model_dir, attn_implementation="sdpa" if model_type.sdpa else "eager").eval()
    if (model_dir / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        pad_token_id, sep_token_id = tokenizer.pad_token_id, tokenizer.sep_token_id
    else:  # a bare architecture (a full-size architecture): ids from its config; DistilBERT needs no [SEP] id
        pad_token_id, sep_token_id = model.config.pad_token_id, getattr(model.config, "sep_token_id", None) or -1
    return CoreMLQuestionAnswering(model, pad_token_id, sep_token_id, mask_input).eval()


def compress(wrapped: torch.nn.Module, variant: str, cfg: CoreMLConfig, keep_float: tuple[str, ...] = (),
             only: str | None = None) -> torch.nn.Module:
    """The PyTorch-side compressed copy (weights quantized and dequantized, with metadata coremltools converts).
    `keep_float`: modules (names in `wrapped`) left uncompressed, the fallback; `only`: compress just this module
    (a layer's sensitivity)."""
    if variant == "fp16":
        return wrapped
    if variant == "int8":
        from coremltools.optimize.torch.quantization import PostTrainingQuantizer, PostTrainingQuantizerConfig

        class QuantizerWithEmbeddings(PostTrainingQuantizer):
            # coremltools' post-training quantizer covers Linear but not Embedding, and the word embeddings are a
            # third of DistilBERT's weights; the same per-row symmetric int8 applies to them.
            _supported_modules = PostTrainingQuantizer._supported_modules + (torch.nn.Embedding,)

        layer = {"weight_dtype": "int8", "granularity": "per_channel", "quantization_scheme": "symmetric"}
        config = PostTrainingQuantizerConfig.from_dict(module_configs(layer, {}, keep_float, only))
        return QuantizerWithEmbeddings(wrapped, config).compress()
    if variant == "4bit":
        from coremltools.optimize.torch.palettization import PostTrainingPalettizer, PostTrainingPalettizerConfig

        layer = {"n_bits": 4, "granularity": cfg.palettization_granularity}
        if cfg.palettization_granularity == "per_grouped_channel":
            layer["group_size"] = cfg.palettization_group_size
        by_type = {} if cfg.palettize_embeddings else {"Embedding": None}
        config = PostTrainingPalettizerConfig.from_dict(module_configs(layer, by_type, keep_float, only))
        return PostTrainingPalettizer(wrapped, config).compress()
    raise ValueError(f"unknown CoreML variant {variant!r}")


def module_configs(layer: dict, by_type: dict, keep_float: tuple[str, ...], only: str | None) -> dict:
    """coremltools.optimize.torch's config dict: every module compressed (by type, minus `keep_float`), or `only`."""
    if only is not None:
        return {"global_config": None, "module_name_configs": {only: layer}}
    config: dict = {"global_config": layer, "module_name_configs": {name: None for name in keep_float}}
    if by_type:
        config["module_type_configs"] = by_type
    return config


def variants_for(model_type: str, variants: list[str]) -> tuple[list[str], dict[str, str]]:
    """The variants built for a model type, and those left out with why (the Neural Engine layout is DistilBERT's)."""
    if model_type in NEURAL_ENGINE_TYPES or "ane" not in variants:
        return list(variants), {}
    return ([variant for variant in variants if variant != "ane"],
            {"ane": f"the Neural Engine layout is built for DistilBERT; this model is {model_type}"})


def compressible_layers(wrapped: torch.nn.Module, variant: str, cfg: CoreMLConfig) -> list[str]:
    """Names of the modules a variant compresses (Linear layers, and Embedding tables where it compresses them)."""
    with_embeddings = variant == "int8" or cfg.palettize_embeddings
    kinds = (torch.nn.Linear, torch.nn.Embedding) if with_embeddings else (torch.nn.Linear,)
    return [name for name, module in wrapped.named_modules() if isinstance(module, kinds)]


def convert(wrapped: torch.nn.Module, cfg: CoreMLConfig, out_path: Path) -> None:
    import coremltools as ct

    lengths = sorted(cfg.sequence_lengths)
    example = torch.ones(1, lengths[0], dtype=torch.int32)
    mask_input = cfg.minimum_deployment_target == "iOS18"
    with torch.no_grad():
        traced = torch.jit.trace(wrapped, (example, example) if mask_input else (example,))
    shapes = ct.EnumeratedShapes(shapes=[[1, length] for length in lengths], default=[1, lengths[0]])
    inputs = [ct.TensorType("input_ids", shape=shapes, dtype=np.int32)]
    if mask_input:
        inputs.append(ct.TensorType("attention_mask", shape=shapes, dtype=np.int32))
    mlmodel = ct.convert(
        traced, inputs=inputs,
        outputs=[ct.TensorType("start_logits", dtype=np.float32), ct.TensorType("end_logits", dtype=np.float32)],
        convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, cfg.minimum_deployment_target),
        compute_precision=ct.precision.FLOAT16,
    )
    mlmodel.short_description = "Extractive question answering: start and end logits per token."
    mlmodel.save(str(out_path))


def read_package(path: Path) -> dict:
    """What an app developer needs to know about a package, read from its spec (works on Linux)."""
    import coremltools as ct

    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    function = spec.mlProgram.functions["main"]
    operations = function.block_specializations[function.opset].operations
    ops: dict[str, int] = {}
    for operation in operations:
        ops[operation.type] = ops.get(operation.type, 0) + 1

    def describe(feature) -> dict:
        array = feature.type.multiArrayType
        dtype = {65568: "float32", 65552: "float16", 131104: "int32"}.get(array.dataType, str(array.dataType))
        shapes = [list(shape.shape) for shape in array.enumeratedShapes.shapes]
        return {"name": feature.name, "dtype": dtype, "enumerated_shapes": shapes}

    return {
        "inputs": [describe(feature) for feature in spec.description.input],
        "outputs": [describe(feature) for feature in spec.description.output],
        "specification_version": spec.specificationVersion,
        "deployment_target": SPEC_VERSION_TARGET.get(spec.specificationVersion, f"spec {spec.specificationVersion}"),
        "compressed_weight_ops": {op: n for op, n in ops.items() if op.startswith("constexpr_")},
        "weights_bytes": directory_size_bytes(path / "Data" / "com.apple.CoreML" / "weights"),
    }


def check_package(info: dict, variant: str, cfg: CoreMLConfig, n_weight_matrices: int, where: str) -> None:
    """The package has the interface and weight storage it was built for; raise GateError otherwise."""
    expected_inputs = ["input_ids", "attention_mask"] if cfg.minimum_deployment_target == "iOS18" else ["input_ids"]
    lengths = sorted(cfg.sequence_lengths)
    problems = []
    if [i["name"] for i in info["inputs"]] != expected_inputs:
        problems.append(f"inputs {[i['name'] for i in info['inputs']]}, expected {expected_inputs}")
    for model_input in info["inputs"]:
        if model_input["dtype"] != "int32" or sorted(s[1] for s in model_input["enumerated_shapes"]) != lengths:
            problems.append(f"input {model_input['name']}: {model_input['dtype']} {model_input['enumerated_shapes']}")
    if [(o["name"], o["dtype"]) for o in info["outputs"]] != [("start_logits", "float32"), ("end_logits", "float32")]:
        problems.append(f"outputs {info['outputs']}")
    if info["deployment_target"] != cfg.minimum_deployment_target:
        problems.append(f"deployment target {info['deployment_target']}")
    if variant in COMPRESSED_WEIGHT_OPS:
        compressed = sum(info["compressed_weight_ops"].get(op, 0) for op in COMPRESSED_WEIGHT_OPS[variant])
        if compressed < n_weight_matrices:
            problems.append(f"{compressed} compressed weight tensors, expected at least {n_weight_matrices} "
                            f"({' / '.join(COMPRESSED_WEIGHT_OPS[variant])})")
    if problems:
        raise GateError(f"{where}: the package is not what was asked for: " + "; ".join(problems))


# The products of the exportable models: linear layers, the Neural Engine layout's 1x1 convolutions and einsums,
# attention (fused, or matmuls in the eager models).
PRODUCTS = frozenset({torch.nn.functional.linear, torch.conv2d, torch.matmul, torch.Tensor.matmul,
                      torch.Tensor.__matmul__, torch.bmm, torch.einsum,
                      torch.nn.functional.scaled_dot_product_attention})


def _cast(value, source: torch.dtype, target: torch.dtype):
    """`value` with every `source` tensor in it (alone, or in a list, tuple or dict) cast to `target`."""
    if isinstance(value, torch.Tensor):
        return value.to(target) if value.dtype == source else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(item, source, target) for item in value)
    if isinstance(value, dict):
        return {key: _cast(item, source, target) for key, item in value.items()}
    return value


def _holds_float16(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.float16
    if isinstance(value, (list, tuple)):
        return any(_holds_float16(item) for item in value)
    if isinstance(value, dict):
        return any(_holds_float16(item) for item in value.values())
    return False


class Float16Products(TorchFunctionMode):
    """float16 arithmetic as torch's CPU float16 kernels compute it, with its float32 kernels doing the products:
    every tensor stays float16; a product (PRODUCTS) takes its float16 operands, accumulates in float32 and rounds its
    result to float16, as those kernels do. Where a CPU has no float16 arithmetic (AVX2, AVX-512 without FP16), torch's
    own float16 products take a slow path: 11x a float32 linear layer on an AMD EPYC with AVX2 only. Results agree
    with them to a few float16 steps (the order of the float32 sums differs): docs/findings.md."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in PRODUCTS and _holds_float16((args, kwargs)):
            result = func(*_cast(args, torch.float16, torch.float32), **_cast(kwargs, torch.float16, torch.float32))
            return _cast(result, torch.float32, torch.float16)
        return func(*args, **kwargs)


@torch.no_grad()
def proxy_logits(wrapped: torch.nn.Module, features, cfg: PipelineConfig,
                 half: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits of the PyTorch-side proxy on the windows `features` (qa_windows.validation_windows), computed
    in float16 like the package (Float16Products; half=False: float32, for the fallback's many quick comparisons)."""
    model = wrapped.half() if half else wrapped
    columns = features.with_format("numpy")
    ids = np.asarray(squad.whole_column(columns, "input_ids"))
    mask = np.asarray(squad.whole_column(columns, "attention_mask"))
    starts = np.full(ids.shape, -1e4, dtype=np.float32)
    ends = np.full(ids.shape, -1e4, dtype=np.float32)
    with Float16Products() if half else contextlib.nullcontext():
        for rows, length in squad.batches_by_length(mask.sum(axis=1), cfg.squad.eval_batch_size):
            input_ids = torch.from_numpy(ids[rows, :length]).to(torch.int32)
            attention_mask = torch.from_numpy(mask[rows, :length]).to(torch.int32)
            start, end = model(input_ids, attention_mask) if model.mask_input else model(input_ids)
            starts[rows, :length], ends[rows, :length] = start.float().numpy(), end.float().numpy()
    model.float()
    return starts, ends


def proxy_predictions(wrapped: torch.nn.Module, dev, features, cfg: PipelineConfig,
                      half: bool = True) -> dict[str, str]:
    """Dev answers of the PyTorch-side proxy (float16 like the package, unless half=False) on dev's windows
    `features` (qa_windows.validation_windows)."""
    starts, ends = proxy_logits(wrapped, features, cfg, half)
    return squad.postprocess_predictions(dev, features, starts, ends, n_best_size=cfg.squad.n_best_size,
                                         max_answer_length=cfg.squad.max_answer_length)


def check_lengths(cfg: CoreMLConfig, max_positions: int, where: str) -> None:
    too_long = [length for length in cfg.sequence_lengths if length > max_positions]
    if too_long:
        raise ConfigError(f"export.coreml.sequence_lengths: {too_long} exceed {where}'s max_position_embeddings "
                          f"{max_positions}")


def weight_matrix_count(model: torch.nn.Module, variant: str, cfg: CoreMLConfig, kept_float: int = 0) -> int:
    """How many weight tensors the variant compresses (Linear layers, and Embedding tables unless left out), less
    the ones the fallback kept in float."""
    with_embeddings = variant == "int8" or cfg.palettize_embeddings
    kinds = (torch.nn.Linear, torch.nn.Embedding) if with_embeddings else (torch.nn.Linear,)
    return sum(isinstance(module, kinds) for module in model.modules()) - kept_float


@dataclass(frozen=True)
class PackageWeight:
    """One weight tensor of a package, as the device computes it (decompressed), in float32."""

    value: np.ndarray
    stored_as: str  # "const", or the constexpr op that decompresses it on the device
    readers: int  # ops that read it: more than one where the converter stored equal tensors once


class UnreadWeights(GateError):
    """A package whose weights could not all be read back into the model it was converted from."""

    def __init__(self, message: str, read: int, parameters: int):
        super().__init__(message)
        self.read, self.parameters = read, parameters


def package_weights(path: Path) -> dict[str, PackageWeight]:
    """Every float weight tensor of a package, read from its spec and weight file without running it (works on
    Linux); palettized and quantized ones decompressed by coremltools' own op definitions. Keyed by the converter's
    name less its suffix: the traced parameter path with "_" for "." ("model_qa_outputs_weight")."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as load_mil_program

    mlmodel = ct.models.MLModel(str(path), skip_model_load=True)
    spec = mlmodel.get_spec()
    program = load_mil_program(spec, spec.specificationVersion, mlmodel.weights_dir)
    weights: dict[str, PackageWeight] = {}
    for op in program.functions["main"].operations:
        compressed = op.op_type.startswith("constexpr_")
        if op.op_type != "const" and not compressed:
            continue
        readers = op.outputs[0].child_ops
        if readers and all(reader.op_type.startswith("constexpr_") for reader in readers):
            continue  # a compressed tensor's parts (indices, table, scales): read through the op decompressing them
        value = np.asarray(op.materialized_val_inference() if compressed else op.val.val)
        if value.ndim == 0 or not np.issubdtype(value.dtype, np.floating):
            continue  # scalars (epsilons, the mask's score) and integer constants (shapes, position ids)
        name = next((op.name[:-len(suffix)] for suffix in CONVERTER_SUFFIXES if op.name.endswith(suffix)), op.name)
        if name in weights:
            raise ValueError(f"two weight tensors named {name!r}")
        weights[name] = PackageWeight(value.astype(np.float32), op.op_type, len(readers))
    return weights


def parameters_from_package(model: torch.nn.Module, weights: dict[str, PackageWeight],
                            where: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Each parameter of `model` (the module the package was traced from) with the package's tensor of it, and the
    parameters that read another's tensor; raises UnreadWeights where a parameter has none, or a tensor of the
    package no parameter (the stand-in would not compute what the package does)."""
    parameters = dict(model.named_parameters())
    stems = {name: name.replace(".", "_") for name in parameters}  # the converter's names of them
    tensors, misshapen = {}, []
    for name, parameter in parameters.items():
        weight = weights.get(stems[name])
        if weight is None:
            continue
        if weight.value.shape == tuple(parameter.shape):
            tensors[name] = weight.value
        else:
            misshapen.append(f"{name} {list(weight.value.shape)} (the model's: {list(parameter.shape)})")
    # The converter stores equal tensors once, under the first one's name (coremltools' const_deduplication, e.g.
    # untrained LayerNorms of 100 or more values): a parameter missing by name reads the tensor of a parameter equal
    # to it, which has one more reader for each.
    shared: dict[str, str] = {}
    for name, parameter in parameters.items():
        if stems[name] in weights:
            continue
        twin = next((other for other in list(tensors) if other not in shared
                     and weights[stems[other]].readers > 1 + list(shared.values()).count(other)
                     and torch.equal(parameters[other], parameter)), None)
        if twin is not None:
            tensors[name], shared[name] = tensors[twin], twin
    problems = []
    if misshapen:
        problems.append(f"{len(misshapen)} tensor(s) of another shape: {', '.join(misshapen[:3])}")
    unread = [name for name in parameters if name not in tensors and stems[name] not in weights]
    if unread:
        problems.append(f"{len(unread)} parameter(s) not in the package: {', '.join(unread[:5])}")
    unknown = sorted(set(weights) - set(stems.values()))
    if unknown:
        problems.append(f"{len(unknown)} tensor(s) of the package no parameter reads: {', '.join(unknown[:5])}")
    if problems:
        raise UnreadWeights(f"{where}: its weights could not be read back into the model it was converted from: "
                            + "; ".join(problems), len(tensors), len(parameters))
    return tensors, shared


def weights_digest(weights: dict[str, PackageWeight]) -> str:
    """sha256 of a package's weights as the device computes them (names, shapes, float32 values)."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        value = np.ascontiguousarray(weights[name].value, dtype="<f4")
        digest.update(f"{name} {list(value.shape)}\n".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


@torch.no_grad()
def stand_in_from_package(model: CoreMLQuestionAnswering, path: Path,
                          where: str | None = None) -> tuple[CoreMLQuestionAnswering, dict]:
    """`model` (the architecture the package was converted from) with every parameter replaced by the package's
    own tensor, and the record of what was read back; raises UnreadWeights saying what could not be."""
    where = where or str(path)
    try:
        weights = package_weights(path)
    except Exception as error:  # whatever coremltools raises on a package it cannot parse: the package fails
        raise UnreadWeights(f"{where}: its weights could not be read: {type(error).__name__}: {error}", 0,
                            sum(1 for _ in model.parameters())) from error
    tensors, shared = parameters_from_package(model, weights, where)
    for name, parameter in model.named_parameters():
        parameter.copy_(torch.from_numpy(tensors[name]))
    decompressed = Counter(weight.stored_as for weight in weights.values() if weight.stored_as != "const")
    return model, {"parameters": len(tensors), "loaded": len(tensors), "tensors": len(weights), "shared": shared,
                   "decompressed": dict(decompressed), "weights_sha256": weights_digest(weights)}


def verify_gated_weights(path: Path, digest: str, where: str | None = None) -> None:
    """The package holds the weights its gate scored (`digest`: coreml.json's dev.read_back.weights_sha256); raise
    GateError otherwise."""
    where = where or str(path)
    try:
        found = weights_digest(package_weights(path))
    except Exception as error:  # whatever coremltools raises on a package it cannot parse
        raise GateError(f"{where}: its weights could not be read: {type(error).__name__}: {error}") from error
    if found != digest:
        raise GateError(f"{where}: its weights are not the ones its gate scored (sha256 {found[:16]}..., gated "
                        f"{digest[:16]}...)")


def package_dev_report(path: Path, model: CoreMLQuestionAnswering, questions: GateQuestions, features,
                       cfg: PipelineConfig, where: str) -> dict:
    """A package's dev gate: its weights read back into `model` (the architecture it was converted from; its weights
    are replaced), dev answered at float16 on `features` (qa_windows.validation_windows of questions.records) and
    judged against the PyTorch model's answers. Rejected, with the reason, where its weights cannot be read back."""
    gates = cfg.export.gates
    try:
        stand_in, read_back = stand_in_from_package(model, path, where)
    except UnreadWeights as error:
        gate = {"value": error.read, "minimum": error.parameters, "verdict": REJECTED, "passed": False,
                "judged_by": str(error)}
        return {"f1_source": None, "precision": None, "executed": "nothing: the package's weights were not read back",
                "read_back": {"parameters": error.parameters, "loaded": error.read, "error": str(error)},
                "exact_match": None, "f1": None, "f1_drop": None, "answer_agreement": None,
                "gates": {"weights_read_back": gate}, "verdict": REJECTED, "passed": False}
    predictions = proxy_predictions(stand_in, questions.records, features, cfg)
    report = compressed_model_report(f"{where} ({EXECUTED})", predictions, questions.pytorch_predictions,
                                     questions.gold, questions.pytorch_f1, gates.min_answer_agreement,
                                     gates.max_f1_drop, gates.strict)
    return {"f1_source": "pytorch-proxy", "precision": "float16", "executed": EXECUTED, "read_back": read_back,
            **{key: report[key] for key in ("exact_match", "f1", "f1_drop", "answer_agreement", "gates", "verdict",
                                            "passed")}}
