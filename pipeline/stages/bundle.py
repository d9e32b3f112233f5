"""Stage bundle: the folder an app ships, built from the distilled student's exports (or the deployed model's).

artifacts/bundle/
  model.int8.onnx           quantize.json's bundle_choice: of the int8 graphs that passed their gates and are as
                            accurate as the best, the fastest
  model.int8.ort            the same graph in ORT format for ONNX Runtime Mobile (+ its required-operators list)
  coreml/*.mlpackage        every CoreML variant (fp16, int8, 4-bit) that passed its gates
  tokenizer.json, vocab.txt the WordPiece tokenizer (vocab.txt for ports without a tokenizers library)
  qa_config.json            windowing and n-best settings, input/output names and types, file names
  README.md                 the contract for app developers, with a worked example from this build
  metrics.json              dev scores of the bundled model through the torch-free answerer
  openvino/                 the x86 target when it passed its gates: NNCF's int8 as an OpenVINO model
                            (openvino_model.xml + .bin), for desktops and servers with the OpenVINO runtime
  huggingface/              the same int8 graph in the Hugging Face layout (config.json, tokenizer files,
                            onnx/model_quantized.onnx) that transformers.js and optimum load as it is
  manifest.json             sha256 and bytes of every file, library versions, the hash of the config that built it
The rule answers every dev question with the bundled ONNX, .ort (and OpenVINO) models through pipeline/runtime/answering.py
(no torch) and holds them to the int8 gates against the PyTorch student.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from pipeline.export.gates import GateError, compressed_model_report, failure_lines, gate_questions, raise_for_failures
from pipeline.export.hf_layout import write_hf_layout
from pipeline.export.model_card import bundle_card, write_model_card
from pipeline.export.openvino_target import OPENVINO_FILE, OPENVINO_VARIANT
from pipeline.export.openvino_target import predict as openvino_predict
from pipeline.outputs.artifacts import atomic_write_json, directory_size_bytes, megabytes, read_json
from pipeline.outputs.manifests import (atomic_output_dir, config_sha256, files_manifest, library_versions,
                                        verify_input_dirs, verify_manifest)
from pipeline.plan.config import PipelineConfig
from pipeline.runtime import answering
from pipeline.spawn import in_spawned_process

logger = logging.getLogger(__name__)

ONNX_NAME, ORT_NAME = "model.int8.onnx", "model.int8.ort"
COREML_WEIGHTS = {"fp16": "float16 weights", "int8": "int8 weights (per channel, symmetric)",
                  "4bit": "4-bit palettized weights (k-means lookup tables)"}


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
              openvino_model: str | None = None) -> dict:
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
            "model": ONNX_NAME,
            "ort_model": ORT_NAME,
            "inputs": [{"name": i.name, "dtype": i.type, "shape": i.shape} for i in session.get_inputs()],
            "outputs": [{"name": o.name, "dtype": o.type, "shape": o.shape} for o in session.get_outputs()],
        },
        # the x86 target: the same inputs and outputs as the ONNX graph; null when it did not ship
        "openvino": None if openvino_model is None else {"model": openvino_model},
        "coreml": {
            "minimum_deployment_target": coreml["minimum_deployment_target"],
            "sequence_lengths": coreml["sequence_lengths"],
            "models": {variant: f"coreml/{package['path']}" for variant, package in coreml["packages"].items()},
            "weights": {variant: coreml_weights(variant, cfg) for variant in coreml["packages"]},
            "inputs": next(iter(coreml["packages"].values()))["inputs"] if coreml["packages"] else [],
            "outputs": next(iter(coreml["packages"].values()))["outputs"] if coreml["packages"] else [],
        },
    }


def shipped_coreml(coreml: dict, cfg: PipelineConfig, coreml_dir: Path) -> dict:
    """coreml.json with only the packages that passed their gates (a package scored on no dev set counts as
    passed) and `rejected` listing the others; stops when CoreML variants were built and none passed: the bundle
    ships CoreML."""
    passed = {variant: package for variant, package in coreml["packages"].items()
              if package.get("dev", {}).get("passed") is not False}
    if coreml["packages"] and not passed:
        missed = failure_lines([{"name": variant, "gates": package["dev"]["gates"]}
                                for variant, package in coreml["packages"].items()])
        raise GateError("\n".join([f"{coreml_dir}/coreml.json: no CoreML package passed its gates "
                                   f"({', '.join(coreml['packages'])} all rejected), nothing of that format to "
                                   "bundle:", *missed]))
    return {**coreml, "packages": passed, "rejected": sorted(set(coreml["packages"]) - set(passed))}


def gate_verdicts(reports: dict[str, dict], coreml: dict) -> dict[str, dict]:
    """Each shipped file's verdict (proven or unproven) and, per gate, the dev questions that would decide an
    unproven one: the ONNX, ORT (and OpenVINO) models as scored here (`reports`, by their path in the bundle), the
    CoreML packages as export_coreml scored them."""
    def verdict(gates: dict, overall: str | None) -> dict:
        return {"verdict": overall or "unscored",
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


def openvino_row(config: dict, metrics: dict) -> str:
    """The README's row for the x86 target; nothing when it did not ship."""
    if not config.get("openvino"):
        return ""
    return (f"| `{config['openvino']['model']}` (+ `.bin`) | OpenVINO int8 (NNCF), for x86 desktops and servers with "
            f"the OpenVINO runtime; gated here at precision {metrics['openvino_precision']} for what is not int8 | "
            f"{metrics['openvino_size_mb']} MB |\n")


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
| `{ONNX_NAME}` | ONNX, 8-bit weights, for onnxruntime (desktop, web, React Native); the `{metrics['onnx_variant']}` variant, chosen by {metrics['onnx_decided_by']} | {metrics['onnx_size_mb']} MB |
| `{ORT_NAME}` | the same graph in ORT format, for ONNX Runtime Mobile (Android, iOS); `model.int8.required_operators.config` lists its operators for a reduced-size runtime build | {metrics['ort_size_mb']} MB |
{openvino_row(config, metrics)}{''.join(f"| `{path}` | CoreML mlprogram, {config['coreml']['weights'][variant]}, {config['coreml']['minimum_deployment_target']}+ | {metrics['coreml_size_mb'][variant]} MB |" + chr(10) for variant, path in config['coreml']['models'].items())}| `tokenizer.json`, `vocab.txt` | BERT WordPiece tokenizer (lower-case: {config['tokenizer']['lowercase']}, strip accents: {config['tokenizer']['strip_accents']}) | |
| `qa_config.json` | every setting below, machine-readable | |

Dev set of this build ({metrics['n_questions']} questions): exact match {metrics['exact_match']}, F1 {metrics['f1']}
(ONNX int8 through the torch-free answerer; the PyTorch model: F1 {metrics['pytorch_f1']}).
{unproven_note(metrics)}
## Inputs and outputs
- ONNX: {onnx_inputs}. Outputs `start_logits`, `end_logits`: float32 [batch, sequence], one score per token.
- CoreML: {coreml_inputs}, int32, shape [1, L] with L one of {config['coreml']['sequence_lengths']}
  (pad the window to the next length). Outputs `start_logits`, `end_logits`: float32 [1, L].
  {"The mask is derived inside the model (input_ids != [PAD])." if len(config['coreml']['inputs']) == 1 else "attention_mask is 1 on real tokens, 0 on padding."}

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


def run(cfg: PipelineConfig, quantized_dir: Path, coreml_dir: Path, model_dir: Path, data_dir: Path,
        out_dir: Path) -> dict:
    verify_input_dirs(quantized_dir, coreml_dir, model_dir, data_dir)

    quantized = read_json(quantized_dir / "quantize.json")
    choice = quantized["bundle_choice"]
    if choice is None:
        missed = failure_lines([{"name": name, **variant} for name, variant in quantized["variants"].items()])
        raise GateError("\n".join([f"{quantized_dir}/quantize.json: no int8 variant passed its gates, nothing to "
                                   "bundle:", *missed]))
    coreml = shipped_coreml(read_json(coreml_dir / "coreml.json"), cfg, coreml_dir)
    questions = gate_questions(data_dir, model_dir, cfg.export.gates.dev_questions)
    examples = questions.examples
    source = quantized_dir / choice

    with atomic_output_dir(out_dir, cfg) as tmp:
        shutil.copy(source / "model.onnx", tmp / ONNX_NAME)
        for name in ("tokenizer.json", "vocab.txt"):
            shutil.copy(source / name, tmp / name)
        ort_path = convert_to_ort(tmp / ONNX_NAME, tmp)
        (tmp / "coreml").mkdir()
        for package in coreml["packages"].values():
            shutil.copytree(coreml_dir / package["path"], tmp / "coreml" / package["path"])
        shipped = {"onnx": tmp / ONNX_NAME, "ort": ort_path}
        reports, predictions = [], {}
        for name, path in shipped.items():
            answerer = answering.QuestionAnswerer.with_squad_settings(path, tmp / "tokenizer.json", cfg.squad, threads=1)
            predictions[name] = answerer.predict(examples)
            reports.append(gate_report(f"{out_dir}/{path.relative_to(tmp)}", predictions[name], questions, cfg))
        raise_for_failures(reports, str(out_dir))
        # The x86 target, judged apart: an optional model that misses its gates here is left out, never fatal.
        x86 = quantized["variants"].get(OPENVINO_VARIANT)
        x86_rejected = bool(x86) and x86["verdict"] == "rejected"
        if x86 and x86["passed"]:
            (tmp / "openvino").mkdir()
            model_xml = quantized_dir / x86["path"]
            for path in (model_xml, model_xml.with_suffix(".bin")):
                shutil.copy(path, tmp / "openvino" / path.name)
            path = tmp / "openvino" / OPENVINO_FILE
            predictions["openvino"] = in_spawned_process(openvino_predict, path, tmp / "tokenizer.json", cfg.squad,
                                                         examples, 1)
            report = gate_report(f"{out_dir}/openvino/{OPENVINO_FILE}", predictions["openvino"], questions, cfg)
            if report["passed"]:
                shipped["openvino"] = path
                reports.append(report)
            else:
                logger.warning("bundle: %s left out: it missed its gates when answered from the bundle",
                               OPENVINO_VARIANT)
                shutil.rmtree(tmp / "openvino")
                x86_rejected = True
        answerer = answering.QuestionAnswerer.with_squad_settings(tmp / ONNX_NAME, tmp / "tokenizer.json", cfg.squad,
                                                                threads=1)
        tokenizer_config = read_json(source / "tokenizer_config.json") if (source / "tokenizer_config.json").is_file() else {}
        config = qa_config(cfg, answerer, coreml, tokenizer_config,
                           f"openvino/{OPENVINO_FILE}" if "openvino" in shipped else None)
        atomic_write_json(tmp / "qa_config.json", config)
        onnx_report = reports[0]
        verdicts = gate_verdicts(
            {str(path.relative_to(tmp)): report for path, report in zip(shipped.values(), reports)}, coreml)
        metrics = {
            "onnx_variant": choice,
            "onnx_runner_up": quantized["runner_up"],
            "onnx_decided_by": quantized["decided_by"],
            "onnx_size_mb": megabytes(directory_size_bytes(tmp / ONNX_NAME)),
            "ort_size_mb": megabytes(directory_size_bytes(ort_path)),
            "coreml_size_mb": {variant: megabytes(directory_size_bytes(tmp / "coreml" / package["path"]))
                               for variant, package in coreml["packages"].items()},
            "rejected_by_gates": {"onnx_int8": [name for name in quantized.get("rejected", []) if name != OPENVINO_VARIANT],
                                  "coreml": coreml["rejected"],
                                  "openvino": [OPENVINO_VARIANT] if x86_rejected else []},
            "n_questions": len(examples),
            "exact_match": onnx_report["exact_match"],
            "f1": onnx_report["f1"],
            "pytorch_f1": questions.pytorch_f1,
            "answer_agreement_with_pytorch": {name: report["answer_agreement"] for name, report in zip(shipped, reports)},
            "openvino_size_mb": (megabytes(directory_size_bytes(tmp / "openvino")) if "openvino" in shipped
                                 else None),
            "openvino_precision": x86["runtime_precision"] if "openvino" in shipped else None,
            "ort_answers_equal_onnx": sum(predictions["ort"][k] == v for k, v in predictions["onnx"].items()) / len(examples),
            "gate_verdicts": verdicts,
            "unproven": sorted(name for name, verdict in verdicts.items() if verdict["verdict"] == "unproven"),
        }
        atomic_write_json(tmp / "metrics.json", metrics)
        readme = app_readme(config, metrics, worked_example(answerer, examples[0]))
        write_model_card(bundle_card(cfg, metrics, readme, model_dir, data_dir), tmp)  # the app README with model-card metadata
        write_hf_layout(source, tmp / ONNX_NAME, tmp / "huggingface")
        atomic_write_json(tmp / "manifest.json", {
            "files": files_manifest(tmp),
            "library_versions": library_versions(LIBRARIES),
            "config_sha256": config_sha256(cfg),
            # What the gates could show for each shipped model: proven within every threshold, or unproven (within
            # by its point estimate, its interval straddling the threshold).
            "gate_verdicts": verdicts,
            "built_from": {"quantized": str(quantized_dir), "coreml": str(coreml_dir), "model": str(model_dir)},
        })
        verify_manifest(tmp)
    logger.info("bundle: %s", json.dumps(metrics))
    return metrics


# `python -m pipeline bundle`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "quantized_dir": "output of quantize_onnx (the bundled model)",
    "coreml_dir": "output of export_coreml (the bundled model)",
    "model_dir": "the PyTorch model (dev predictions and F1)",
}
