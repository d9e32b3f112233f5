"""summary.json: what a run measured, read from the earlier stages' outputs (benchmark.json, metrics.json,
quantize.json, coreml.json): the ratios, the peers beside our graph, the gates' verdicts and the goals."""

from __future__ import annotations

from pathlib import Path

from pipeline.outputs.artifacts import read_json
from pipeline.plan.config import PipelineConfig
from pipeline.plan.model_registry import bundled_model, exported_models, phone_models, trained_models
from pipeline.reporting.formatting import p50, ratio

TARGET_SIZE_MB = 207  # DistilBERT on an iPhone 7 Plus (Sanh et al. 2019)


PAPER_CPU_SPEEDUP = 1.6  # "60 % faster" than BERT-base on CPU (Sanh et al. 2019)


SUMMARY_FIELDS = ("name", "model", "format", "precision", "path", "size_mb", "exact_match", "f1", "f1_source",
                  "latency_ms", "untimed_reason", "peak_rss_mib", "recipe", "session_options", "runtime",
                  "runtime_precision", "same_run_as")


OPTIMIZED_INT8 = "distilbert/onnx-int8-optimized"  # the search's fastest gate-passing recipe (rule int8_search)


FLOOR_RATIO_GOAL = 1.35  # the full-size DistilBERT int8 at most this many times its int8 GEMMs alone


SPEEDUP_GOAL = 8.0  # the full-size DistilBERT int8 at least this many times faster than BERT-base PyTorch fp32


OPENVINO_PEER = "openvino-nncf-int8"  # pipeline.export.peers.OPENVINO_PEER (that module imports the export stack)


def parameter_count(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="numpy") as weights:
        for name in weights.keys():
            count = 1
            for dim in weights.get_slice(name).get_shape():
                count *= dim
            total += count
    return total


def summary(cfg: PipelineConfig, root: Path, benchmark: dict) -> dict:
    full_size = set(cfg.export.full_size.architectures)
    items = [{key: item.get(key) for key in SUMMARY_FIELDS} for item in benchmark["artifacts"]]
    by_name = {item["name"]: item for item in items}
    longest = max(cfg.benchmark.sequence_lengths)
    models = {}
    for name, stage in trained_models(cfg).items():  # exported or not (export.models)
        metrics = read_json(root / stage / "metrics.json")
        models[name] = {"params": parameter_count(root / stage), "exact_match": metrics["exact_match"],
                        "f1": metrics["f1"]}
    floor = benchmark.get("gemm_floor")
    model_ms = p50(by_name.get(OPTIMIZED_INT8), longest, 1)
    ratios = {
        f"distilbert_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1":
            ratio(p50(by_name.get("bert-base/pytorch-fp32"), longest, 1), p50(by_name.get("distilbert/pytorch-fp32"), longest, 1)),
        f"distilbert_onnx_int8_optimized_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1":
            ratio(p50(by_name.get("bert-base/pytorch-fp32"), longest, 1), model_ms),
        f"distilbert_onnx_int8_optimized_vs_naive_int8_speedup_seq{longest}_threads1":
            ratio(p50(by_name.get("distilbert/onnx-int8"), longest, 1), model_ms),
        f"bert_base_onnx_int8_optimized_vs_pytorch_fp32_speedup_seq{longest}_threads1":
            ratio(p50(by_name.get("bert-base/pytorch-fp32"), longest, 1), p50(by_name.get("bert-base/onnx-int8-optimized"), longest, 1)),
        "target_size_vs_distilbert_onnx_int8": ratio(TARGET_SIZE_MB, (by_name.get(OPTIMIZED_INT8) or {}).get("size_mb")),
        "target_size_vs_distilbert_coreml_4bit": ratio(TARGET_SIZE_MB, (by_name.get("distilbert/coreml-4bit") or {}).get("size_mb")),
        # the phone accelerators' files: the Neural Engine layout package and the Android NPU graph (one length)
        "target_size_vs_distilbert_coreml_ane": ratio(TARGET_SIZE_MB, (by_name.get("distilbert/coreml-ane") or {}).get("size_mb")),
        "target_size_vs_distilbert_npu_int8": ratio(TARGET_SIZE_MB, next(
            (item["size_mb"] for item in items if item["name"].startswith("distilbert/npu-int8-static")), None)),
        f"target_size_vs_{bundled_model(cfg)}_bundle_onnx": ratio(
            TARGET_SIZE_MB, (by_name.get(f"{bundled_model(cfg)}/ort-int8") or {}).get("size_mb")),
    }
    # The x86 target's recipe at full size (NNCF's int8 on OpenVINO), at each precision: held to the speed goals.
    openvino = x86_target_entries(benchmark)
    for name in openvino:
        ratios[f"{name.replace('/', '_').replace('-', '_')}_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1"] = \
            ratio(p50(by_name.get("bert-base/pytorch-fp32"), longest, 1), p50(by_name.get(name), longest, 1))
    return {
        "target_size_mb": TARGET_SIZE_MB,
        "machine": benchmark["machine"],
        "models": models,
        "artifacts": [item for item in items if item["model"] not in full_size],
        "full_size": [item for item in items if item["model"] in full_size],
        "gemm_floor": None if floor is None else {
            **{k: floor[k] for k in ("sequence_length", "threads", "n_matmul_integer")},
            "latency_ms": floor["latency_ms"]["p50"], "ratio": ratio(model_ms, floor["latency_ms"]["p50"]),
            "openvino": {name: ratio(p50(by_name.get(name), longest, 1), floor["latency_ms"]["p50"]) for name in openvino},
        },
        "ratios": ratios,
        "peers": peer_comparison(benchmark, cfg),
        "profiles": benchmark.get("profiles") or {},  # per operator at the longest length, 1 thread
        "gates": gate_verdicts(root, cfg),
        "bundle": bundle_contents(root),
        "npu": npu_checks(root, cfg),
        "skipped_timings": benchmark.get("skipped_timings", []),
    }


def npu_checks(root: Path, cfg: PipelineConfig) -> dict:
    """Per model with phone builds (export.phone_models), its Android NPU graphs (export_npu's npu.json): size,
    verdict, the CPU execution provider's dev scores, and the QNN HTP emulation's check, or why it did not run; {}
    when none were built."""
    checks = {}
    for model in phone_models(cfg):
        path = root / "npu" / model / "npu.json"
        if not path.is_file():
            continue
        npu = read_json(path)
        checks[model] = {"size_mb": npu["size_mb"], "sequence_lengths": npu["sequence_lengths"],
                         "verdict": npu["verdict"], "passed": npu["passed"], "f1": npu["dev"]["f1"],
                         "f1_drop": npu["dev"]["f1_drop"], "answer_agreement": npu["dev"]["answer_agreement"],
                         "nnapi": {length: graph["nnapi"] for length, graph in npu["graphs"].items()},
                         "emulator": {key: value for key, value in npu["emulator"].items() if key != "question_ids"}}
    return checks


def bundle_contents(root: Path) -> dict:
    """What the bundle shipped and, when it ships no int8 graph, the one line that says why (int8_note)."""
    bundle = read_json(root / "bundle" / "metrics.json")
    return {key: bundle.get(key) for key in ("onnx_model", "onnx_variant", "int8_note", "shipped", "rejected_why",
                                             "coreml_executed", "npu")}


def gate_verdicts(root: Path, cfg: PipelineConfig) -> list[dict]:
    """Every export variant's gate verdicts (value, 95 % interval, threshold, passed), read from export.json,
    quantize.json and coreml.json, and whether the bundle ships it (its metrics.json: what it shipped after its
    own re-gate). A variant with no verdict counts as not passed."""
    shipped_model = bundled_model(cfg)
    bundle = read_json(root / "bundle" / "metrics.json")
    shipped_int8 = bundle["onnx_variant"] if bundle["onnx_model"] == "model.int8.onnx" else None
    shipped_openvino = any(path.startswith("openvino/") for path in bundle["shipped"])
    shipped_coreml = set(bundle["coreml_size_mb"])
    rows = []
    for model in exported_models(cfg):
        export = read_json(root / "onnx" / model / "export.json")
        for graph in ("fp32", "optimized"):
            rows.append({"model": model, "variant": f"onnx-{graph}", "gates": export[graph].get("gates", {}),
                         "passed": export[graph].get("passed") is True, "verdict": export[graph].get("verdict"),
                         "shipped": model == shipped_model and graph == "fp32",
                         "n_questions": export.get("n_questions")})
        quantized = read_json(root / "quantized" / model / "quantize.json")
        for name, variant in quantized["variants"].items():
            openvino = variant.get("runtime") == "openvino"  # the x86 target: bundled in openvino/ when it passes
            rows.append({"model": model, "variant": name if openvino else f"onnx-{name}", "gates": variant["gates"],
                         "passed": variant["passed"] is True, "verdict": variant.get("verdict"),
                         "fell_back": variant.get("fallback", {}).get("fell_back", []),
                         "shipped": model == shipped_model and (shipped_openvino if openvino else name == shipped_int8),
                         "n_questions": quantized.get("n_questions")})
        if model not in phone_models(cfg):
            continue  # no CoreML packages or NPU graphs (export.phone_models)
        coreml = read_json(root / "coreml" / model / "coreml.json")
        for name, package in coreml["packages"].items():
            dev = package.get("dev") or {}
            rows.append({"model": model, "variant": f"coreml-{name}", "gates": dev.get("gates", {}),
                         "passed": dev.get("passed") is True, "verdict": dev.get("verdict"),
                         "shipped": model == shipped_model and name in shipped_coreml,
                         "n_questions": coreml.get("n_questions") if dev else None})
        npu_path = root / "npu" / model / "npu.json"
        if npu_path.is_file():
            npu = read_json(npu_path)
            rows.append({"model": model, "variant": "android-npu", "gates": npu["dev"]["gates"],
                         "passed": npu["passed"] is True, "verdict": npu["verdict"],
                         "shipped": model == shipped_model and (bundle.get("npu") or {}).get("shipped") is True,
                         "n_questions": npu["n_questions"]})
    return rows


def x86_target_entries(benchmark: dict) -> list[str]:
    """The x86 target's recipe at full size (NNCF's int8 on OpenVINO) at each precision, the entries held to the speed
    goals; a "-default" one that is the "-f32" one's run on this CPU (same_run_as) is left out: its goals are the
    f32 one's."""
    return [item["name"] for item in benchmark["artifacts"]
            if item["name"].startswith(f"distilbert/{OPENVINO_PEER}-") and not item.get("same_run_as")]


def verdict(peer: dict, ours: dict) -> str:
    """"ahead" when the peer's median is slower than our p90, "behind" when its p90 is faster than our median, and
    "within noise" otherwise: a difference inside the run-to-run spread is not claimed either way."""
    if peer["p50"] > ours["p90"]:
        return "ahead"
    if peer["p90"] < ours["p50"]:
        return "behind"
    return "within noise"


def peer_comparison(benchmark: dict, cfg: PipelineConfig) -> list[dict]:
    """Each peer (rule benchmark's "peer_of" artifacts) beside our int8 graph of the same architecture at every
    length and thread count: both p50 and p90, peer p50 / ours p50 (above 1: ours is faster; sizes likewise) and
    the verdict that the spread allows. The two were timed in one process, in turn by blocks ("in turn"); a pair
    missing from that run falls back to each artifact's own process ("separate processes")."""
    by_name = {item["name"]: item for item in benchmark["artifacts"]}
    rows = []
    for peer in benchmark["artifacts"]:
        if not peer.get("peer_of"):
            continue
        ours = by_name.get(peer["peer_of"]) or {}
        in_turn = peer.get("interleaved_with_ours") or {}
        latency = {}
        for length in cfg.benchmark.sequence_lengths:
            for threads in cfg.benchmark.threads:
                key, count = f"seq{length}", f"threads{threads}"
                pair = (in_turn.get(key) or {}).get(count)
                timing = "in turn"
                if pair is None:
                    pair = {"peer": ((peer.get("latency_ms") or {}).get(key) or {}).get(count),
                            "ours": ((ours.get("latency_ms") or {}).get(key) or {}).get(count)}
                    timing = "separate processes"
                if pair["peer"] and pair["ours"]:
                    latency.setdefault(key, {})[count] = {
                        "peer_p50": pair["peer"]["p50"], "peer_p90": pair["peer"]["p90"],
                        "ours_p50": pair["ours"]["p50"], "ours_p90": pair["ours"]["p90"],
                        "ratio": ratio(pair["peer"]["p50"], pair["ours"]["p50"]),
                        "verdict": verdict(pair["peer"], pair["ours"]), "timing": timing}
        rows.append({"name": peer["name"], "tool": peer["tool"], "ours": peer["peer_of"], "size_mb": peer["size_mb"],
                     "ours_size_mb": ours.get("size_mb"), "size_ratio": ratio(peer["size_mb"], ours.get("size_mb")),
                     "latency": latency, "untimed_reason": peer.get("untimed_reason")})
    return rows


def goals(summary_data: dict, benchmark: dict, full_size: dict, longest: int) -> list[dict]:
    """The speed and size goals, all measured on the full-size architectures: none without them."""
    if not summary_data["full_size"]:
        return []
    ratios = summary_data["ratios"]
    search = benchmark.get("int8_search") or {}
    chosen = (search.get("choice") or {}).get("recipe", "not searched")
    rows = [
        {"goal": f"distilbert/onnx-int8-optimized ({chosen}) vs bert-base/pytorch-fp32, seq {longest}, 1 thread",
         "target": f">= {SPEEDUP_GOAL:g}x",
         "value": ratios[f"distilbert_onnx_int8_optimized_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1"],
         "check": lambda v: v >= SPEEDUP_GOAL, "speed": True},
        {"goal": f"distilbert/onnx-int8-optimized ({chosen}) vs distilbert/onnx-int8 (naive), seq {longest}, 1 thread",
         "target": ">= 1.25x",
         "value": ratios[f"distilbert_onnx_int8_optimized_vs_naive_int8_speedup_seq{longest}_threads1"],
         "check": lambda v: v >= 1.25, "speed": True},
        {"goal": "model latency / GEMM floor (distilbert/onnx-int8-optimized)", "target": f"<= {FLOOR_RATIO_GOAL}",
         "value": (summary_data["gemm_floor"] or {}).get("ratio"), "check": lambda v: v <= FLOOR_RATIO_GOAL,
         "speed": True},
        {"goal": "DistilBERT vs BERT-base, PyTorch fp32 (paper: 1.6x on CPU)", "target": ">= 1.6x",
         "value": ratios[f"distilbert_vs_bert_base_pytorch_fp32_speedup_seq{longest}_threads1"],
         "check": lambda v: v >= PAPER_CPU_SPEEDUP, "speed": False},
    ]
    # The x86 target's recipe at full size (NNCF's int8 on OpenVINO), at each precision, against the same two goals.
    for name, floor_ratio in ((summary_data["gemm_floor"] or {}).get("openvino") or {}).items():
        speedup = ratios.get(f"{name.replace('/', '_').replace('-', '_')}_vs_bert_base_pytorch_fp32_speedup_seq"
                             f"{longest}_threads1")
        rows += [
            {"goal": f"x86 target's recipe: {name} (NNCF int8, OpenVINO) vs bert-base/pytorch-fp32, seq {longest}, "
                     "1 thread", "target": f">= {SPEEDUP_GOAL:g}x", "value": speedup,
             "check": lambda v: v >= SPEEDUP_GOAL, "speed": True},
            {"goal": f"x86 target's recipe: model latency / GEMM floor ({name})", "target": f"<= {FLOOR_RATIO_GOAL}",
             "value": floor_ratio, "check": lambda v: v <= FLOOR_RATIO_GOAL, "speed": True},
        ]
    distilbert = full_size.get("distilbert")
    if distilbert:
        for key, label in (("int8_onnx_mb", "full-size DistilBERT int8 ONNX size (MB)"),
                           ("coreml_4bit_mb", "full-size DistilBERT CoreML 4-bit size (MB)")):
            goal = distilbert["goals"][key]
            rows.append({"goal": label, "target": f"<= {goal['maximum']}", "value": goal["value"],
                         "check": lambda v, limit=goal["maximum"]: v <= limit, "speed": False})
    for row in rows:
        check = row.pop("check")
        row["met"] = None if row["value"] is None else bool(check(row["value"]))
    return rows


def with_web_timings(benchmark: dict, web_benchmark_path: Path | None) -> dict:
    """The benchmark's artifacts plus the JavaScript runtimes' entries (rule benchmark_web), in the same shape;
    they are timed, not scored, so their accuracy fields are null (the client's answers match onnxruntime's)."""
    if web_benchmark_path is None:
        return benchmark
    web = read_json(web_benchmark_path)
    extra = [{**{key: None for key in SUMMARY_FIELDS}, **{k: v for k, v in item.items() if k in SUMMARY_FIELDS}}
             for item in web["artifacts"]]
    return {**benchmark, "artifacts": benchmark["artifacts"] + extra,
            "skipped_timings": benchmark.get("skipped_timings", []) + web.get("skipped", [])}
