"""`snakemake -n` in the test process, without starting an interpreter and importing Snakemake for each (seconds
per test): `dry_run` plans with the Snakemake API, for tests that check what a dry run plans (its jobs, their shell
commands); `command_line_dry_run` goes through Snakemake's own command line (argument parser, profiles, printout,
exit code). Runs that execute jobs start `python -m snakemake` as a user does."""

import contextlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from tests.paths import PROJECT_ROOT


@contextlib.contextmanager
def snakemake_in_this_process(cwd: Path | None = None, environment: dict[str, str] | None = None
                              ) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """What the block prints to stdout and stderr; afterwards the process is as it was: its working folder, the
    environment variables set for the block, the module search path (Snakemake adds the rule files' folder while
    it parses them) and no Snakemake log handler left writing to the block's buffers."""
    printed, errors = io.StringIO(), io.StringIO()
    search_path, directory = list(sys.path), Path.cwd()
    saved = {name: os.environ.get(name) for name in (environment or {})}
    try:
        os.environ.update(environment or {})
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            yield printed, errors
    finally:
        os.chdir(directory)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        snakemake_logger = logging.getLogger("snakemake")
        for handler in list(snakemake_logger.handlers):
            snakemake_logger.removeHandler(handler)
        sys.path[:] = search_path


def dry_run(workdir: Path, configfiles: list[Path], config: dict | None = None, target: str | None = None,
            cores: int = 2, print_shell_commands: bool = False,
            snakefile: Path = PROJECT_ROOT / "Snakefile") -> subprocess.CompletedProcess:
    """What `snakemake [target] -n [-p] --cores CORES --directory WORKDIR --configfile CONFIGFILES --config CONFIG`
    prints to stdout, as a completed process (return code 0; a planning error raises); the project's Snakefile
    unless another is given."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    # As the command line sets it for -n: the plan goes to stdout (the handler takes sys.stdout when it is made).
    output = OutputSettings(dryrun=True, stdout=True, printshellcmds=print_shell_commands, nocolor=True)
    with snakemake_in_this_process() as (printed, _), SnakemakeApi(output) as api:
        workflow = api.workflow(resource_settings=ResourceSettings(cores=cores),
                                config_settings=ConfigSettings(configfiles=[Path(path) for path in configfiles],
                                                               config=config or {}),
                                snakefile=Path(snakefile), workdir=Path(workdir))
        dag = workflow.dag(DAGSettings(targets={target} if target else set()))
        dag.execute_workflow(executor="dryrun")
    command = ["snakemake", *([target] if target else []), "-n", "--cores", str(cores), "--directory", str(workdir)]
    return subprocess.CompletedProcess(command, 0, printed.getvalue(), "")


def command_line_dry_run(arguments: list[str], cwd: Path, environment: dict[str, str] | None = None
                         ) -> subprocess.CompletedProcess:
    """`snakemake ARGUMENTS` (a dry run: the arguments hold -n) through Snakemake's own command line, its argument
    parser, profiles and all, called in this process from `cwd`: what the command prints and its exit code."""
    from snakemake.cli import args_to_api, parse_args
    from snakemake.exceptions import print_exception

    assert "-n" in arguments or "--dry-run" in arguments, "only dry runs run in the test process"
    with snakemake_in_this_process(cwd, environment) as (printed, errors):
        try:
            parser, args = parse_args(arguments)
            succeeded = args_to_api(args, parser)
        except Exception as error:  # as snakemake.cli.main reports it, with exit code 1
            print_exception(error)
            succeeded = False
    return subprocess.CompletedProcess(["snakemake", *arguments], 0 if succeeded else 1, printed.getvalue(),
                                       errors.getvalue())
