"""pipeline/plan/stage_cli.py: a stage's command line is its function's parameters, and every rule's shell command is
written from the same parameters. Each command the planned DAGs print (`snakemake -n -p`) parses with its stage's
own parser; a rule that passes a parameter its stage does not have, or leaves out a required one, stops planning."""

import contextlib
import importlib
import inspect
import io
import json
import shlex
import textwrap
import traceback
import typing
from pathlib import Path

import pytest

from pipeline.__main__ import main
from pipeline.plan import stage_cli
from pipeline.plan.commands import STAGES
from pipeline.plan.config import config_from_json
from tests.paths import PROJECT_ROOT
from tests.dry_run import dry_run

CONFIGS = PROJECT_ROOT / "configs"
# What the planned DAGs cover between them: every stage, with and without its optional flags (a hub teacher, so
# teacher_finetune gets no --pretrained-dir; augmentation, so distill_squad gets --mlm-teacher-dir; two training
# processes, so the training stages start under torchrun; the full-size exports, which configs/test.yaml leaves out).
PLANS = {
    "test DAG": ([CONFIGS / "test.yaml"], {}, None),
    "study": ([CONFIGS / "test.yaml"], {}, "study"),
    "deploy": ([CONFIGS / "deploy.yaml"], {}, "deploy"),
    "hub teacher": ([CONFIGS / "test.yaml"], {"teacher": {"pretrained": "owner/hub-bert"},
                                              "distill_squad": {"augmentation": {"copies": 1}},
                                              "compute": {"processes": 2},
                                              "export": {"full_size": {"architectures": ["distilbert", "bert-base"]}}},
                    None),
    "hub teacher, study": ([CONFIGS / "test.yaml"], {"teacher": {"pretrained": "owner/hub-bert"},
                                                     "distill_squad": {"augmentation": {"copies": 1}}}, "study"),
}


def planned_stage_commands(workdir: Path, configfiles: list[Path], config: dict, target: str | None
                           ) -> list[tuple[str, list[str]]]:
    """(stage command, its flags) of every job a `-n -p` dry run plans, split as the job's shell splits them."""
    completed = dry_run(workdir, configfiles, {"output_root": str(workdir / "out"), **config}, target=target,
                        print_shell_commands=True)
    commands = []
    for line in completed.stdout.splitlines():
        if "Shell command: " not in line:
            continue
        words = shlex.split(line.split("Shell command: ", 1)[1])
        starts = [i for i in range(len(words) - 1) if words[i:i + 2] == ["-m", "pipeline"]]
        if starts:  # the flags end where the output goes to the log: `> LOG 2>&1`
            assert words[-3] == ">" and words[-1] == "2>&1", words
            commands.append((words[starts[0] + 2], words[starts[0] + 3:-3]))
    return commands


def parse(command: str, flags: list[str]):
    """The stage's parser on `flags`, as `python -m pipeline <command>` parses them (the stage does not run)."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return stage_cli.command_parser(command).parse_args(flags)
    except SystemExit:
        raise AssertionError(f"python -m pipeline {command} {shlex.join(flags)}\n{errors.getvalue()}") from None


def test_every_planned_stage_command_parses_with_its_stages_own_command_line(tmp_path):
    planned = set()
    for name, (configfiles, config, target) in PLANS.items():
        commands = planned_stage_commands(tmp_path / name.replace(" ", "_").replace(",", ""), configfiles, config,
                                          target)
        assert commands, name
        for command, flags in commands:
            values = parse(command, flags)  # unknown flags, missing required ones and bad values fail here
            config_from_json(values.cfg)  # the sections the rule passes load as the typed config
            planned.add(command)
    assert planned == set(STAGES)


def test_export_models_reaches_the_rules_that_read_the_set_and_leaves_the_exports_as_they_were(tmp_path):
    """Which models are exported decides which export jobs run: each export job's config is the same whatever
    export.models says (adding a model reruns nothing), and the int8 search, the benchmark and the report get it."""
    full_size = {"full_size": {"architectures": ["distilbert"]}}
    configs = {}
    for models in (["student", "teacher"], ["student", "student_ce_only", "teacher"]):
        commands = planned_stage_commands(tmp_path / "_".join(models), [CONFIGS / "test.yaml"],
                                          {"export": {"models": models, **full_size}}, None)
        for command, flags in commands:
            cfg = json.loads(parse(command, flags).cfg)
            configs.setdefault(command, {})[tuple(models)] = cfg
            reads_the_set = command in ("int8-search", "benchmark", "report")
            assert ("models" in cfg.get("export", {})) == reads_the_set, command
            if reads_the_set:
                assert cfg["export"]["models"] == models, command
    for command in ("export-onnx", "quantize-onnx", "export-coreml", "bundle", "export-full-size"):
        assert len({json.dumps(cfg, sort_keys=True) for cfg in configs[command].values()}) == 1, command


def test_phone_builds_are_planned_for_export_phone_models_alone_and_their_configs_stay_as_they_were(tmp_path):
    """export.phone_models decides which exported models get CoreML packages and NPU graphs (the student by default):
    only theirs are planned, every model still gets its ONNX and int8 builds, the benchmark and the report are told
    which, and no export job's config changes with the set (changing it reruns nothing built)."""
    configs = {}
    for phone_models in (None, ["student", "teacher"]):
        export = {"models": ["student", "student_ce_only", "teacher"]}
        if phone_models:
            export["phone_models"] = phone_models
        commands = planned_stage_commands(tmp_path / str(bool(phone_models)), [CONFIGS / "test.yaml"],
                                          {"export": export}, None)
        models_of = {}
        for command, flags in commands:
            arguments = parse(command, flags)
            cfg = json.loads(arguments.cfg)
            configs.setdefault(command, set()).add(json.dumps(cfg, sort_keys=True))
            if command in ("export-onnx", "quantize-onnx", "export-coreml", "export-npu"):
                models_of.setdefault(command, set()).add(Path(arguments.model_dir).name)
            if command in ("benchmark", "report"):
                assert cfg["export"]["phone_models"] == (phone_models or ["student"]), command
        every_model = {"distill_squad", "student_finetune", "teacher"}
        assert models_of["export-onnx"] == models_of["quantize-onnx"] == every_model
        phone_folders = {"distill_squad"} | ({"teacher"} if phone_models else set())
        assert models_of["export-coreml"] == models_of["export-npu"] == phone_folders
    for command in ("export-onnx", "quantize-onnx", "export-coreml", "export-npu", "bundle"):
        assert len(configs[command]) == 1, command


@pytest.mark.parametrize("command", sorted(STAGES))
def test_the_parameters_read_from_the_source_are_the_functions(command):
    """Planning reads a stage's parameters with `ast`; they are the ones Python sees, and each has a flag."""
    module_name, function_name = STAGES[command]
    module = importlib.import_module(module_name)
    function = getattr(module, function_name)
    signature, hints = inspect.signature(function), typing.get_type_hints(function)
    read = stage_cli.stage_parameters(command)
    assert [parameter.name for parameter in read] == list(signature.parameters)
    for parameter in read:
        optional = type(None) in typing.get_args(hints[parameter.name])
        no_default = signature.parameters[parameter.name].default is inspect.Parameter.empty
        assert parameter.required == (no_default and not optional), parameter
    parser = stage_cli.command_parser(command)
    assert {action.dest for action in parser._actions} - {"help"} == set(signature.parameters)
    # Help is given only for parameters the module's stages have.
    stage_functions = [getattr(module, name) for module_of, name in STAGES.values() if module_of == module_name]
    parameters = set().union(*(inspect.signature(stage).parameters for stage in stage_functions))
    assert set(getattr(module, "FLAG_HELP", {})) <= parameters, module_name


def test_flags_are_the_parameters_with_their_types_and_the_empty_value_is_none():
    values = parse("distill-pretrain", ["--config-json", "{}", "--student-dir", "s", "--teacher", "owner/bert",
                                        "--corpus-dir", "c", "--out-dir", "o", "--work-dir", "w", "--node-local-dir", ""])
    assert values.student_dir == Path("s") and values.teacher == "owner/bert" and values.node_local_dir is None
    assert parse("distill-pretrain", ["--config-json", "{}", "--student-dir", "s", "--teacher", "t", "--corpus-dir",
                                      "c", "--out-dir", "o", "--work-dir", "w",
                                      "--node-local-dir=/scratch"]).node_local_dir == "/scratch"
    assert parse("tokenize-corpus", ["--config-json", "{}", "--data-dir", "d", "--tokenizer-dir", "t", "--out-dir",
                                     "o"]).workers == 1  # run()'s default
    squad = ["--config-json", "{}", "--student-dir", "s", "--data-dir", "d", "--out-dir", "o", "--work-dir", "w"]
    assert parse("distill-squad", squad + ["--ce-only"]).ce_only is True
    assert parse("distill-squad", squad + ["--ce-only=false", "--teacher-dir", "t"]).ce_only is False
    assert parse("distill-squad", squad + ["--teacher-dir", ""]).teacher_dir is None
    assert parse("init-student", ["--config-json", "{}", "--teacher", "t", "--tokenizer-dir", "k", "--out-dir", "o",
                                  "--init", "random"]).init == "random"


@pytest.mark.parametrize("command, flags, needle", [
    ("export-onnx", ["--config-json", "{}", "--model-dir", "m", "--out-dir", "o"], "--data-dir"),
    ("init-student", ["--config-json", "{}", "--teacher", "t", "--tokenizer-dir", "k", "--out-dir", "o", "--init",
                      "copied"], "invalid choice 'copied' (choose from teacher, random)"),
    ("tokenize-corpus", ["--config-json", "{}", "--data-dir", "d", "--tokenizer-dir", "t", "--out-dir", "o",
                         "--workers", "two"], "--workers: invalid int value: 'two'"),
    ("distill-squad", ["--config-json", "{}", "--student-dir", "s", "--data-dir", "d", "--out-dir", "o", "--work-dir",
                       "w", "--ce-only=maybe"], "expected true or false, got 'maybe'"),
    ("export-onnx", ["--config-json", "{}", "--model-dir", "m", "--data-dir", "d", "--out-dir", "o", "--onnx-dir",
                     "x"], "unrecognized arguments: --onnx-dir x"),
], ids=["missing-required", "choice", "int", "switch", "unknown-flag"])
def test_a_bad_command_line_is_refused_by_the_stages_parser(command, flags, needle):
    errors = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(errors):
        stage_cli.command_parser(command).parse_args(flags)
    assert exit_info.value.code == 2 and needle in errors.getvalue(), errors.getvalue()


def test_help_shows_the_stages_description_and_each_flags_help():
    printed = io.StringIO()
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stdout(printed):
        main(["export-onnx", "--help"])
    shown = " ".join(printed.getvalue().split())  # argparse wraps the help at the terminal's width
    assert exit_info.value.code == 0
    assert shown.startswith("usage: python -m pipeline export-onnx [-h] --config-json JSON --model-dir MODEL_DIR")
    assert "Stage export_onnx: a trained QA model -> ONNX" in shown
    assert "--model-dir MODEL_DIR a trained QA model (save_pretrained folder)" in shown
    assert f"--config-json JSON {stage_cli.CONFIG_HELP}" in shown


def test_distill_squad_takes_exactly_one_of_a_teacher_and_ce_only():
    errors = io.StringIO()
    common = ["--config-json", "{}", "--student-dir", "s", "--data-dir", "d", "--out-dir", "o", "--work-dir", "w"]
    with contextlib.redirect_stderr(errors):
        neither = main(["distill-squad", *common])
        both = main(["distill-squad", *common, "--teacher-dir", "t", "--ce-only"])
    assert neither == both == 2
    assert errors.getvalue().count("error: distill_squad: give exactly one of the teacher (--teacher-dir) and "
                                   "ce_only (--ce-only)") == 2


def test_the_flags_of_a_rule_are_written_from_the_parameter_names():
    flags = stage_cli.stage_arguments("distill-squad", {
        "cfg": "{params.cfg:q}", "ce_only": True, "student_dir": "{params.student:q}", "data_dir": "{input.data:q}",
        "out_dir": "{output:q}", "work_dir": "{params.work:q}"})
    assert flags == ("--config-json {params.cfg:q} --ce-only --student-dir {params.student:q} --data-dir "
                     "{input.data:q} --out-dir {output:q} --work-dir {params.work:q}")
    per_job = stage_cli.stage_arguments("distill-squad", {
        "cfg": "{params.cfg:q}", "ce_only": "{params.ce_only}", "student_dir": "s", "data_dir": "d", "out_dir": "o",
        "work_dir": "w"})
    assert per_job.startswith("--config-json {params.cfg:q} --ce-only={params.ce_only} --student-dir s")


@pytest.mark.parametrize("arguments, needle", [
    ({"model": "{input.model:q}", "data_dir": "d", "out_dir": "o"},
     "stage export-onnx (pipeline.stages.export_onnx.run) has no parameter 'model'; its parameters: cfg, model_dir, "
     "data_dir, out_dir"),
    ({"model_dir": "{input.model:q}", "out_dir": "o"},
     "stage export-onnx (pipeline.stages.export_onnx.run) needs 'data_dir' (--data-dir), which the rule does not give"),
], ids=["unknown", "missing"])
def test_a_rule_with_a_parameter_its_stage_lacks_or_without_a_required_one_stops_planning(tmp_path, arguments, needle):
    """Planned by Snakemake: the error names the stage and the parameter."""
    flags = ", ".join(f"{name}={value!r}" for name, value in arguments.items())
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text(textwrap.dedent(f"""\
        configfile: {str(CONFIGS / "default.yaml")!r}
        include: {str(PROJECT_ROOT / "rules" / "common.smk")!r}

        rule export_onnx_misspelt:
            output: "out"
            params: cfg="{{}}"
            log: "out.log"
            shell: stage_shell("export-onnx", {flags})
        """))
    with pytest.raises(stage_cli.StageArgumentError) as raised:
        dry_run(tmp_path, [], snakefile=snakefile)
    assert needle in str(raised.value), str(raised.value)
    # Raised from the rule's shell line: `snakemake` prints that line of the Snakefile under the message.
    files = [frame.filename for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert files[-3:] == [str(snakefile), str(PROJECT_ROOT / "rules" / "common.smk"), stage_cli.__file__], files
