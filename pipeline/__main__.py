"""`python -m pipeline <command> ...`: a thin dispatcher to each stage's and each tool's command line."""

from __future__ import annotations

import functools
import importlib
import sys

# Stages: command -> (module, the function it runs). The stage's command line is that function's parameters
# (pipeline/stage_cli.py), and so are the flags its rule passes. Imports are lazy so `--help` starts fast.
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
    "answer": ("pipeline.onnx_qa", "main"),
    "evaluate-predictions": ("pipeline.squad", "evaluate_predictions_main"),
    "schema": ("pipeline.config", "print_schema_main"),
    "verify": ("pipeline.manifests", "verify_main"),
    "collect-run": ("pipeline.results_tables", "collect_main"),
    "render-results": ("pipeline.results_tables", "render_main"),
}
COMMANDS = {**STAGES, **TOOLS}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        usage = "usage: python -m pipeline <command> [options]\n\ncommands:\n" + "".join(f"  {c}\n" for c in COMMANDS)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown command {argv[0]!r}\n\n{usage}", file=sys.stderr)
            return 2
        print(usage)
        return 0
    if argv[0] in STAGES:
        from pipeline import stage_cli

        entry_point = functools.partial(stage_cli.main, argv[0])
    else:
        module_name, function_name = TOOLS[argv[0]]
        entry_point = getattr(importlib.import_module(module_name), function_name)
    try:
        return int(entry_point(argv[1:]) or 0)
    except Exception as error:
        # Bad input (config, data, a bundle) and a missed export gate get one clear message, not a stack trace
        # from inside a library.
        from pipeline.errors import PipelineError

        if isinstance(error, PipelineError):
            print(f"error: {error}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    from pipeline.startup import hide_unused_packages_from_transformers

    hide_unused_packages_from_transformers()  # imports no stage uses (pipeline/startup.py)
    sys.exit(main())
