"""The app bundle's contents: which files ship (each gated), qa_config.json, the app README and the int8 note.

The bundle always holds the fp32 ONNX graph (gated against PyTorch by its logits in export_onnx), and each
compressed file only when it passes its gates: the int8 graph quantize.json chose (re-gated here, as shipped,
through the torch-free answerer, and its ORT format), the CoreML packages that passed, and the OpenVINO x86
target and the Android NPU graphs when they pass here. When no int8 passes, the fp32 graph is the app's model (qa_config.json's onnx.model)
and one line says why (int8_note), in the terminal, metrics.json, the README and the report.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from pipeline.export import npu_graph
from pipeline.export.coreml import verify_gated_weights
from pipeline.export.gates import GateError, compressed_model_report, failure_lines, overall_verdict, ships
from pipeline.export.hf_layout import write_hf_layout
from pipeline.export.model_card import bundle_card, write_model_card
from pipeline.export.openvino_target import OPENVINO_FILE, OPENVINO_VARIANT
from pipeline.export.openvino_target import predict as openvino_predict
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes, read_json
from pipeline.outputs.manifests import config_sha256, files_manifest, library_versions, verify_manifest
from pipeline.plan.config import PipelineConfig
from pipeline.runtime import answering
from pipeline.spawn import in_spawned_process

logger = logging.getLogger(__name__)

FP32_NAME, FP32_ORT_NAME = "model.fp32.onnx", "model.fp32.ort"
INT8_NAME, INT8_ORT_NAME = "model.int8.onnx", "model.int8.ort"
COREML_WEIGHTS = {"fp16": "float16 weights", "int8": "int8 weights (per channel, symmetric)",
                  "4bit": "4-bit palettized weights (k-means lookup tables)",
                  "ane": "float16 weights in the Neural Engine layout ((B, C, 1, S) tensors, 1x1 convolutions, "
                         "per-head attention)"}


def coreml_weights(variant: str, cfg: PipelineConfig) -> str:
    if variant == "4bit" and not cfg.export.coreml.palettize_embeddings:
        return COREML_WEIGHTS[variant] + " in the linear layers, float16 embedding tables"
    return COREML_WEIGHTS[variant]
LIBRARIES = ("onnxruntime", "onnx", "optimum", "optimum-onnx", "transformers", "tokenizers", "torch", "coremltools",
             "openvino", "nncf", "numpy")


def convert_to_ort(onnx_path: Path, out_dir: Path) -> Path:
    """ORT format for ONNX Runtime Mobile; graph optimizations fixed at conversion time (the mobile default)."""
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    convert_onnx_models_to_ort(onnx_path, output_dir=out_dir, optimization_styles=[OptimizationStyle.Fixed])
    return out_dir / onnx_path.with_suffix(".ort").name


def qa_config(cfg: PipelineConfig, answerer: answering.QuestionAnswerer, coreml: dict, tokenizer_config: dict,
              model_file: str, ort_file: str, openvino_model: str | None = None, npu: dict | None = None) -> dict:
    session = answerer.session
    return {
        "format_version": 1,
        "task": "extractive-question-answering",
        "max_seq_length": cfg.squad.max_seq_length,
        "doc_stride": cfg.squad.doc_stride,
        "n_best_size": cfg.squad.n_best_size,
        "max_answer_length": cfg.squad.max_answer_length,
        "question_first": True,
        "tokenizer": {
            "file": "tokenizer.json",
            "vocab": "vocab.txt",
            "lowercase": bool(tokenizer_config.get("do_lower_case", True)),
            # BERT's rule: unset strip_accents follows lower-casing.
            "strip_accents": bool(tokenizer_config.get("strip_accents") if tokenizer_config.get("strip_accents")
                                  is not None else tokenizer_config.get("do_lower_case", True)),
            "special_tokens": {name: {"token": token, "id": answerer.tokenizer.token_to_id(token)}
                               for name, token in (("cls", "[CLS]"), ("sep", "[SEP]"), ("pad", "[PAD]"),
                                                   ("unk", "[UNK]"))},
        },
        "onnx": {
            "model": model_file,  # the int8 graph when one passed its gates, else the fp32 graph
            "ort_model": ort_file,
            "fp32_model": FP32_NAME,  # always shipped
            "int8": model_file == INT8_NAME,
            "inputs": [{"name": i.name, "dtype": i.type, "shape": i.shape} for i in session.get_inputs()],
            "outputs": [{"name": o.name, "dtype": o.type, "shape": o.shape} for o in session.get_outputs()],
        },
        # the x86 target: the same inputs and outputs as the ONNX graph; null when it did not ship
        "openvino": None if openvino_model is None else {"model": openvino_model},
        # Android NPU graphs (static int8, fixed shapes): one per length; null when they did not ship
        "android_npu": None if npu is None else {
            "models": {length: f"{npu_graph.NPU_FOLDER}/{graph['file']}" for length, graph in npu["graphs"].items()},
            "sequence_lengths": npu["sequence_lengths"],
            "inputs": [{"name": name, "dtype": "int32", "shape": [1, "L"]} for name in npu_graph.INPUTS],
            "outputs": [{"name": name, "dtype": "float32", "shape": [1, "L"]} for name in ("start_logits", "end_logits")],
            "execution_providers": ["QNN (HTP backend)", "NNAPI"],
            "fallback": ort_file,
        },
        "coreml": {
            "minimum_deployment_target": coreml["minimum_deployment_target"],
            "sequence_lengths": coreml["sequence_lengths"],
            "models": {variant: f"coreml/{package['path']}" for variant, package in coreml["packages"].items()},
            "weights": {variant: coreml_weights(variant, cfg) for variant in coreml["packages"]},
            "inputs": next(iter(coreml["packages"].values()))["inputs"] if coreml["packages"] else [],
            "outputs": next(iter(coreml["packages"].values()))["outputs"] if coreml["packages"] else [],
        },
    }


def shipped_coreml(coreml: dict) -> dict:
    """coreml.json with only the packages that passed their gates (a package with no dev verdict never ships) and
    `rejected` listing the others with why."""
    passed = {variant: package for variant, package in coreml["packages"].items()
              if (package.get("dev") or {}).get("passed") is True}
    rejected = {}
    for variant, package in coreml["packages"].items():
        if variant in passed:
            continue
        dev = package.get("dev")
        rejected[variant] = ("no dev verdict" if not dev else
                             "; ".join(line.strip() for line in failure_lines([{"name": variant, **dev}])) or
                             f"verdict {dev.get('verdict')}")
    if rejected:
        logger.warning("bundle: CoreML package(s) left out: %s", rejected)
    return {**coreml, "packages": passed, "rejected": sorted(rejected), "rejected_why": rejected}


def gate_verdicts(reports: dict[str, dict], coreml: dict) -> dict[str, dict]:
    """Each shipped file's verdict (proven or unproven) and, per gate, the dev questions that would decide an
    unproven one: the ONNX, ORT (and OpenVINO) models as scored here (`reports`, by their path in the bundle), the
    CoreML packages as export_coreml scored them."""
    def verdict(gates: dict, overall: str | None) -> dict:
        return {"verdict": overall,
                "questions_to_decide": {name: gate["questions_to_decide"] for name, gate in gates.items()
                                        if gate.get("questions_to_decide")}}

    found = {file: verdict(report["gates"], report["verdict"]) for file, report in reports.items()}
    for name, package in coreml["packages"].items():
        dev = package.get("dev") or {}
        found[f"coreml/{package['path']}"] = verdict(dev.get("gates", {}), dev.get("verdict"))
    return found


def gate_report(name: str, predictions: dict[str, str], questions, cfg: PipelineConfig) -> dict:
    """One shipped model's answers judged against the PyTorch model's by the int8 gates."""
    gates = cfg.export.gates
    return compressed_model_report(name, predictions, questions.pytorch_predictions, questions.gold,
                                   questions.pytorch_f1, gates.min_answer_agreement, gates.max_f1_drop, gates.strict)


def worked_example(answerer: answering.QuestionAnswerer, example: dict) -> dict:
    windows = answerer.windows([example])
    result = answerer.answer(example["question"], example["context"], n_best=3)
    first = windows.input_ids[0][: int(windows.attention_mask[0].sum())].tolist()
    return {
        "question": example["question"],
        "context": example["context"],
        "n_windows": len(windows),
        "first_window_tokens": [answerer.tokenizer.id_to_token(token_id) for token_id in first[:24]],
        "first_window_ids": first[:24],
        "answer": result,
    }


def token_types_step(config: dict) -> str:
    """The pre-processing line for token_type_ids, where the ONNX graph takes them (BERT, ELECTRA, MobileBERT)."""
    if "token_type_ids" not in [i["name"] for i in config["onnx"]["inputs"]]:
        return ""
    return ("\n   `token_type_ids` = 0 on [CLS], the question and its [SEP], 1 on the context and the last [SEP], 0 on "
            "padding\n   (the CoreML packages derive them inside).")


def unproven_note(metrics: dict) -> str:
    """A line for the app README when a shipped file's accuracy is within the gates by its estimate only."""
    if not metrics["unproven"]:
        return "Every shipped model is proven within the accuracy gates on these questions (`manifest.json`).\n"
    needed = {name: max(metrics["gate_verdicts"][name]["questions_to_decide"].values(), default=None)
              for name in metrics["unproven"]}
    listed = ", ".join(f"`{name}`" + (f" ({count:,} questions would decide it)" if count else "")
                       for name, count in needed.items())
    return (f"**Unproven**: {listed} met the accuracy gates by their estimate, but the dev set is too small to "
            "show it beyond noise (`manifest.json`: gate_verdicts).\n")


def onnx_rows(config: dict, metrics: dict) -> str:
    """The README's rows for the ONNX graphs: the int8 graph and its ORT format when one shipped, and the fp32
    graph (always; the app's model when no int8 passed)."""
    rows = []
    if config["onnx"]["int8"]:
        rows.append(f"| `{INT8_NAME}` | ONNX, 8-bit weights, for onnxruntime (desktop, web, React Native): the app's "
                    f"model; the `{metrics['onnx_variant']}` variant, chosen by {metrics['onnx_decided_by']} | "
                    f"{metrics['onnx_size_mb']} MB |")
        rows.append(f"| `{INT8_ORT_NAME}` | the same graph in ORT format, for ONNX Runtime Mobile (Android, iOS); "
                    "`model.int8.required_operators.config` lists its operators for a reduced-size runtime build | "
                    f"{metrics['ort_size_mb']} MB |")
        rows.append(f"| `{FP32_NAME}` | ONNX, float32: the model as trained (within "
                    f"{metrics['fp32_max_abs_logit_diff']:.2g} of PyTorch's logits), for when size does not matter "
                    f"| {metrics['fp32_size_mb']} MB |")
    else:
        rows.append(f"| `{FP32_NAME}` | ONNX, float32, for onnxruntime: the app's model (no int8 graph passed its "
                    f"gates), within {metrics['fp32_max_abs_logit_diff']:.2g} of PyTorch's logits | "
                    f"{metrics['fp32_size_mb']} MB |")
        rows.append(f"| `{FP32_ORT_NAME}` | the same graph in ORT format, for ONNX Runtime Mobile (Android, iOS) | "
                    f"{metrics['ort_size_mb']} MB |")
    return "\n".join(rows) + "\n"


def int8_line(metrics: dict) -> str:
    return f"**No int8 graph**: {metrics['int8_note']}\n" if metrics.get("int8_note") else ""


def coreml_line(metrics: dict) -> str:
    """What was executed for the CoreML packages here (CoreML itself runs only on macOS), and which to choose."""
    if not metrics["coreml_size_mb"]:
        return "No CoreML package passed its gates (`metrics.json`: rejected_by_gates).\n"
    choose = ("Which package: `ane.mlpackage` on devices with a Neural Engine (A12 and later, M1 and later), where its "
              "layout is the one Apple shows the Neural Engine runs fastest (its latency was not measured here); "
              "`4bit` or `int8` where download size matters most; `fp16` otherwise. " if "ane" in metrics["coreml_size_mb"]
              else "")
    return ("CoreML packages: gated on weights read from each package, run in PyTorch at float16 on this build "
            "machine (CoreML itself runs only on macOS); their accuracy: `manifest.json` gate_verdicts. "
            + choose + "\n")


def int8_note(quantized: dict, cfg: PipelineConfig) -> str | None:
    """One line when no int8 graph ships: the best int8 variant's F1 drop and what would help; None when one ships."""
    if quantized["bundle_choice"] is not None:
        return None
    scored = {name: variant for name, variant in quantized["variants"].items()
              if name.startswith("int8") and variant.get("f1_drop") is not None}
    if not scored:
        return "no int8 graph shipped: none could be built and scored (quantize.json: each variant's error)"
    best_name = min(scored, key=lambda name: scored[name]["f1_drop"])
    drop = scored[best_name]["gates"]["f1_drop"]
    low, high = drop["interval"]
    decide = drop.get("questions_to_decide")
    helps = []
    if decide:
        helps.append(f"about {decide:,} gated dev questions would decide it (a longer data.squad_dev)")
    else:
        helps.append("more dev questions (data.squad_dev) narrow the interval")
    if "qdq" not in cfg.export.quantize.search_formats or True not in cfg.export.quantize.search_per_channel:
        helps.append("static per-channel recipes (export.quantize.search_formats: [qoperator, qdq], "
                     "search_per_channel: [false, true])")
    helps.append(f"more layers back in fp32 (export.quantize.fallback.max_layers, now "
                 f"{cfg.export.quantize.fallback.max_layers})")
    missed = "; ".join(line.strip().removeprefix(f"{scored[best_name].get('name', best_name)}: ")
                       for line in failure_lines([{"name": best_name, **scored[best_name]}]))
    return (f"no int8 graph passed its gates: the best, {best_name}, lost {drop['value']} F1 (95 % interval {low} "
            f"to {high}; export.gates.max_f1_drop {drop['maximum']}) and missed {missed.removeprefix(best_name + ': ')}"
            f"; the bundle ships the fp32 graph. What would help: {'; '.join(helps)}.")


def openvino_row(config: dict, metrics: dict) -> str:
    """The README's row for the x86 target; nothing when it did not ship."""
    if not config.get("openvino"):
        return ""
    return (f"| `{config['openvino']['model']}` (+ `.bin`) | OpenVINO int8 (NNCF), for x86 desktops and servers with "
            f"the OpenVINO runtime; gated here at precision {metrics['openvino_precision']} for what is not int8 | "
            f"{metrics['openvino_size_mb']} MB |\n")


def npu_rows(config: dict, metrics: dict) -> str:
    """The README's rows for the Android NPU graphs; nothing when they did not ship."""
    if not config.get("android_npu"):
        return ""
    return "".join(f"| `{path}` | ONNX, static int8 (QDQ), fixed shape [1, {length}], for Android's NPU: onnxruntime's "
                   f"QNN execution provider (Snapdragon Hexagon) or NNAPI | {metrics['npu']['size_mb'][length]} MB |\n"
                   for length, path in config["android_npu"]["models"].items())


def npu_section(config: dict, metrics: dict) -> str:
    """How an Android app opens the NPU graphs, what was verified here, and why they are missing if they are."""
    npu = metrics.get("npu") or {}
    if not config.get("android_npu"):
        return f"- Android NPU: no graph shipped ({npu.get('why_not', 'not built')}).\n"
    emulator = npu.get("emulator") or {}
    checked = (f"on the QNN HTP backend's x86 emulation (htp_arch {emulator['htp_arch']}, soc_model "
               f"{emulator['soc_model']}) {emulator['n_questions']} of the gated questions gave the CPU execution "
               f"provider's answer {npu_graph.emulator_agreement(emulator['agreement_with_cpu'])['value']:.0%} of "
               f"the time (largest logit "
               f"difference {emulator['max_abs_logit_diff_vs_cpu']})" if emulator.get("ran") else
               f"the NPU's own arithmetic was not checked here: {emulator.get('reason', 'no emulation')}")
    fallback = config["android_npu"]["fallback"]
    return f"""- Android NPU: `{config['android_npu']['models'][str(min(config['android_npu']['sequence_lengths']))]}` and the
  other lengths: inputs `input_ids`, `attention_mask`, int32 [1, L] with L one of
  {config['android_npu']['sequence_lengths']} (pad the window to the shortest that holds it, [PAD] id, mask 0; token
  types are derived inside). Open it with the QNN execution provider (package `onnxruntime-android-qnn`:
  `SessionOptions.addQnn(mapOf("backend_path" to "libQnnHtp.so"))`, or `addNnapi()`); where the session cannot
  be created on that device, open `{fallback}` on the CPU instead. Gated here on the CPU execution provider,
  each window alone ({npu['verdict']}); {checked}.
"""


def app_readme(config: dict, metrics: dict, example: dict) -> str:
    onnx_inputs = ", ".join(f"`{i['name']}` ({i['dtype']}, {i['shape']})" for i in config["onnx"]["inputs"])
    coreml_inputs = ", ".join(f"`{i['name']}`" for i in config["coreml"]["inputs"]) or "(no CoreML variant built)"
    candidates = "\n".join(f"| {c['text']!s} | {c['start']} | {c['end']} | {c['score']:.3f} |"
                           for c in example["answer"]["n_best"])
    return f"""# Question-answering bundle

Extractive question answering: give a question and a context, get the span of the context that answers it.
Everything here runs on the device; `manifest.json` lists the sha256 of every file.

| file | what it is | size |
|---|---|---|
{onnx_rows(config, metrics)}{openvino_row(config, metrics)}{npu_rows(config, metrics)}{''.join(f"| `{path}` | CoreML mlprogram, {config['coreml']['weights'][variant]}, {config['coreml']['minimum_deployment_target']}+ | {metrics['coreml_size_mb'][variant]} MB |" + chr(10) for variant, path in config['coreml']['models'].items())}| `tokenizer.json`, `vocab.txt` | BERT WordPiece tokenizer (lower-case: {config['tokenizer']['lowercase']}, strip accents: {config['tokenizer']['strip_accents']}) | |
| `qa_config.json` | every setting below, machine-readable | |

Dev set of this build ({metrics['n_questions']} gated questions): exact match {metrics['exact_match']}, F1 {metrics['f1']}
(`{config['onnx']['model']}` through the torch-free answerer; the PyTorch model: F1 {metrics['pytorch_f1']}).
{int8_line(metrics)}{unproven_note(metrics)}{coreml_line(metrics)}
## Inputs and outputs
- ONNX: {onnx_inputs}. Outputs `start_logits`, `end_logits`: float32 [batch, sequence], one score per token.
  Run one question's windows a call, never batched with another question's, padded to the longest of them: a
  dynamic int8 graph computes its activation scales over the whole input, so this is the computation the gates
  scored.
- CoreML: {coreml_inputs}, int32, shape [1, L] with L one of {config['coreml']['sequence_lengths']}
  (pad the window to the next length). Outputs `start_logits`, `end_logits`: float32 [1, L].
  {"The mask is derived inside the model (input_ids != [PAD])." if len(config['coreml']['inputs']) == 1 else "attention_mask is 1 on real tokens, 0 on padding."}
{npu_section(config, metrics)}
## Pre-processing
1. Tokenize question and context as a pair with `tokenizer.json` (BERT normalizer, lower-casing and accent
   stripping as configured, WordPiece): `[CLS] question [SEP] context [SEP]`. Strip leading spaces of the question.
2. If it does not fit in `max_seq_length` = {config['max_seq_length']} tokens, cut the context into windows:
   each window holds the whole question and as much context as fits; consecutive windows share
   `doc_stride` = {config['doc_stride']} context tokens.
3. Keep each context token's character offsets [start, end) in the original context.
4. `attention_mask` = 1 on real tokens, pad `input_ids` with the [PAD] id ({config['tokenizer']['special_tokens']['pad']['id']}).{token_types_step(config)}

## Post-processing
5. In each window take the {config['n_best_size']} highest start and the {config['n_best_size']} highest end logits among
   its context tokens (never [CLS], the question, [SEP] or padding; equal logits: the later token first). Keep
   pairs with end >= start and end - start + 1 <= {config['max_answer_length']}; score = start + end logit.
6. The best pair over all windows is the answer. Cut its text from the original context with the offsets
   (start of the first token, end of the last): the answer keeps the context's case and accents.

The torch-free answerer `pipeline/runtime/answering.py` is the specification to port (onnxruntime + tokenizers + numpy):
`python -m pipeline answer --bundle <this folder> --question "..." --context "..."`.

## Worked example (from this build)
Question: {example['question']}

Context: {example['context']}

The pair gives {example['n_windows']} window(s); the first one starts with
`{' '.join(example['first_window_tokens'])}` = ids `{example['first_window_ids']}`.

| candidate | start char | end char | score |
|---|---|---|---|
{candidates}

Answer: **{example['answer']['answer']}** (context characters {example['answer']['start']}-{example['answer']['end']}).
"""




# ---------------------------------------------------------------------------------------------- the bundle


def fp32_parity(onnx_dir: Path) -> dict:
    """export_onnx's parity report of the fp32 graph; the bundle has nothing to ship when it missed its gate."""
    reports = {report["name"]: report for report in read_json(onnx_dir / "parity.json")["reports"]}
    report = reports.get("fp32")
    if report is None or report.get("passed") is not True:
        missed = failure_lines([report]) if report else ["  fp32: no parity report"]
        raise GateError("\n".join([f"{onnx_dir}/parity.json: the fp32 ONNX graph missed its parity gate against "
                                   "PyTorch, nothing to bundle:", *missed]))
    return report


def answer_and_gate(path: Path, name: str, tokenizer: Path, questions, cfg: PipelineConfig) -> tuple[dict, dict]:
    """A shipped ONNX or ORT file's answers through the torch-free answerer, judged against PyTorch's."""
    answerer = answering.QuestionAnswerer.with_squad_settings(path, tokenizer, cfg.squad, threads=1)
    predictions = answerer.predict(questions.examples)
    return predictions, gate_report(name, predictions, questions, cfg)


def regate_openvino(tmp: Path, out_dir: Path, quantized_dir: Path, x86: dict, questions, cfg: PipelineConfig):
    """The x86 target copied into tmp/openvino and answered from there: its report, or the reason it is left out
    (a miss or an error here is recorded as a rejection, never shipped)."""
    (tmp / "openvino").mkdir()
    model_xml = quantized_dir / x86["path"]
    for path in (model_xml, model_xml.with_suffix(".bin")):
        shutil.copy(path, tmp / "openvino" / path.name)
    path = tmp / "openvino" / OPENVINO_FILE
    try:
        predictions = in_spawned_process(openvino_predict, path, tmp / "tokenizer.json", cfg.squad,
                                         questions.examples, 1, libraries=("openvino",))
    except Exception as error:  # the runtime could not answer from the bundle: left out, saying why
        shutil.rmtree(tmp / "openvino")
        return None, f"answering from the bundle failed: {type(error).__name__}: {str(error).splitlines()[0]}"
    report = gate_report(f"{out_dir}/openvino/{OPENVINO_FILE}", predictions, questions, cfg)
    if not report["passed"]:
        shutil.rmtree(tmp / "openvino")
        return None, "missed its gates when answered from the bundle: " + "; ".join(
            line.strip() for line in failure_lines([report]))
    return report, None


def ship_npu_graphs(tmp: Path, out_dir: Path, npu_dir: Path, questions, cfg: PipelineConfig):
    """The Android NPU graphs copied into tmp/android-npu and answered from there on the CPU execution provider, each
    window alone on the shortest graph that holds it, with export_npu's emulator gate: (npu.json, the report, None),
    or (npu.json, None, why they are left out)."""
    npu = read_json(npu_dir / "npu.json")
    if not npu["passed"]:
        return npu, None, "rejected in export_npu: " + ("; ".join(line.strip() for line in failure_lines([npu["dev"]]))
                                                        or f"verdict {npu['verdict']}")
    shutil.copytree(npu_dir / npu_graph.NPU_FOLDER, tmp / npu_graph.NPU_FOLDER)
    graphs = {int(length): tmp / npu_graph.NPU_FOLDER / graph["file"] for length, graph in npu["graphs"].items()}
    tokenizer = answering.QuestionAnswerer.with_squad_settings(tmp / FP32_NAME, tmp / "tokenizer.json", cfg.squad)
    windows = tokenizer.windows(questions.examples)
    answers = npu_graph.answers(npu_graph.cpu_sessions(graphs), questions.examples, windows, cfg)
    report = gate_report(f"{out_dir}/{npu_graph.NPU_FOLDER}/", answers.predictions, questions, cfg)
    if "npu" in npu["dev"]["gates"]:  # the emulated NPU's check, made on the same graphs
        report["gates"]["npu"] = npu["dev"]["gates"]["npu"]
        report["verdict"] = overall_verdict(report["gates"])
        report["passed"] = ships(report["verdict"], cfg.export.gates.strict)
    if not report["passed"]:
        shutil.rmtree(tmp / npu_graph.NPU_FOLDER)
        return npu, None, "missed its gates when answered from the bundle: " + "; ".join(
            line.strip() for line in failure_lines([report]))
    return npu, report, None


def npu_metrics(npu: dict | None, report: dict | None, why_not: str | None, tmp: Path) -> dict:
    """metrics.json's record of the Android NPU graphs: sizes, verdict and the emulator's check, or why not."""
    if npu is None:
        return {"shipped": False, "why_not": why_not}
    return {"shipped": report is not None, "why_not": why_not,
            "size_mb": ({length: megabytes((tmp / npu_graph.NPU_FOLDER / graph["file"]).stat().st_size)
                         for length, graph in npu["graphs"].items()} if report else None),
            "verdict": report["verdict"] if report else npu["verdict"],
            "emulator": {key: value for key, value in npu["emulator"].items() if key != "question_ids"}}


def judged_by_parity(report: dict, parity: dict) -> dict:
    """An fp32 file's report: its answers recorded, its verdict the fp32 graph's parity with PyTorch (rounding only,
    no sampling noise for the answer gates to judge)."""
    return {**report, "gates": parity["gates"], "verdict": parity["verdict"], "passed": True}


def write_bundle(tmp: Path, out_dir: Path, cfg: PipelineConfig, onnx_dir: Path, quantized_dir: Path,
                 coreml_dir: Path, model_dir: Path, data_dir: Path, questions, npu_dir: Path | None = None) -> dict:
    """Every file of the bundle into tmp, each compressed one re-gated as shipped; returns metrics.json.
    npu_dir: export_npu's output (None: no Android NPU graphs were built)."""
    parity = fp32_parity(onnx_dir)
    quantized = read_json(quantized_dir / "quantize.json")
    coreml = shipped_coreml(read_json(coreml_dir / "coreml.json"))
    fp32_dir = onnx_dir / "fp32"
    shutil.copy(fp32_dir / "model.onnx", tmp / FP32_NAME)
    for name in ("tokenizer.json", "vocab.txt"):
        shutil.copy(fp32_dir / name, tmp / name)
    (tmp / "coreml").mkdir()
    for variant, package in list(coreml["packages"].items()):
        shutil.copytree(coreml_dir / package["path"], tmp / "coreml" / package["path"])
        try:  # the package shipped must carry the weights its gate scored
            verify_gated_weights(tmp / "coreml" / package["path"], package["dev"]["read_back"]["weights_sha256"])
        except (GateError, KeyError) as error:
            shutil.rmtree(tmp / "coreml" / package["path"])
            del coreml["packages"][variant]
            coreml["rejected"] = sorted([*coreml["rejected"], variant])
            coreml["rejected_why"][variant] = f"its weights are not the ones gated: {error}".splitlines()[0]
            logger.warning("bundle: CoreML %s left out: %s", variant, coreml["rejected_why"][variant])
    reports, predictions = {}, {}
    predictions[FP32_NAME], fp32_report = answer_and_gate(tmp / FP32_NAME, f"{out_dir}/{FP32_NAME}",
                                                       tmp / "tokenizer.json", questions, cfg)
    reports[FP32_NAME] = judged_by_parity(fp32_report, parity)
    choice, int8_rejected_here = quantized["bundle_choice"], None
    if choice is not None:
        shutil.copy(quantized_dir / choice / "model.onnx", tmp / INT8_NAME)
        ort_path = convert_to_ort(tmp / INT8_NAME, tmp)
        int8_reports = {}
        for file, path in ((INT8_NAME, tmp / INT8_NAME), (INT8_ORT_NAME, ort_path)):
            predictions[file], int8_reports[file] = answer_and_gate(path, f"{out_dir}/{file}", tmp / "tokenizer.json",
                                                                   questions, cfg)
        if all(report["passed"] for report in int8_reports.values()):
            reports.update(int8_reports)
        else:  # quantize.json's choice missed its gates as shipped: left out, the fp32 graph is the app's model
            int8_rejected_here = "; ".join(line.strip() for line in failure_lines(list(int8_reports.values())))
            logger.warning("bundle: %s left out, it missed its gates as shipped: %s", choice, int8_rejected_here)
            for leftover in tmp.glob("model.int8.*"):
                leftover.unlink()
            choice = None
    if choice is None:
        ort_path = convert_to_ort(tmp / FP32_NAME, tmp)
        predictions[FP32_ORT_NAME], ort_report = answer_and_gate(
            ort_path, f"{out_dir}/{FP32_ORT_NAME}", tmp / "tokenizer.json", questions, cfg)
        reports[FP32_ORT_NAME] = judged_by_parity(ort_report, parity)  # the fp32 graph in another file format
    model_file, ort_file = (INT8_NAME, INT8_ORT_NAME) if choice else (FP32_NAME, FP32_ORT_NAME)
    x86, x86_rejected = quantized["variants"].get(OPENVINO_VARIANT), None
    if x86 and x86["passed"]:
        report, x86_rejected = regate_openvino(tmp, out_dir, quantized_dir, x86, questions, cfg)
        if report:
            reports[f"openvino/{OPENVINO_FILE}"] = report
        else:
            logger.warning("bundle: %s left out: %s", OPENVINO_VARIANT, x86_rejected)
    elif x86:
        x86_rejected = "rejected in quantize_onnx: " + (x86.get("error") or f"verdict {x86['verdict']}")
    npu, npu_report, npu_why_not = (ship_npu_graphs(tmp, out_dir, npu_dir, questions, cfg) if npu_dir is not None
                                    else (None, None, "export.npu.enabled is false"))
    if npu_report:
        reports[f"{npu_graph.NPU_FOLDER}/"] = npu_report
    elif npu_why_not:
        logger.warning("bundle: the Android NPU graphs are left out: %s", npu_why_not)
    answerer = answering.QuestionAnswerer.with_squad_settings(tmp / model_file, tmp / "tokenizer.json", cfg.squad,
                                                            threads=1)
    tokenizer_config = read_json(fp32_dir / "tokenizer_config.json") if (fp32_dir / "tokenizer_config.json").is_file() else {}
    openvino_shipped = f"openvino/{OPENVINO_FILE}" in reports
    config = qa_config(cfg, answerer, coreml, tokenizer_config, model_file, ort_file,
                       f"openvino/{OPENVINO_FILE}" if openvino_shipped else None, npu if npu_report else None)
    atomic_write_json(tmp / "qa_config.json", config)
    main_report = reports[model_file]
    verdicts = gate_verdicts(reports, coreml)
    note = None if choice else int8_note(quantized, cfg) if int8_rejected_here is None else (
        f"no int8 graph passed its gates as shipped: {quantized['bundle_choice']} ({int8_rejected_here}); the "
        "bundle ships the fp32 graph")
    if note:
        logger.warning("bundle: %s", note)
    metrics = {
        "onnx_model": model_file,
        "ort_model": ort_file,
        "onnx_variant": choice or "fp32",
        "onnx_runner_up": quantized["runner_up"] if choice else None,
        "onnx_decided_by": quantized["decided_by"] if choice else "no int8 graph passed its gates",
        "int8_note": note,
        "onnx_size_mb": megabytes(directory_size_bytes(tmp / model_file)),
        "ort_size_mb": megabytes(directory_size_bytes(tmp / ort_file)),
        "fp32_size_mb": megabytes(directory_size_bytes(tmp / FP32_NAME)),
        "fp32_max_abs_logit_diff": parity["max_abs_logit_diff"],
        "fp32_f1": fp32_report["f1"],
        "coreml_size_mb": {variant: megabytes(directory_size_bytes(tmp / "coreml" / package["path"]))
                           for variant, package in coreml["packages"].items()},
        "coreml_executed": "weights read from each package, run in PyTorch at float16 (CoreML runs only on macOS)",
        "rejected_by_gates": {
            "onnx_int8": sorted({name for name in quantized["not_shipped"] if name != OPENVINO_VARIANT}
                                | ({quantized["bundle_choice"]} if int8_rejected_here else set())),
            "coreml": coreml["rejected"],
            "openvino": [OPENVINO_VARIANT] if x86_rejected else [],
            "android_npu": [npu_graph.NPU_FOLDER] if npu is not None and npu_report is None else []},
        "rejected_why": {**({quantized["bundle_choice"]: int8_rejected_here} if int8_rejected_here else {}),
                         **{f"coreml-{name}": why for name, why in coreml["rejected_why"].items()},
                         **({OPENVINO_VARIANT: x86_rejected} if x86_rejected else {}),
                         **({npu_graph.NPU_FOLDER: npu_why_not} if npu is not None and npu_why_not else {})},
        "shipped": sorted(reports) + [f"coreml/{package['path']}" for package in coreml["packages"].values()],
        "n_questions": len(questions.examples),
        "exact_match": main_report["exact_match"],
        "f1": main_report["f1"],
        "pytorch_f1": questions.pytorch_f1,
        "answer_agreement_with_pytorch": {name: report["answer_agreement"] for name, report in reports.items()},
        "openvino_size_mb": megabytes(directory_size_bytes(tmp / "openvino")) if openvino_shipped else None,
        "openvino_precision": x86["runtime_precision"] if openvino_shipped else None,
        "ort_answers_equal_onnx": round(sum(predictions[ort_file][k] == v for k, v in predictions[model_file].items())
                                        / len(questions.examples), 4),
        "npu": npu_metrics(npu, npu_report, npu_why_not, tmp),
        "gate_verdicts": verdicts,
        "unproven": sorted(name for name, verdict in verdicts.items() if verdict["verdict"] == "unproven"),
    }
    atomic_write_json(tmp / "metrics.json", metrics)
    readme = app_readme(config, metrics, worked_example(answerer, questions.examples[0]))
    write_model_card(bundle_card(cfg, metrics, readme, model_dir, data_dir), tmp)  # the README with card metadata
    write_hf_layout(fp32_dir, tmp / model_file, tmp / "huggingface", quantized=choice is not None)
    atomic_write_json(tmp / "manifest.json", {
        "files": files_manifest(tmp),
        "library_versions": library_versions(LIBRARIES),
        "config_sha256": config_sha256(cfg),
        # What the gates could show for each shipped model: proven within every threshold, or unproven (within
        # by its point estimate, its interval straddling the threshold).
        "gate_verdicts": verdicts,
        "built_from": {"onnx": str(onnx_dir), "quantized": str(quantized_dir), "coreml": str(coreml_dir),
                       "npu": str(npu_dir) if npu_dir else None, "model": str(model_dir)},
    })
    verify_manifest(tmp)
    return metrics
