"""Stage export_npu: a trained QA model -> Android NPU graphs (pipeline/export/npu_graph.py), gated.

One static int8 (QDQ) ONNX graph per length of export.coreml.sequence_lengths, inputs int32 [1, length], built with
onnxruntime's QNN recipe and calibrated on tuning questions (never gated ones), windows padded as an app pads them.
Each graph is read back: fixed shapes, no dynamic int8 operator, and NNAPI's partitioning of it. The set is gated
like every int8 variant on the gated dev questions, on this machine's CPU execution provider, each window alone on
the shortest graph that holds it (what the app runs). Then the NPU's own arithmetic: the first
export.npu.emulator_questions gated questions through the QNN HTP backend's x86 emulation (onnxruntime-qnn, CPU
fallback off, so an open session also proves QNN takes every node), against the CPU execution provider's answers;
a significant disagreement is the `npu` gate's miss. Where the emulation cannot run, npu.json says why.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.export import npu_graph
from pipeline.export.coreml import load_wrapped
from pipeline.export.gates import compressed_model_report, gate_questions, overall_verdict, ships
from pipeline.export.int8_tuning import tuning_records, window_question_ids
from pipeline.outputs.artifacts import atomic_write_json, megabytes
from pipeline.outputs.manifests import atomic_output_dir, verify_input_dirs
from pipeline.plan.config import PipelineConfig
from pipeline.runtime import answering, squad

logger = logging.getLogger(__name__)


def run(cfg: PipelineConfig, model_dir: Path, data_dir: Path, out_dir: Path) -> dict:
    verify_input_dirs(model_dir, data_dir)
    lengths = sorted(cfg.export.coreml.sequence_lengths)  # the longest holds a whole window (checked at load)
    questions = gate_questions(data_dir, model_dir, cfg)
    tuning, tuning_source = tuning_records(data_dir, cfg)
    with atomic_output_dir(out_dir, cfg) as tmp:
        graphs_dir, scratch = tmp / npu_graph.NPU_FOLDER, tmp / "float-graphs"
        graphs_dir.mkdir()
        scratch.mkdir()
        float_graphs = npu_graph.export_float_graphs(load_wrapped(model_dir, mask_input=True), lengths, scratch)
        # Windows of the model's own tokenizer, padded to squad.max_seq_length (each graph cuts them to its length).
        tokenizer = answering.QuestionAnswerer.with_squad_settings(float_graphs[max(lengths)],
                                                                   model_dir / "tokenizer.json", cfg.squad)
        tuning_windows = tokenizer.windows(squad.questions(tuning))
        graphs = npu_graph.quantize_graphs(float_graphs, tuning_windows, cfg.export.npu.calibration_windows,
                                           graphs_dir)
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()
        windows = tokenizer.windows(questions.examples)
        cpu = npu_graph.answers(npu_graph.cpu_sessions(graphs), questions.examples, windows, cfg)
        gates = cfg.export.gates
        report = compressed_model_report(f"{out_dir}/{npu_graph.NPU_FOLDER} (CPU execution provider)",
                                         cpu.predictions, questions.pytorch_predictions, questions.gold,
                                         questions.pytorch_f1, gates.min_answer_agreement, gates.max_f1_drop,
                                         gates.strict)
        emulator = npu_graph.emulator_report(graphs, cpu, questions.examples, windows, questions.pytorch_predictions,
                                             questions.gold, cfg, cfg.export.npu.emulator_questions)
        if emulator["ran"]:
            report["gates"]["npu"] = emulator["agreement_with_cpu"]
            report["verdict"] = overall_verdict(report["gates"])
            report["passed"] = ships(report["verdict"], gates.strict)
        records = {length: npu_graph.graph_record(path) for length, path in graphs.items()}
        metrics = {
            "model_dir": str(model_dir),
            "folder": npu_graph.NPU_FOLDER,
            "sequence_lengths": lengths,
            "inputs": {name: "int32 [1, length]" for name in npu_graph.INPUTS},
            "graphs": {str(length): {**record, "size_mb": megabytes(record["bytes"])}
                       for length, record in records.items()},
            "size_mb": megabytes(sum(record["bytes"] for record in records.values())),
            "quantization": "static int8 QDQ (onnxruntime's QNN recipe: uint8 activations, MinMax; uint8 weights)",
            "calibration": {"questions": tuning_source,
                            "question_ids": window_question_ids(tuning_windows,
                                                                cfg.export.npu.calibration_windows)},
            "n_questions": len(questions.gold),
            "executed": "CPU execution provider, each window alone on the shortest graph that holds it",
            "dev": report,
            "emulator": emulator,
            "verdict": report["verdict"],
            "passed": report["passed"],
        }
        atomic_write_json(tmp / "npu.json", metrics)
    logger.info("export_npu %s: %s", model_dir, json.dumps({k: metrics[k] for k in ("size_mb", "verdict")}))
    return metrics


# `python -m pipeline export-npu`: run()'s parameters as flags (pipeline/plan/stage_cli.py), with this help.
FLAG_HELP = {
    "model_dir": "the trained PyTorch QA model (its dev predictions are what the graphs are gated against)",
    "data_dir": "output of prepare_data (gated and tuning dev questions)",
}
