"""Every snakemake command line README.md and docs/ show plans as written (a dry run, in a copy of the project
with the model folder and dev file the deploy commands name); docs/deploy.md's offline deploy runs in full in
tests/test_deploy.py."""

import shlex

import pytest

from tests.documented_commands import documented_commands, project_copy
from tests.dry_run import command_line_dry_run
from tests.test_deploy import tiny_qa_model_with_its_own_vocabulary

# Commands a dry run cannot stand for, and where they are tested instead.
NOT_DRY_RUN = {"--report": "needs a finished run: tests/test_pipeline_dag.py builds the HTML report",
               "--unlock": "tests/dag_run.py runs the recovery commands after a kill"}


@pytest.fixture(scope="module")
def project(squad2_dev_sample_module, tmp_path_factory):
    root = project_copy(tmp_path_factory.mktemp("documented") / "project")
    (root / "my-dev.json").symlink_to(squad2_dev_sample_module)
    tiny_qa_model_with_its_own_vocabulary(root / "my-qa-model", squad2_dev_sample_module)
    return root


@pytest.fixture(scope="module")
def squad2_dev_sample_module():
    from tests.paths import SHARED_SQUAD_SAMPLE

    if not SHARED_SQUAD_SAMPLE.is_file():
        pytest.skip(f"real SQuAD sample not found at {SHARED_SQUAD_SAMPLE} (../shared is absent)")
    return SHARED_SQUAD_SAMPLE


def test_every_documented_snakemake_command_plans_as_written(project):
    commands = documented_commands(".venv/bin/snakemake")
    assert len(commands) >= 10 and {name for name, _ in commands} >= {"README.md", "deploy.md", "scale.md"}
    planned = [(name, command) for name, command in commands if not any(flag in command for flag in NOT_DRY_RUN)]
    environment = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    distinct = list(dict.fromkeys(command for _, command in planned))  # a command several pages show plans once
    # Each through Snakemake's own command line (argument parser, profiles) in this process, as written plus -n.
    results = {command: command_line_dry_run(shlex.split(command)[1:] + ["-n"], cwd=project, environment=environment)
               for command in distinct}
    failed = [f"{name}: {command}\n{results[command].stdout[-1500:]}{results[command].stderr[-1500:]}"
              for name, command in planned if results[command].returncode != 0]
    assert not failed, "\n\n".join(failed)
    built = sorted(path.name for path in (project / "artifacts").iterdir())
    assert built == ["README.md"]  # dry runs: nothing built beside the folder's committed README
