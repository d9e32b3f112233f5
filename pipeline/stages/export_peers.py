"""Stage export_peers: the int8 paths a user would otherwise pick, for one full-size architecture, built so the
benchmark can time them beside our int8 graph (pipeline.export.peers).

  onnx-ortquantizer-int8  optimum's ORTQuantizer with the AutoQuantizationConfig preset for this CPU, dynamic, on
                          export_full_size's plain fp32 export: <peer>/model_quantized.onnx
  torch-dynamic-int8      torch.ao dynamic int8 of every Linear layer; it quantizes at load time, on the engine set
                          then, so what is built here is its size on every quantized engine of this CPU (the
                          benchmark times each engine and keeps the fastest)
  openvino-nncf-int8      NNCF's post-training int8 of the plain fp32 export as an OpenVINO model, calibrated on the
                          random windows our static recipes calibrate on: <peer>/openvino_model.xml (and .bin)
Only the peers named (benchmark.timed_full_size) are built. peers.json records each built peer (path, precision,
tool, settings or sizes) and, by name, why one could not be built on this machine (a CPU with no ORTQuantizer
preset): the benchmark still runs without it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.export import full_size
from pipeline.export import peers as peer_paths
from pipeline.export.openvino_target import model_megabytes
from pipeline.outputs.artifacts import atomic_write_json, read_json
from pipeline.outputs.machine import cpu_description
from pipeline.outputs.manifests import atomic_output_dir
from pipeline.plan.config import ConfigError, PipelineConfig

logger = logging.getLogger(__name__)

def run(cfg: PipelineConfig, full_size_dir: Path, peers: str, out_dir: Path) -> dict:
    peer_names = [name for name in peers.split(",") if name]
    unknown = sorted(set(peer_names) - set(peer_paths.BUILT_PEERS))
    if unknown:
        raise ConfigError(f"--peers: unknown peers {unknown} (known: {', '.join(peer_paths.BUILT_PEERS)})")
    architecture = read_json(full_size_dir / "full_size.json")["architecture"]
    built, skipped = {}, {}
    with atomic_output_dir(out_dir, cfg) as tmp:
        if peer_paths.TORCH_PEER in peer_names:
            logger.info("sizing %s/%s on every quantized engine of this CPU", architecture, peer_paths.TORCH_PEER)
            built[peer_paths.TORCH_PEER] = {
                "size_mb_by_engine": peer_paths.torch_peer_megabytes(full_size_dir / "pytorch"),
                "engines_left_out": peer_paths.engines_left_out(),  # built for another CPU architecture, with why
            }
        if peer_paths.ORT_PEER in peer_names:
            try:
                preset = peer_paths.ort_preset(cpu_description()["simd_flags"])
            except ValueError as error:  # a CPU optimum has no preset for: the rest of the benchmark still runs
                skipped[f"{architecture}/{peer_paths.ORT_PEER}"] = str(error)
                logger.warning("not built: %s/%s: %s", architecture, peer_paths.ORT_PEER, error)
            else:
                logger.info("building %s/%s with the %s preset", architecture, peer_paths.ORT_PEER, preset)
                path, settings = peer_paths.build_ortquantizer_int8(full_size_dir / "onnx" / "fp32", tmp / peer_paths.ORT_PEER,
                                                               preset)
                built[peer_paths.ORT_PEER] = {
                    "path": str(path.relative_to(tmp)), "precision": f"int8-ortquantizer-{preset}",
                    "quantization": settings,
                    "tool": f"optimum ORTQuantizer, AutoQuantizationConfig.{preset}(is_static=False)"}
        if peer_paths.OPENVINO_PEER in peer_names:
            fp32 = full_size_dir / "onnx" / "fp32" / "model.onnx"
            vocab_size = read_json(full_size_dir / "pytorch" / "config.json")["vocab_size"]
            calibration = full_size.random_calibration(fp32, vocab_size, cfg.seed + 1)  # as our static recipes
            logger.info("building %s/%s with NNCF on %d calibration windows", architecture, peer_paths.OPENVINO_PEER,
                        len(calibration))
            try:
                path, settings = peer_paths.build_nncf_int8(fp32, tmp / peer_paths.OPENVINO_PEER, calibration)
            except RuntimeError as error:  # OpenVINO refuses the model on this CPU: the rest of the benchmark runs
                lines = [line for line in str(error).splitlines() if line.strip()]
                reason = lines[-1] if lines else type(error).__name__
                skipped[f"{architecture}/{peer_paths.OPENVINO_PEER}"] = f"OpenVINO could not build it here: {reason}"
                logger.warning("not built: %s/%s: %s", architecture, peer_paths.OPENVINO_PEER, reason)
            else:
                built[peer_paths.OPENVINO_PEER] = {
                    "path": str(path.relative_to(tmp)), "precision": "int8-nncf", "quantization": settings,
                    "size_mb": model_megabytes(path)}
        metrics = {"architecture": architecture, "peers": built, "skipped": skipped}
        atomic_write_json(tmp / "peers.json", metrics)
    return metrics


# `python -m pipeline export-peers`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "full_size_dir": "output of export_full_size",
    "peers": "the peers to build, comma-separated",
}
