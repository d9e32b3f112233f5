"""report.md: the run's tables and what they say, in words and numbers read from summary.json and benchmark.json."""

from __future__ import annotations

from pipeline.plan.config import PipelineConfig
from pipeline.plan.model_registry import exported_models, phone_models
from pipeline.reporting.formatting import fmt

def gated_questions(rows: list[dict], dev_questions: int | None) -> str:
    """The dev questions the gates scored, as the exports recorded them: the first export.gates.dev_questions, or
    fewer where the dev set is split with the int8 tuning (pipeline/export/dev_split.py)."""
    scored = " / ".join(str(n) for n in sorted({row["n_questions"] for row in rows if row.get("n_questions")}))
    if (not scored and dev_questions) or scored == str(dev_questions):
        return f"the first {dev_questions} dev questions (export.gates.dev_questions)"
    if not scored:
        return "the gated dev questions"
    return (f"{scored} gated dev questions (a dev set smaller than export.gates.dev_questions "
            f"{dev_questions or 'all'} plus the int8 tuning questions is split between them: quantize.json's "
            "dev_split)")


def gate_cell(gate: dict | None) -> str:
    if not gate:
        return ""
    value = gate["value"]
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    if "interval" in gate:
        text += f" [{gate['interval'][0]:.4g}, {gate['interval'][1]:.4g}]"
    bound = gate.get("minimum", gate.get("maximum"))
    sign = ">=" if "minimum" in gate else "<="
    if bound is None:
        return text + " (recorded, not a gate)"
    verdict = gate.get("verdict")
    if verdict == "unproven":
        decide = gate.get("questions_to_decide")
        mark = f" unproven ({decide:,} questions would decide it)" if decide else " unproven (on the threshold)"
    else:
        mark = " **rejected**" if gate["passed"] is False else (f" {verdict}" if verdict else "")
    return f"{text} {sign} {bound:g}{mark}"


def gate_section(rows: list[dict], cfg: PipelineConfig) -> list[str]:
    """One row per export variant: each gate's value, its 95 % interval and threshold, and the verdict."""
    gates = cfg.export.gates
    lines = ["## Gates: what ships", "",
             f"Every export variant against its PyTorch model on {gated_questions(rows, gates.dev_questions)}. "
             "value [95 % interval] threshold: answer agreement by its Wilson interval, F1 drop by a paired "
             "bootstrap over questions. A gate is *rejected* when the value is past the threshold, *proven* when the "
             "whole interval is within it, *unproven* when the value is within it and the interval straddles it "
             "(with the dev questions that would decide it, at the measured spread). A rejected variant is left out "
             "of the bundle and of the full-size int8 search; an unproven one "
             + ("is left out too (export.gates.strict ships proven variants only)." if gates.strict
                else "ships, marked unproven (export.gates.strict ships proven variants only).")
             + " A variant with no verdict (its build or scoring failed) is a failure and never ships.", "",
             "| model | variant | answer agreement | F1 drop | logit parity / answerer | verdict |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        found = row["gates"]
        parity = "; ".join(filter(None, (gate_cell(found.get("max_abs_logit_diff")),
                                         gate_cell(found.get("torch_free_answer_agreement")))))
        verdict = row.get("verdict") or "no verdict (not shipped)"
        verdict = f"**{verdict}**" if verdict == "rejected" else verdict
        if row.get("verdict") == "unproven" and row["passed"] is False:
            verdict += " (not shipped: strict)"
        if row.get("fell_back"):
            verdict += f", {len(row['fell_back'])} layer(s) in fp32"
        verdict += ", **shipped**" if row["shipped"] else ""
        lines.append(f"| {row['model']} | {row['variant']} | {gate_cell(found.get('answer_agreement'))} | "
                     f"{gate_cell(found.get('f1_drop'))} | {parity} | {verdict} |")
    return lines + [""]


def skipped_note(skipped: list[dict]) -> list[str]:
    if not skipped:
        return []
    return ["", "Not timed on this machine: " + "; ".join(f"{item['what']} ({item['reason']})" for item in skipped)
            + "."]


def peer_verdict(row: dict) -> str:
    """One plain sentence: where ours is ahead of this peer beyond the run-to-run spread and by how much, where the
    two are within it, and where ours is behind."""
    points = [(f"seq {key[3:]}, {threads[7:]} thr", cell) for key, by_threads in row["latency"].items()
              for threads, cell in by_threads.items()]
    if not points:
        reason = f" ({row['untimed_reason']})" if row.get("untimed_reason") else ""
        return f"- {row['name']}: not timed against {row['ours']}{reason}."
    parts = []
    for kind, words in (("ahead", "ahead"), ("within noise", "within the run-to-run spread (p50 to p90)"),
                        ("behind", "**behind**")):
        where = [(label, cell["ratio"]) for label, cell in points if cell["verdict"] == kind]
        if where:
            parts.append(f"{words} at {len(where)} of {len(points)} points ("
                         + ", ".join(f"{label}: {r:.2f}x" for label, r in where) + ")")
    size = row["size_ratio"]
    size_text = "" if size is None else f" On disk the peer is {size:.2f}x our size."
    return (f"- {row['name']} ({row['tool']}): {row['ours']} is " + "; ".join(parts)
            + f" (the peer's p50 / ours).{size_text}")


def latency_text(item: dict, length: int, threads: int) -> str:
    if item["latency_ms"] is None:
        return "n/a"
    cell = (item["latency_ms"].get(f"seq{length}") or {}).get(f"threads{threads}")
    return f"{cell['p50']:.2f} / {cell['p90']:.2f}" if cell else "n/a"


def timed_threads(items: list[dict], cfg: PipelineConfig) -> list[int]:
    """The thread counts of the table's columns: the benchmark's, and any other an entry was timed at (Chromium's
    benchmark.browser_threads)."""
    found = {int(threads.removeprefix("threads")) for item in items for cell in (item["latency_ms"] or {}).values()
             for threads in (cell or {})}
    return sorted(found | set(cfg.benchmark.threads))


def artifact_table(items: list[dict], cfg: PipelineConfig) -> str:
    lengths, threads = cfg.benchmark.sequence_lengths, timed_threads(items, cfg)
    columns = [f"seq {n}, {t} thr p50 / p90 ms" for n in lengths for t in threads]
    lines = ["| artifact | MB | EM | F1 | F1 from | " + " | ".join(columns) + " | peak RSS MiB |",
             "|---|---|---|---|---|" + "---|" * len(columns) + "---|"]
    for item in items:
        cells = [latency_text(item, n, t) for n in lengths for t in threads]
        name = f"{item['name']} (the same run as {item['same_run_as']})" if item.get("same_run_as") else item["name"]
        lines.append(f"| {name} | {fmt(item['size_mb'], 3)} | {fmt(item['exact_match'])} | {fmt(item['f1'])} | "
                     f"{item['f1_source'] or '—'} | " + " | ".join(cells) + f" | {fmt(item['peak_rss_mib'], 0)} |")
    return "\n".join(lines)


RUNTIME_FUSED_OPS = ("SkipLayerNormalization", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "BiasGelu", "Gelu",
                     "FastGelu", "EmbedLayerNormalization")


def speed_analysis(profiles: dict, floor: dict | None) -> list[str]:
    """What the profiles say about the missed speed goals, in numbers (nothing here is assumed)."""
    naive = {op["op"]: op for op in profiles.get("distilbert/onnx-int8", [])}
    fused = {op["op"]: op for op in profiles.get("distilbert/onnx-int8-optimized", [])}
    lines = []
    runtime_fused = [op for op in RUNTIME_FUSED_OPS if op in naive]
    if runtime_fused:
        lines.append(f"- The naive int8 graph already runs fused kernels ({', '.join(runtime_fused)}): onnxruntime "
                     "fuses a graph itself when it loads it, so the offline transformer optimizer adds mainly the "
                     "attention fusion.")
    if "QAttention" in fused and "MatMul" in naive:
        lines.append(f"- Attention: the fused graph's QAttention (input projections and scores) takes "
                     f"{fused['QAttention']['ms_per_run']:.1f} ms per run; the naive graph spends "
                     f"{naive['MatMul']['ms_per_run']:.1f} ms in float MatMuls (the attention scores) plus its share of "
                     f"the int8 projections. Fusing attention moves work rather than removing it on this CPU.")
    if "MatMul" in naive and "MatMul" not in fused:
        lines.append(f"- The chosen graph runs attention's two products in int8 as well; in the naive graph they are "
                     f"float MatMuls taking {naive['MatMul']['ms_per_run']:.1f} ms per run.")
    chosen = profiles.get("distilbert/onnx-int8-optimized", [])
    if floor and floor.get("ratio") and chosen:
        gemm_ops = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "QAttention", "QLinearMatMul")
        rest = [op for op in chosen if op["op"] not in gemm_ops][:4]
        lines.append(f"- The int8 GEMMs alone take {floor['latency_ms']:.1f} ms; the model takes {floor['ratio']:.2f}x "
                     "that. The largest other operators in its profile: "
                     + ", ".join(f"{op['op']} {op['ms_per_run']:.1f} ms" for op in rest)
                     + " (activation quantization is part of DynamicQuantizeMatMul's time).")
    lines += openvino_analysis(profiles)
    return lines


# What each runtime's profile calls the same work: int8 GEMMs, layer norms, and attention with its elementwise
# neighbours (OpenVINO fuses those into "Subgraph" kernels). A profile holds its 10 largest rows; an OpenVINO row
# is "<layer type> (<kernel>)".
ORT_KINDS = {"int8 GEMMs": ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "QAttention",
                            "QLinearMatMul", "QGemm"),
             "layer norms": ("SkipLayerNormalization", "LayerNormalization", "EmbedLayerNormalization",
                             "QEmbedLayerNormalization"),
             "attention and elementwise": ("MatMul", "FusedMatMul", "Softmax", "Add", "Gelu", "BiasGelu", "FastGelu",
                                           "Transpose", "Mul", "QuantizeLinear", "DequantizeLinear",
                                           "DynamicQuantizeLinear")}


OPENVINO_KINDS = {"int8 GEMMs": ("FullyConnected", "FullyConnectedQuantizedLegacy"), "layer norms": ("MVN",),
                  "attention and elementwise": ("Subgraph", "Transpose", "Multiply", "Add", "Subtract", "Softmax",
                                                "MatMul", "Convert")}


def kind_times(profile: list[dict], kinds: dict[str, tuple[str, ...]]) -> dict[str, float]:
    """ms per run of each kind of work in a profile, and "other": the profile's total (its rows hold their share of
    it) less the kinds."""
    times = {kind: sum(row["ms_per_run"] for row in profile if row["op"].split(" (")[0] in ops)
             for kind, ops in kinds.items()}
    total = max((row["ms_per_run"] / row["share"] for row in profile if row["share"]), default=0.0)
    times["other"] = max(total - sum(times.values()), 0.0)
    return times


def openvino_analysis(profiles: dict) -> list[str]:
    """Where OpenVINO's kernels win: its profile of each OpenVINO entry beside onnxruntime's of our chosen graph,
    by kind of work."""
    ours = profiles.get("distilbert/onnx-int8-optimized")
    if not ours:
        return []
    ours_times = kind_times(ours, ORT_KINDS)
    lines = []
    for name, profile in profiles.items():
        if "/openvino-" in name:
            theirs = kind_times(profile, OPENVINO_KINDS)
            lines.append(f"- {name} against onnxruntime on distilbert/onnx-int8-optimized, ms per run: "
                         + "; ".join(f"{kind} {theirs[kind]:.1f} vs {ours_times[kind]:.1f}" for kind in ours_times)
                         + ".")
    return lines


def search_section(search: dict) -> list[str]:
    """The int8 search: every candidate's timing, the session options tried, the choice and its runner-up."""
    choice, runner_up = search["choice"], search["runner_up"]
    lines = ["## int8 search (full-size DistilBERT)", "",
             f"Every int8 recipe that passed its accuracy gates on every exported model, timed round-robin at seq "
             f"{search['sequence_length']}, {search['threads']} thread, {search['runs']} runs each; the two fastest "
             "again under each session option set.", "",
             "| recipe | graph | format | weight scales | attention MatMuls | p50 ms | p90 ms |",
             "|---|---|---|---|---|---|---|"]
    ranked = sorted(search["candidates"].items(), key=lambda item: item[1]["latency_ms"]["p50"])
    for name, candidate in ranked:
        recipe = candidate["recipe"]
        lines.append(f"| {name} | {recipe['graph']} | {recipe['format']} | "
                     f"{'per channel' if recipe['per_channel'] else 'per tensor'} | "
                     f"{'int8' if recipe['attention_int8'] else 'fp32'} | {candidate['latency_ms']['p50']:.1f} | "
                     f"{candidate['latency_ms']['p90']:.1f} |")
    lines += ["", "| recipe | session options | p50 ms | p90 ms |", "|---|---|---|---|"]
    for entry in sorted(search["session_options"].values(), key=lambda e: e["latency_ms"]["p50"]):
        lines.append(f"| {entry['recipe']} | {entry['session_options']} | {entry['latency_ms']['p50']:.1f} | "
                     f"{entry['latency_ms']['p90']:.1f} |")
    decided_by = f"; {choice['decided_by']}" if choice.get("decided_by") else ""  # runs recorded before it
    lines += ["", f"Chosen: **{choice['recipe']}** with session options '{choice['session_options']}' "
                  f"(p50 {choice['latency_ms']['p50']:.1f} ms{decided_by})."]
    if runner_up:
        lines.append(f"Runner-up: {runner_up['recipe']} with '{runner_up['session_options']}' "
                     f"(p50 {runner_up['latency_ms']['p50']:.1f} ms).")
    if search["rejected_by_gates"]:
        rejected = "; ".join(f"{name} (failed on {', '.join(m for m, ok in verdicts.items() if ok is False)})"
                             for name, verdicts in search["rejected_by_gates"].items())
        lines.append(f"Left out by the accuracy gates: {rejected}.")
    return lines + [""]


def peer_section(rows: list[dict], cfg: PipelineConfig, skipped: dict[str, str] | None = None,
                 settings: dict | None = None) -> list[str]:
    """The peers' table and one sentence per peer; `settings`: the benchmark's, for how the pairs were timed."""
    lengths, threads = cfg.benchmark.sequence_lengths, cfg.benchmark.threads
    settings = settings or {}
    if "in_turn_block_runs" in settings:
        how = (f"At every length and thread count the peers and ours are timed in one process, in turn by blocks of "
               f"{settings['in_turn_block_runs']} runs ({cfg.benchmark.runs} runs each), each block after a "
               f"{settings['in_turn_settle_s']} s pause and one untimed run: a drift in machine speed hits all alike, "
               "and one runtime's threads, still spinning after its run, do not take the cores of another. A cell "
               "marked 'separate' comes from each artifact's own process instead.")
    else:  # a benchmark.json from before the timing by blocks
        how = ("With 1 thread the two are timed in one process, run for run in turn; the cells marked 'separate' "
               "come from each artifact's own process, as in the full-size table above.")
    columns = [f"seq {n}, {t} thr" for n in lengths for t in threads]
    lines = ["## Peers: the int8 paths a user would otherwise pick, timed in the same run", "",
             "Each cell: the peer's p50 ms / ours (the same architecture's onnx-int8-optimized, with the session "
             "options the int8 search chose; the ORTQuantizer peer runs with onnxruntime's defaults, as its users "
             "get it) p50 ms = ratio (above 1: ours is faster), and the verdict: ahead when the peer's p50 is above "
             f"our p90, behind when its p90 is below our p50, else within the run-to-run spread. {how} The OpenVINO "
             "rows run at precision f32 or at the runtime's default for what is not int8 (the resolved precision is "
             "each entry's runtime_precision in summary.json).", "",
             "| peer | vs | MB (peer / ours) | " + " | ".join(columns) + " |",
             "|---|---|---|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for n in lengths:
            for t in threads:
                cell = (row["latency"].get(f"seq{n}") or {}).get(f"threads{t}")
                separate = ", separate" if cell and cell["timing"] == "separate processes" else ""
                cells.append("n/a" if cell is None else f"{cell['peer_p50']:.1f} / {cell['ours_p50']:.1f} = "
                                                        f"{cell['ratio']:.2f}x, {cell['verdict']}{separate}")
        if not row["latency"] and row.get("untimed_reason"):
            cells = [f"not timed: {row['untimed_reason']}"] + [""] * (len(cells) - 1)
        lines.append(f"| {row['name']} | {row['ours']} | {fmt(row['size_mb'], 1)} / {fmt(row['ours_size_mb'], 1)} | "
                     + " | ".join(cells) + " |")
    lines += [""] + [peer_verdict(row) for row in rows]
    lines += [f"- {name}: not built on this machine: {reason}." for name, reason in (skipped or {}).items()]
    return lines + [""]


def javascript_note(summary_data: dict, cfg: PipelineConfig) -> list[str]:
    """Where the JavaScript rows (rule benchmark_web) were timed; nothing when there are none."""
    javascript = [item for item in summary_data["artifacts"] + summary_data["full_size"] if item["runtime"]]
    if not javascript:
        return []
    runtimes = {item["format"]: item["runtime"] for item in javascript}
    text = "JavaScript rows: " + "; ".join(f"{fmt} in {runtime}" for fmt, runtime in runtimes.items()) + "."
    text += " Node: 1 thread."
    if "onnx-web-chromium" in runtimes:
        text += (f" Chromium: WebAssembly threads {', '.join(map(str, cfg.benchmark.browser_threads))}; its peak "
                 "memory is the page's renderer process.")
    if any(item["model"] not in exported_models(cfg) for item in javascript):
        text += f" The full-size graph: {cfg.benchmark.javascript_full_size_runs} timed runs."
    return ["", text]


def bundle_lines(bundle: dict | None) -> list[str]:
    """What the app bundle ships, and the one line saying why it holds no int8 graph when it does not."""
    if not bundle:
        return []
    lines = ["## The app bundle", "", f"The app's model: `{bundle['onnx_model']}` ({bundle['onnx_variant']}). Shipped: "
             + ", ".join(f"`{path}`" for path in bundle["shipped"]) + "."]
    if bundle.get("int8_note"):
        lines += ["", f"**No int8 graph**: {bundle['int8_note']}"]
    for name, why in (bundle.get("rejected_why") or {}).items():
        lines.append(f"- `{name}` left out: {why}")
    if bundle.get("coreml_executed"):
        lines += ["", f"CoreML: {bundle['coreml_executed']}."]
    return lines + [""]


def npu_lines(checks: dict) -> list[str]:
    """The Android NPU graphs per model: the CPU execution provider's gate, NNAPI's partitioning, and the QNN HTP
    emulation's check of the NPU's own arithmetic, or why it did not run."""
    if not checks:
        return []
    lines = ["## Android NPU graphs (static int8, fixed shapes)", "",
             "One graph per length, gated above (android-npu rows) on the CPU execution provider. The NPU computes "
             "int8 its own way: a sample of the gated questions also ran through the QNN HTP backend's x86 emulation "
             "(onnxruntime-qnn, CPU fallback off, so every node ran on the emulated NPU) and is compared with the CPU "
             "execution provider's answers on the same graphs; a disagreement is a miss (the `npu` gate) only where an "
             "interval shows it: the agreement's whole Wilson interval below export.gates.min_answer_agreement, or the "
             "whole paired interval of the F1 the NPU loses above export.gates.max_f1_drop. The emulator's seconds are an x86 emulation, not a "
             "phone's latency: no NPU latency was measured here.", "",
             "| model | lengths | size | verdict | NNAPI: nodes taken, partitions | emulated HTP | npu gate: = CPU EP (or F1 lost) | = PyTorch "
             "| F1 emulated / CPU EP (sample) | largest logit diff | emulator s/window |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, check in checks.items():
        nnapi = next(iter(check["nnapi"].values()), {})
        taken = f"{nnapi.get('supported_nodes')}/{nnapi.get('nodes')}, {nnapi.get('partitions')}" if nnapi else ""
        emulator = check["emulator"]
        if emulator["ran"]:
            cells = [f"v{emulator['htp_arch']}, SoC {emulator['soc_model']}, {emulator['n_questions']} questions",
                     gate_cell(emulator["agreement_with_cpu"]),
                     f"{emulator['agreement_with_pytorch']['value']:.3f} [{emulator['agreement_with_pytorch']['interval'][0]:.3f}, "
                     f"{emulator['agreement_with_pytorch']['interval'][1]:.3f}]",
                     f"{emulator['f1']:.2f} / {emulator['f1_cpu']:.2f}", f"{emulator['max_abs_logit_diff_vs_cpu']:.3g}",
                     f"{emulator['emulator_seconds_per_window']:.3g}"]
        else:
            cells = [f"not run: {emulator['reason']}", "", "", "", "", ""]
        lines.append(f"| {model} | {', '.join(map(str, check['sequence_lengths']))} | {check['size_mb']} MB | "
                     f"{check['verdict']} | {taken} | " + " | ".join(cells) + " |")
    return lines + [""]


def report_markdown(cfg: PipelineConfig, summary_data: dict, benchmark: dict, goal_rows: list[dict]) -> str:
    machine = summary_data["machine"]
    longest = max(cfg.benchmark.sequence_lengths)
    title = (f"# {cfg.deploy.model}, deployed as it is: what was built and how it measures" if cfg.deploy.model
             else "# DistilBERT question answering: what was built and how it measures")
    lines = [
        title,
        "",
        f"Machine: **{machine['cpu']}**, {machine['cores']} cores; SIMD flags: {', '.join(machine.get('cpu_flags', []))}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items()) + ".",
        f"Latency: batch 1, every token attended, p50 / p90 over {cfg.benchmark.runs} timed runs (a full-size "
        f"architecture's rows and its peers': {cfg.benchmark.full_size_runs}) after "
        f"{cfg.benchmark.warmup} warm-up runs, threads pinned in onnxruntime and torch; one process per artifact (its "
        "peak resident memory is the last column, in MiB = 2^20 bytes); the peers are timed once, in turn with our graph "
        "(their rows are those blocks), each one's own process running once at the longest length for its memory. Sizes in MB = 10^6 bytes. 'n/a': the model "
        "has fewer positions than the length, or it cannot be timed here (CoreML runs only on macOS; some full-size "
        "artifacts are sized only, see benchmark.timed_full_size; an OpenVINO '-default' peer is not timed where it is "
        "its '-f32' run on this CPU, see the peers' section).",
        *javascript_note(summary_data, cfg),
        *skipped_note(summary_data["skipped_timings"]),
        "",
        "## Models",
        "",
        "| model | parameters | dev EM | dev F1 |",
        "|---|---|---|---|",
    ]
    for name, model in summary_data["models"].items():
        lines.append(f"| {name} | {model['params']:,} | {model['exact_match']:.2f} | {model['f1']:.2f} |")
    not_exported = [name for name in summary_data["models"] if name not in exported_models(cfg)]
    if not_exported:
        lines += ["", f"Not exported (export.models): {', '.join(not_exported)}; trained and scored above only."]
    without_phone_builds = [name for name in exported_models(cfg) if name not in phone_models(cfg)]
    if without_phone_builds:
        lines += ["", f"No phone builds (export.phone_models): {', '.join(without_phone_builds)}; exported to ONNX, "
                  "int8 and OpenVINO only, without CoreML packages or Android NPU graphs."]
    which = "the deployed model" if cfg.deploy.model else "the trained models"
    lines += ["", f"## Artifacts of {which}", "", artifact_table(summary_data["artifacts"], cfg), "",
              "CoreML F1: the weights read back from each package, run in PyTorch at float16 ('pytorch-proxy'). "
              + ("PyTorch rows score the whole dev set; export rows score "
                 f"{gated_questions(summary_data['gates'], cfg.export.gates.dev_questions)}, on which the PyTorch "
                 "models score as in each export's export.json." if cfg.export.gates.dev_questions else ""),
              "",
              "![F1 vs size](f1_vs_size.png)", "", "![F1 vs latency](f1_vs_latency.png)", ""]
    lines += bundle_lines(summary_data.get("bundle"))
    lines += gate_section(summary_data["gates"], cfg)
    lines += npu_lines(summary_data.get("npu") or {})
    if summary_data["full_size"]:
        lines += ["## Full-size architectures (random weights: sizes and speed only)", "",
                  artifact_table(summary_data["full_size"], cfg), "",
                  "| ratio | value |", "|---|---|"]
        lines += [f"| {name} | {fmt(value, 3)} |" for name, value in summary_data["ratios"].items()]
        if summary_data["gemm_floor"]:
            floor = summary_data["gemm_floor"]
            lines += ["", f"GEMM floor: the {floor['n_matmul_integer']} int8 MatMuls of full-size DistilBERT alone, "
                          f"seq {floor['sequence_length']}, 1 thread: {floor['latency_ms']:.1f} ms; "
                          f"distilbert/onnx-int8-optimized / floor = {fmt(floor['ratio'], 2)}."]
        lines.append("")
    if summary_data["peers"] or benchmark.get("peers_skipped"):
        lines += peer_section(summary_data["peers"], cfg, benchmark.get("peers_skipped"), benchmark.get("settings"))
    if benchmark.get("int8_search"):
        lines += search_section(benchmark["int8_search"])
    lines += ["## Goals", ""]
    if goal_rows:
        lines += ["| goal | target | measured | met |", "|---|---|---|---|"]
    else:
        lines.append("The speed and size goals are measured on the full-size architectures; "
                     "export.full_size.architectures is empty in this build, so none was measured.")
    for row in goal_rows:
        met = "n/a" if row["met"] is None else ("yes" if row["met"] else "**no**")
        lines.append(f"| {row['goal']} | {row['target']} | {fmt(row['value'], 2)} | {met} |")
    missed_speed = [row for row in goal_rows if row["speed"] and row["met"] is False]
    if missed_speed and benchmark.get("profiles"):
        lines += ["", f"Speed goals missed. Where the time goes (onnxruntime's profiler, OpenVINO's performance "
                      f"counters for its rows; seq {longest}, 1 thread, share of kernel time):", ""]
        for name, ops in benchmark["profiles"].items():
            lines.append(f"- {name}: " + ", ".join(f"{o['op']} {o['share']:.0%} ({o['ms_per_run']:.1f} ms)"
                                                    for o in ops[:6]))
        lines += [""] + speed_analysis(benchmark["profiles"], summary_data["gemm_floor"])
    if not cfg.deploy.model:  # a deployed model was trained elsewhere: no training logs here
        lines += ["", "## Training", "", "![Loss curves](loss_curves.png)", ""]
    return "\n".join(lines)
