"""The int8 paths a user would otherwise pick, built (rule export_peers) so the benchmark can time them beside ours.

- torch-dynamic-int8: PyTorch's dynamic quantization (`torch.ao.quantization.quantize_dynamic` of every Linear
  layer to qint8) on the quantized engine that is fastest on this CPU. It quantizes at load time, its weights
  packed for the engine then set: the build records its size on every engine this torch build supports for this
  CPU (an engine for another CPU architecture, qnnpack on x86, is listed with why: torch_peer.engines_left_out), and
  the benchmark times each engine and keeps the fastest.
- onnx-ortquantizer-int8: optimum's `ORTQuantizer` with the `AutoQuantizationConfig` preset for this CPU
  (avx512_vnni, avx512, avx2 or arm64), dynamic (no calibration data), on optimum's plain fp32 export.
- openvino-nncf-int8: OpenVINO's own path on x86: NNCF's post-training int8 (`nncf.quantize`, transformer model
  type: SmoothQuant, int8 attention products) of the fp32 export, run by the OpenVINO runtime.
- openvino-ours-int8: our static (QDQ) int8 graph, run by the OpenVINO runtime instead of onnxruntime.
The OpenVINO ones are timed at two precisions for what is not int8: f32, and the runtime's default on this CPU
(bf16 where the CPU has AVX512-BF16 or AMX, else f32); the resolved precision is recorded with each timing.
"""

from __future__ import annotations

import io
import logging
import platform
from pathlib import Path

# The torch peer is quantized in the process that times it (a dynamically quantized model is never a file), so its
# recipe lives in the measurement layer
from pipeline.measurement.torch_peer import engines_left_out, torch_dynamic_int8, torch_engines

TORCH_PEER = "torch-dynamic-int8"
ORT_PEER = "onnx-ortquantizer-int8"
ORT_PEER_FILE = "model_quantized.onnx"  # ORTQuantizer's name for its output (file suffix "quantized")
OPENVINO_PEER = "openvino-nncf-int8"
OPENVINO_OURS = "openvino-ours-int8"
OPENVINO_PRECISIONS = ("f32", "default")
BUILT_PEERS = (TORCH_PEER, ORT_PEER, OPENVINO_PEER)  # what export_peers builds; OPENVINO_OURS reads our own graph


def ort_preset(simd_flags: list[str], machine: str | None = None) -> str:
    """The AutoQuantizationConfig preset for this CPU, as optimum's documentation picks it: the widest int8 path
    the CPU has."""
    machine = (machine or platform.machine()).lower()
    if machine in ("aarch64", "arm64"):
        return "arm64"
    if "avx512_vnni" in simd_flags:
        return "avx512_vnni"
    if "avx512f" in simd_flags:
        return "avx512"
    if "avx2" in simd_flags:
        return "avx2"
    raise ValueError(f"no AutoQuantizationConfig preset for this CPU ({machine}, SIMD flags {simd_flags})")


def build_ortquantizer_int8(fp32_onnx_dir: Path, out_dir: Path, preset: str) -> tuple[Path, dict]:
    """optimum's dynamic int8 quantization of fp32_onnx_dir/model.onnx into out_dir; returns the graph's path and the
    quantization settings the preset chose."""
    from optimum.onnxruntime import ORTQuantizer
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    quantization_config = getattr(AutoQuantizationConfig, preset)(is_static=False)
    quantizer = ORTQuantizer.from_pretrained(fp32_onnx_dir, file_name="model.onnx")
    root_logger = logging.getLogger()
    level = root_logger.level
    root_logger.setLevel(logging.WARNING)  # onnxruntime's quantizer logs one INFO line per unquantized tensor
    try:
        quantizer.quantize(quantization_config=quantization_config, save_dir=out_dir)
    finally:
        root_logger.setLevel(level)
    settings = {"preset": preset, "is_static": False, "per_channel": quantization_config.per_channel,
                "reduce_range": quantization_config.reduce_range, "format": quantization_config.format.name,
                "weights_dtype": quantization_config.weights_dtype.name,
                "activations_dtype": quantization_config.activations_dtype.name}
    return out_dir / ORT_PEER_FILE, settings


def torch_peer_tool(engine: str) -> str:
    return f"torch.ao.quantization.quantize_dynamic (nn.Linear, qint8, engine {engine})"


def state_dict_megabytes(model) -> float:
    """Size of the model's state_dict as torch.save writes it (the file a user would ship), in MB = 10^6 bytes."""
    import torch

    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return round(buffer.tell() / 1e6, 3)


def torch_peer_megabytes(pytorch_dir: Path) -> dict[str, float]:
    """state_dict_megabytes of the torch peer of the fp32 model in pytorch_dir, on every quantized engine of this CPU
    (torch_engines)."""
    from transformers import AutoModelForQuestionAnswering

    fp32 = AutoModelForQuestionAnswering.from_pretrained(pytorch_dir).eval()
    return {engine: state_dict_megabytes(torch_dynamic_int8(fp32, engine)) for engine in torch_engines()}


def build_nncf_int8(fp32_onnx: Path, out_dir: Path, calibration: list[dict]) -> tuple[Path, dict]:
    """The openvino-nncf-int8 peer: the x86 target's own build (pipeline.export.openvino_target.nncf_int8) on the
    full-size fp32 graph."""
    from pipeline.export.openvino_target import nncf_int8
    from pipeline.spawn import in_spawned_process

    return in_spawned_process(nncf_int8, fp32_onnx, out_dir, calibration, libraries=("nncf",))


def openvino_tool(peer: str, precision: str, graph: str | None = None) -> str:
    from pipeline.outputs.manifests import library_versions

    what = "NNCF post-training int8 of the fp32 graph" if peer == OPENVINO_PEER else f"our static int8 graph ({graph})"
    return f"OpenVINO {library_versions(('openvino',))['openvino']} runtime, {what}, precision hint {precision}"


def openvino_profile(path: Path, precision: str, sequence_length: int, vocab_size: int,
                     runs: int) -> tuple[list[dict], str]:
    """Time per (layer type, kernel) under OpenVINO's performance counters at 1 thread, largest first (the same
    rows as the onnxruntime profile of the benchmark), and the precision the hint resolved to."""
    from pipeline.measurement.latency import ranked_profile, synthetic_feed
    from pipeline.runtime.openvino_session import OpenVinoSession

    session = OpenVinoSession(path, 1, precision, profile=True)
    feed = synthetic_feed(session, sequence_length, vocab_size)
    session.run(None, feed)
    per_op: dict[str, float] = {}
    for _ in range(runs):
        session.run(None, feed)
        for op, ms in session.profile().items():
            per_op[op] = per_op.get(op, 0.0) + ms
    return ranked_profile(per_op, runs), session.precision


