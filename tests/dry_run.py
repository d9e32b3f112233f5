"""`snakemake -n` planned in the test process with the Snakemake API, for tests that check what a dry run plans
(its jobs, their shell commands): the same planning and the same printout as the command line, without starting
an interpreter and importing Snakemake for each (seconds per test). Tests of the command line itself (exit codes,
errors on the console, profiles) run `python -m snakemake` as a user does."""

import contextlib
import io
import logging
import subprocess
import sys
from pathlib import Path

from tests.conftest import PROJECT_ROOT


def dry_run(workdir: Path, configfiles: list[Path], config: dict | None = None, target: str | None = None,
            cores: int = 2, print_shell_commands: bool = False,
            snakefile: Path = PROJECT_ROOT / "Snakefile") -> subprocess.CompletedProcess:
    """What `snakemake [target] -n [-p] --cores CORES --directory WORKDIR --configfile CONFIGFILES --config CONFIG`
    prints to stdout, as a completed process (return code 0; a planning error raises); the project's Snakefile
    unless another is given."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    printed = io.StringIO()
    # As the command line sets it for -n: the plan goes to stdout (the handler takes sys.stdout when it is made).
    output = OutputSettings(dryrun=True, stdout=True, printshellcmds=print_shell_commands, nocolor=True)
    snakemake_logger = logging.getLogger("snakemake")
    search_path = list(sys.path)  # Snakemake adds the rule files' folder while it parses them
    try:
        with contextlib.redirect_stdout(printed), SnakemakeApi(output) as api:
            workflow = api.workflow(resource_settings=ResourceSettings(cores=cores),
                                    config_settings=ConfigSettings(configfiles=[Path(path) for path in configfiles],
                                                                   config=config or {}),
                                    snakefile=Path(snakefile), workdir=Path(workdir))
            dag = workflow.dag(DAGSettings(targets={target} if target else set()))
            dag.execute_workflow(executor="dryrun")
    finally:
        for handler in list(snakemake_logger.handlers):  # none left writing to this call's buffer
            snakemake_logger.removeHandler(handler)
        sys.path[:] = search_path
    command = ["snakemake", *([target] if target else []), "-n", "--cores", str(cores), "--directory", str(workdir)]
    return subprocess.CompletedProcess(command, 0, printed.getvalue(), "")
