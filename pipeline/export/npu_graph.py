"""Android NPU graphs: a QA model as static int8 (QDQ) ONNX graphs with fixed shapes, one file per sequence
length, in the operator set Qualcomm's QNN execution provider runs on the Hexagon NPU (HTP) and Android's NNAPI
takes; their dev gate on this machine's CPU execution provider; and the NPU's own arithmetic, through the QNN HTP
backend's x86 emulation (onnxruntime-qnn) where that package is installed.

Why not the bundle's other int8 graphs: a dynamic int8 graph (DynamicQuantizeLinear + MatMulInteger) and dynamic
shapes are what NNAPI and the QNN execution provider refuse: they run such a graph on the phone's CPU. The NPU
needs activation scales fixed in advance (calibrated here on tuning questions, never gated ones) and shapes fixed
when the graph is compiled, so an app keeps one graph per length and pads a window to the shortest that holds it.

Padding a window and a fixed activation scale do not mix with BERT's additive attention mask: the masked scores
(-10^4 or -3.4·10^38) would set the score tensor's int8 range, and every real score would round to the same
step. The graph built here therefore masks after the softmax: the probabilities of padded keys are multiplied by
zero and the rest renormalized, which is the same function in exact arithmetic and keeps every activation within
the range its calibration saw.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from pipeline.export.coreml import MASKED_SCORE, CoreMLQuestionAnswering
from pipeline.runtime import answering

NPU_FOLDER = "android-npu"
INPUTS = ("input_ids", "attention_mask")  # int32 [1, length]: token types are derived inside, as in CoreML
OPSET = 17


def graph_file(length: int) -> str:
    return f"model.L{length}.onnx"


# ------------------------------------------------------------------------------------- the graph's arithmetic


class MaskAfterSoftmax(torch.nn.Module):
    """Self-attention with the padding mask applied after the softmax (module docstring: why): softmax over every
    key, padded keys' probabilities zeroed, the rest renormalized to sum to one."""

    def __init__(self, query: torch.nn.Linear, key: torch.nn.Linear, value: torch.nn.Linear, n_heads: int,
                 output: torch.nn.Linear | None = None):
        super().__init__()
        self.query, self.key, self.value, self.output, self.n_heads = query, key, value, output, n_heads

    def attend(self, hidden: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape
        head = width // self.n_heads

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, length, self.n_heads, head).transpose(1, 2)

        query = heads(self.query(hidden)) / math.sqrt(head)
        probabilities = torch.softmax(query @ heads(self.key(hidden)).transpose(2, 3), dim=-1)
        keep = (additive_mask > MASKED_SCORE / 2).to(probabilities.dtype)  # [batch, 1, 1, keys]: 1 on real tokens
        probabilities = probabilities * keep
        probabilities = probabilities / probabilities.sum(dim=-1, keepdim=True)
        context = (probabilities @ heads(self.value(hidden))).transpose(1, 2).reshape(batch, length, width)
        return context if self.output is None else self.output(context)


class DistilBertNpuAttention(MaskAfterSoftmax):
    """In place of DistilBERT's MultiHeadSelfAttention (same call, same weights)."""

    def forward(self, query, key=None, value=None, mask=None, head_mask=None, output_attentions=False):
        return (self.attend(query, mask),)


class BertNpuSelfAttention(MaskAfterSoftmax):
    """In place of BERT's self-attention (same call, same weights; the output projection stays BERT's)."""

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        return (self.attend(hidden_states, attention_mask), None)


def npu_form(wrapped: CoreMLQuestionAnswering) -> CoreMLQuestionAnswering:
    """`wrapped` (the CoreML wrapper: token types and the additive mask built inside) with every self-attention
    masking after its softmax; the weights are the same tensors. DistilBERT and BERT; another type is refused."""
    encoder = getattr(wrapped.model, wrapped.model.base_model_prefix)
    if wrapped.model_type == "distilbert":
        for layer in encoder.transformer.layer:
            old = layer.attention
            layer.attention = DistilBertNpuAttention(old.q_lin, old.k_lin, old.v_lin, old.n_heads, old.out_lin)
    elif wrapped.model_type == "bert":
        for layer in encoder.encoder.layer:
            old = layer.attention.self
            layer.attention.self = BertNpuSelfAttention(old.query, old.key, old.value, old.num_attention_heads)
    else:
        raise ValueError(f"the Android NPU graph is built for DistilBERT and BERT, not {wrapped.model_type!r}")
    if not wrapped.mask_input:
        raise ValueError("the Android NPU graph takes attention_mask as an input: load the wrapper with mask_input")
    return wrapped.eval()


def export_fixed(model: CoreMLQuestionAnswering, length: int, path: Path) -> None:
    """The float graph of `model` (npu_form) with inputs fixed at [1, length], int32."""
    example = (torch.ones(1, length, dtype=torch.int32), torch.ones(1, length, dtype=torch.int32))
    with torch.no_grad():
        torch.onnx.export(model, example, str(path), input_names=list(INPUTS),
                          output_names=["start_logits", "end_logits"], opset_version=OPSET, dynamo=False)


class PaddedFeeds:
    """onnxruntime's CalibrationDataReader over windows padded to one length (the way an app feeds the graph)."""

    def __init__(self, windows: answering.Windows, length: int, count: int):
        rows = [row for row in range(len(windows)) if windows.attention_mask[row].sum() <= length][:count]
        self._feeds = iter([padded_feed(windows, row, length) for row in rows])

    def get_next(self):
        return next(self._feeds, None)


def padded_feed(windows: answering.Windows, row: int, length: int) -> dict[str, np.ndarray]:
    return {"input_ids": windows.input_ids[row:row + 1, :length].astype(np.int32),
            "attention_mask": windows.attention_mask[row:row + 1, :length].astype(np.int32)}


def quantize_for_qnn(float_path: Path, target: Path, calibration: PaddedFeeds) -> None:
    """Static int8 of a fixed-shape float graph with onnxruntime's QNN recipe: its preprocessing (LayerNorm
    fused), uint8 activations with MinMax scales from `calibration`, uint8 weights, QDQ pairs where QNN wants them."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    prepared = target.with_suffix(".prepared.onnx")
    source = prepared if qnn_preprocess_model(str(float_path), str(prepared), fuse_layernorm=True) else float_path
    config = get_qnn_qdq_config(str(source), calibration, activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QUInt8)
    quantize(str(source), str(target), config)
    prepared.unlink(missing_ok=True)


def export_float_graphs(wrapped: CoreMLQuestionAnswering, lengths: list[int], scratch: Path) -> dict[int, Path]:
    """The float graph of `wrapped` in its NPU form (npu_form) at each length, in scratch."""
    model = npu_form(wrapped)
    graphs = {}
    for length in sorted(lengths):
        graphs[length] = scratch / f"float.L{length}.onnx"
        export_fixed(model, length, graphs[length])
    return graphs


def quantize_graphs(float_graphs: dict[int, Path], calibration_windows: answering.Windows, calibration_count: int,
                    out_dir: Path) -> dict[int, Path]:
    """One static int8 graph per length in out_dir (graph_file), each calibrated on up to calibration_count tuning
    windows that fit it, padded to it."""
    graphs = {}
    for length, float_path in float_graphs.items():
        graphs[length] = out_dir / graph_file(length)
        quantize_for_qnn(float_path, graphs[length], PaddedFeeds(calibration_windows, length, calibration_count))
    return graphs


# ------------------------------------------------------------------------------------------ what the graph is


def graph_record(path: Path) -> dict:
    """Inputs with their fixed shapes, op counts, and NNAPI's partitioning of the graph (onnxruntime's mobile
    usability checker: the nodes NNAPI takes and into how many partitions they fall)."""
    from onnxruntime.tools.mobile_helpers.usability_checker import check_nnapi_partitions

    model = onnx.load(str(path))
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    inputs = {i.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim]
              for i in model.graph.input}
    nnapi = check_nnapi_partitions(model, require_fixed_input_sizes=True)
    return {"file": path.name, "bytes": path.stat().st_size, "inputs": inputs,
            "dynamic_ops": sorted(set(ops) & {"DynamicQuantizeLinear", "MatMulInteger", "QAttention"}),
            "ops": dict(sorted(ops.items(), key=lambda item: -item[1])),
            "nnapi": {"nodes": nnapi.num_nodes, "supported_nodes": nnapi.num_supported_nodes,
                      "partitions": nnapi.num_partitions,
                      "unsupported_ops": sorted(nnapi.unsupported_ops)}}


# ------------------------------------------------------------------------------------------ running the graphs


class FixedLengthGraphs:
    """The per-length graphs as an app runs them: each window, alone, padded to the shortest length that holds it."""

    def __init__(self, sessions: dict[int, object]):
        self.sessions = dict(sorted(sessions.items()))

    def length_for(self, real_length: int) -> int:
        for length in self.sessions:
            if real_length <= length:
                return length
        raise ValueError(f"a window of {real_length} tokens is longer than the longest graph "
                         f"({max(self.sessions)} tokens)")

    def window_logits(self, windows: answering.Windows, rows: list[int] | None = None,
                      timings: list[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Start and end logits [windows, max_seq_length] (-1e4 past each window's real length, as
        answering.window_logits); `rows`: only these windows (the others stay -1e4)."""
        starts = np.full(windows.input_ids.shape, -1e4, dtype=np.float32)
        ends = np.full(windows.input_ids.shape, -1e4, dtype=np.float32)
        for row in range(len(windows)) if rows is None else rows:
            real = int(windows.attention_mask[row].sum())
            length = self.length_for(real)
            began = time.perf_counter()
            start, end = self.sessions[length].run(None, padded_feed(windows, row, length))
            if timings is not None:
                timings.append(time.perf_counter() - began)
            starts[row, :real], ends[row, :real] = start[0, :real], end[0, :real]
        return starts, ends


def cpu_sessions(graphs: dict[int, Path], threads: int = 1) -> FixedLengthGraphs:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    return FixedLengthGraphs({length: onnxruntime.InferenceSession(str(path), options,
                                                                   providers=["CPUExecutionProvider"])
                              for length, path in graphs.items()})


class QnnUnavailable(RuntimeError):
    """The QNN HTP emulation cannot run here; the message says why."""


def qnn_htp_sessions(graphs: dict[int, Path], htp_arch: str, soc_model: str) -> FixedLengthGraphs:
    """The graphs on the QNN execution provider's HTP backend (the Hexagon NPU, emulated on x86 by
    onnxruntime-qnn's libQnnHtp), with the CPU fallback off: a session opens only if QNN takes every node, so an
    open session is also the check of the graph's operators. Raises QnnUnavailable saying why it cannot run."""
    import onnxruntime

    try:
        import onnxruntime_qnn
    except ImportError as error:
        raise QnnUnavailable(f"onnxruntime-qnn is not installed ({error}); it has wheels for Linux x86-64 and "
                             f"Windows ARM64") from None
    try:
        if not any(device.ep_name == onnxruntime_qnn.EP_NAME for device in onnxruntime.get_ep_devices()):
            onnxruntime.register_execution_provider_library(onnxruntime_qnn.EP_NAME,
                                                            onnxruntime_qnn.get_library_path())
        devices = [device for device in onnxruntime.get_ep_devices() if device.ep_name == onnxruntime_qnn.EP_NAME]
        if not devices:
            raise QnnUnavailable(f"onnxruntime-qnn {onnxruntime_qnn.__version__} registered no device here")
        sessions = {}
        for length, path in graphs.items():
            options = onnxruntime.SessionOptions()
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            options.add_provider_for_devices(devices[:1], {"backend_path": onnxruntime_qnn.get_qnn_htp_path(),
                                                           "htp_arch": htp_arch, "soc_model": soc_model})
            sessions[length] = onnxruntime.InferenceSession(str(path), options)
    except QnnUnavailable:
        raise
    except Exception as error:  # whatever the provider raises: a refused node, a backend that does not load
        raise QnnUnavailable(f"the QNN HTP backend refused the graph: {type(error).__name__}: "
                             f"{str(error).strip().splitlines()[0][:300]}") from error
    return FixedLengthGraphs(sessions)


def qnn_version() -> str | None:
    try:
        import onnxruntime_qnn
    except ImportError:
        return None
    return onnxruntime_qnn.__version__


@dataclass
class Answers:
    """A runner's logits and answers on some windows."""

    start: np.ndarray
    end: np.ndarray
    predictions: dict[str, str]


def answers(graphs: FixedLengthGraphs, examples: list[dict[str, str]], windows: answering.Windows, cfg,
            timings: list[float] | None = None) -> Answers:
    """Answers of the graphs to `examples` (windows: exactly their windows), as the app computes them."""
    from pipeline.runtime import squad

    start, end = graphs.window_logits(windows, timings=timings)
    candidates = squad.n_best_predictions(
        {"id": [e["id"] for e in examples], "context": [e["context"] for e in examples]},
        {"example_id": windows.example_ids, "offset_mapping": windows.context_offsets},
        start, end, n_best_size=cfg.squad.n_best_size, max_answer_length=cfg.squad.max_answer_length)
    return Answers(start, end, {qid: (found[0]["text"] if found else "") for qid, found in candidates.items()})


def largest_logit_difference(a: Answers, b: Answers, windows: answering.Windows) -> float:
    """Largest |start or end logit difference| over the windows' real tokens."""
    real = windows.attention_mask.astype(bool)
    return float(max(np.abs(a.start - b.start)[real].max(), np.abs(a.end - b.end)[real].max()))


# ------------------------------------------------------------------------------------- the NPU's own arithmetic


def npu_gate(emulated: dict[str, str], cpu: dict[str, str], gold: dict[str, list[str]], minimum: float | None,
             maximum: float) -> dict:
    """The emulated NPU's answers against the CPU execution provider's, on the same graphs and sample questions:
    answer agreement (Wilson interval) and the F1 the NPU loses (paired bootstrap over the questions). A sample can
    show a difference, not prove its absence, so the gate misses (rejected) only where an interval shows one: the
    agreement's upper end below `minimum` (export.gates.min_answer_agreement; null where a deploy does not gate on
    agreement) or the F1 loss's lower end above `maximum` (export.gates.max_f1_drop). Otherwise both are recorded
    and do not vote."""
    from pipeline.export.gates import REJECTED, RECORDED
    from pipeline.measurement.statistics import paired_bootstrap_interval, per_question_f1, wilson_interval

    sample_gold = {question_id: gold[question_id] for question_id in cpu}
    same = sum(emulated.get(question_id) == answer for question_id, answer in cpu.items())
    low, high = wilson_interval(same, len(cpu))
    losses = per_question_f1(cpu, sample_gold) - per_question_f1(emulated, sample_gold)
    loss_low, loss_high = paired_bootstrap_interval(losses)
    loss = {"f1_drop": round(float(losses.mean()), 3), "f1_drop_interval": [loss_low, loss_high],
            "f1_drop_maximum": maximum}
    agreement = {"value": round(same / len(cpu), 4), "interval": [low, high], "minimum": minimum}
    judged = (f"Wilson 95 % interval of {same}/{len(cpu)} answers equal to the CPU execution provider's, and the "
              f"paired bootstrap 95 % interval of the F1 the NPU loses over those {len(cpu)} questions")
    if minimum is not None and high < minimum:
        return {**agreement, **loss, "verdict": REJECTED, "passed": False, "judged_by": judged}
    if loss_low > maximum:  # judged by the F1 loss: its numbers are the gate's value, interval and bound
        return {"value": loss["f1_drop"], "interval": [loss_low, loss_high], "maximum": maximum,
                "answer_agreement": agreement, "verdict": REJECTED, "passed": False, "judged_by": judged}
    return {**agreement, **loss, "verdict": RECORDED, "passed": None, "judged_by": judged}


def emulator_report(graphs: dict[int, Path], cpu_answers: Answers, examples: list[dict[str, str]],
                    windows: answering.Windows, pytorch_predictions: dict[str, str], gold: dict[str, list[str]],
                    cfg, count: int) -> dict:
    """The first `count` gated questions through the QNN HTP emulation: answers equal to the CPU execution
    provider's and to PyTorch's (Wilson intervals), F1 of both on the sample, the largest logit difference, and
    the emulator's seconds per window (an x86 emulation: not a phone's latency). Says why where it cannot run."""
    from pipeline.measurement.statistics import wilson_interval
    from pipeline.runtime import squad

    npu = cfg.export.npu
    setting = {"backend": "QNN HTP (x86 emulation)", "htp_arch": npu.htp_arch, "soc_model": npu.soc_model,
               "onnxruntime_qnn": qnn_version()}
    if count == 0:
        return {"ran": False, "reason": "export.npu.emulator_questions is 0", **setting}
    try:
        emulated_graphs = qnn_htp_sessions(graphs, npu.htp_arch, npu.soc_model)
    except QnnUnavailable as error:
        return {"ran": False, "reason": str(error), **setting}
    sample_ids = [example["id"] for example in examples[:count]]
    keep = set(sample_ids)
    rows = [row for row in range(len(windows)) if windows.example_ids[row] in keep]
    sample = answering.Windows([windows.example_ids[row] for row in rows], windows.input_ids[rows],
                               windows.attention_mask[rows], windows.token_type_ids[rows],
                               [windows.context_offsets[row] for row in rows])
    seconds: list[float] = []
    emulated = answers(emulated_graphs, examples[:count], sample, cfg, timings=seconds)
    cpu = Answers(cpu_answers.start[rows], cpu_answers.end[rows],
                  {question_id: cpu_answers.predictions[question_id] for question_id in sample_ids})
    same_as_pytorch = sum(emulated.predictions[q] == pytorch_predictions[q] for q in sample_ids)
    sample_gold = {q: gold[q] for q in sample_ids}
    return {"ran": True, **setting, "n_questions": len(sample_ids), "n_windows": len(rows),
            "question_ids": sample_ids,
            "agreement_with_cpu": npu_gate(emulated.predictions, cpu.predictions, gold,
                                           cfg.export.gates.min_answer_agreement, cfg.export.gates.max_f1_drop),
            "agreement_with_pytorch": {"value": round(same_as_pytorch / len(sample_ids), 4),
                                       "interval": list(wilson_interval(same_as_pytorch, len(sample_ids)))},
            "f1": round(squad.squad_v1_scores(sample_gold, emulated.predictions)["f1"], 3),
            "f1_cpu": round(squad.squad_v1_scores(sample_gold, cpu.predictions)["f1"], 3),
            "f1_pytorch": round(squad.squad_v1_scores(sample_gold, {q: pytorch_predictions[q] for q in sample_ids})["f1"], 3),
            "max_abs_logit_diff_vs_cpu": round(largest_logit_difference(emulated, cpu, sample), 5),
            "emulator_seconds_per_window": round(float(np.median(seconds)), 4),
            "note": "seconds in the x86 emulation of the HTP: not a phone's latency"}


def emulator_agreement(gate: dict) -> dict:
    """The answer agreement of an npu gate ({value, interval, minimum}), whichever measure judged it."""
    return gate.get("answer_agreement") or gate
