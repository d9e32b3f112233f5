"""The commands of `python -m pipeline`: each stage's and each tool's module and function, as names only (nothing
is imported here). The dispatcher (pipeline/__main__.py), the stage command lines (pipeline/plan/stage_cli.py) and the
rules' code inputs (pipeline/plan/code_inputs.py) read this table."""

from __future__ import annotations

# Stages: command -> (module, the function it runs). The stage's command line is that function's parameters
# (pipeline/plan/stage_cli.py), and so are the flags its rule passes. The dispatcher imports a module only to run it,
# so `--help` starts fast.
STAGES = {
    "prepare-data": ("pipeline.stages.prepare_data", "run"),
    "tokenizer": ("pipeline.stages.tokenizer", "run"),
    "teacher-pretrain": ("pipeline.stages.teacher", "run_pretrain"),
    "teacher-finetune": ("pipeline.stages.teacher", "run_finetune"),
    "tokenize-corpus": ("pipeline.stages.tokenize_corpus", "run"),
    "init-student": ("pipeline.stages.init_student", "run"),
    "distill-pretrain": ("pipeline.stages.distill_pretrain", "run"),
    "distill-squad": ("pipeline.stages.distill_squad", "run"),
    "deploy-model": ("pipeline.stages.deploy_model", "run"),
    "export-onnx": ("pipeline.stages.export_onnx", "run"),
    "quantize-onnx": ("pipeline.stages.quantize", "run"),
    "export-coreml": ("pipeline.stages.export_coreml", "run"),
    "export-npu": ("pipeline.stages.export_npu", "run"),
    "export-full-size": ("pipeline.stages.export_full_size", "run"),
    "export-full-size-int8": ("pipeline.stages.export_full_size_int8", "run"),
    "export-peers": ("pipeline.stages.export_peers", "run"),
    "export-gemm-floor": ("pipeline.stages.export_gemm_floor", "run"),
    "bundle": ("pipeline.stages.bundle", "run"),
    "int8-search": ("pipeline.stages.int8_search", "run"),
    "benchmark": ("pipeline.stages.benchmark", "run"),
    "benchmark-web": ("pipeline.stages.benchmark_web", "run_for_config"),
    "report": ("pipeline.stages.report", "run"),
    "study-summary": ("pipeline.stages.study", "run"),
}
# Tools: command -> (module, its main(argv)).
TOOLS = {
    "answer": ("pipeline.runtime.answering", "main"),
    "evaluate-predictions": ("pipeline.data.predictions", "evaluate_predictions_main"),
    "schema": ("pipeline.plan.config", "print_schema_main"),
    "verify": ("pipeline.outputs.manifests", "verify_main"),
    "collect-run": ("pipeline.reporting.results_tables", "collect_main"),
    "render-results": ("pipeline.reporting.results_tables", "render_main"),
}
COMMANDS = {**STAGES, **TOOLS}
