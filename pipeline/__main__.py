"""`python -m pipeline <command> ...`: a thin dispatcher to each stage's and each tool's command line."""

from __future__ import annotations

import functools
import importlib
import sys

from pipeline.plan.commands import COMMANDS, STAGES, TOOLS
from pipeline.startup import libraries_loaded, pause_collection_while_loading, prepare_process


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
        from pipeline.plan import stage_cli

        importlib.import_module(stage_cli.stage_function(argv[0])[0])  # the stage's module and its libraries
        entry_point = functools.partial(stage_cli.main, argv[0])
    else:
        module_name, function_name = TOOLS[argv[0]]
        entry_point = getattr(importlib.import_module(module_name), function_name)
    libraries_loaded()  # collection resumes (pipeline/startup.py, 3)
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
    prepare_process()  # library settings: pipeline/startup.py
    pause_collection_while_loading()  # until main() has loaded the command's module
    sys.exit(main())
