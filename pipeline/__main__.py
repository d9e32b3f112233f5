"""`python -m pipeline <stage> ...`: a thin dispatcher to each stage's command-line entry point."""

from __future__ import annotations

import importlib
import sys

# command -> (module, function). Imports are lazy so `--help` and light commands start fast.
COMMANDS = {
    "prepare-data": ("pipeline.stages.prepare_data", "main"),
    "tokenizer": ("pipeline.stages.tokenizer", "main"),
    "teacher-pretrain": ("pipeline.stages.teacher", "main_pretrain"),
    "teacher-finetune": ("pipeline.stages.teacher", "main_finetune"),
    "tokenize-corpus": ("pipeline.stages.tokenize_corpus", "main"),
    "init-student": ("pipeline.stages.init_student", "main"),
    "distill-pretrain": ("pipeline.stages.distill_pretrain", "main"),
    "distill-squad": ("pipeline.stages.distill_squad", "main"),
    "deploy-model": ("pipeline.stages.deploy_model", "main"),
    "export-onnx": ("pipeline.stages.export_onnx", "main"),
    "quantize-onnx": ("pipeline.stages.quantize", "main"),
    "export-coreml": ("pipeline.stages.export_coreml", "main"),
    "export-full-size": ("pipeline.stages.export_full_size", "main"),
    "export-full-size-int8": ("pipeline.stages.export_full_size_int8", "main"),
    "export-peers": ("pipeline.stages.export_peers", "main"),
    "export-gemm-floor": ("pipeline.stages.export_gemm_floor", "main"),
    "bundle": ("pipeline.stages.bundle", "main"),
    "int8-search": ("pipeline.stages.int8_search", "main"),
    "benchmark": ("pipeline.stages.benchmark", "main"),
    "benchmark-web": ("pipeline.stages.benchmark_web", "main"),
    "report": ("pipeline.stages.report", "main"),
    "study-summary": ("pipeline.stages.study", "main"),
    "answer": ("pipeline.onnx_qa", "main"),
    "evaluate-predictions": ("pipeline.squad", "evaluate_predictions_main"),
    "schema": ("pipeline.config", "print_schema_main"),
    "verify": ("pipeline.artifacts", "verify_main"),
    "collect-run": ("pipeline.results_tables", "collect_main"),
    "render-results": ("pipeline.results_tables", "render_main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        usage = "usage: python -m pipeline <command> [options]\n\ncommands:\n" + "".join(f"  {c}\n" for c in COMMANDS)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"unknown command {argv[0]!r}\n\n{usage}", file=sys.stderr)
            return 2
        print(usage)
        return 0
    module_name, function_name = COMMANDS[argv[0]]
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
    sys.exit(main())
