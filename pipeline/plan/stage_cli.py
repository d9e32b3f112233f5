"""The command line of every stage, written once: the stage's function declares it with its parameters.

`python -m pipeline <stage>` (pipeline/plan/commands.py's STAGES names each stage's module and function) takes one
flag per parameter of that function and calls it; a rule's shell command is written from the same parameters
(`stage_arguments`, called by rules/common.smk's `stage_shell`). A parameter becomes

  cfg: PipelineConfig          --config-json JSON           the config, or the sections the stage reads
  model_dir: Path              --model-dir MODEL_DIR        (str, int, float: the same, with that type)
  init: Literal["a", "b"]      --init {a,b}
  ce_only: bool = False        --ce-only                    a switch; --ce-only=false spells out the default
  teacher_dir: Path | None     --teacher-dir TEACHER_DIR    optional: an empty value ('') is None, so a rule can
                                                            always pass the flag and leave the value empty

A parameter with no default that is not `| None` is a required flag. The help is the module's docstring, and each
flag's the module's FLAG_HELP (parameter name -> text).

Planning reads the parameters from the stage's source with `ast`, as pipeline/plan/code_inputs.py reads imports, so
Snakemake imports no torch to plan: a rule that passes a parameter its stage does not have, or leaves out a
required one, stops planning with the stage and the parameter.

Why not jsonargparse (which derives a parser from a signature and its docstring, litgpt's way): it reads the
signature by importing the function, and importing a stage imports torch, so planning a DAG (every rule's command
line) would import every stage; the argparse parser here is built from the same source text `ast` reads.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import inspect
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from pipeline.plan.code_inputs import module_file
from pipeline.plan.commands import STAGES

CONFIG_FLAG = "--config-json"  # the flag of the PipelineConfig parameter, whatever its name
CONFIG_HELP = "the pipeline config, or the sections this stage reads, as JSON"
VALUE_TYPES = (Path, str, int, float)


class StageArgumentError(ValueError):
    """A rule passes a stage a parameter it does not have, or leaves out a required one."""


@dataclass(frozen=True)
class StageParameter:
    """One parameter of a stage's function, as its source declares it."""

    name: str
    required: bool  # no default, and None is not one of its types
    kind: str  # "config" (--config-json), "switch" (bool) or "value"

    @property
    def flag(self) -> str:
        return CONFIG_FLAG if self.kind == "config" else "--" + self.name.replace("_", "-")


def stage_function(command: str) -> tuple[str, str]:
    """The module and function of a stage command."""
    if command not in STAGES:
        raise StageArgumentError(f"{command!r} is not a stage command; stages: {', '.join(STAGES)}")
    return STAGES[command]


def stage_parameters(command: str) -> list[StageParameter]:
    """The parameters of the stage's function, read from its source (nothing is imported)."""
    module, function = stage_function(command)
    path = module_file(module)
    stat = path.stat()
    return list(_parameters_in_source(str(path), stat.st_mtime_ns, stat.st_size, function))


@functools.lru_cache(maxsize=None)
def _parameters_in_source(path: str, mtime_ns: int, size: int, function: str) -> tuple[StageParameter, ...]:
    # Parsed once per version of the file: the Snakefile asks for every rule's stage while it plans.
    tree = ast.parse(Path(path).read_text(), filename=path)
    definition = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function),
                      None)
    if definition is None:
        raise StageArgumentError(f"{path}: no function {function}() at module level")
    arguments = definition.args
    if arguments.vararg or arguments.kwarg:
        raise StageArgumentError(f"{path}:{definition.lineno}: {function}() takes *args or **kwargs; a stage's "
                                 "function names each parameter, as its command line does")
    positional = arguments.posonlyargs + arguments.args
    has_default = ([False] * (len(positional) - len(arguments.defaults)) + [True] * len(arguments.defaults)
                   + [default is not None for default in arguments.kw_defaults])
    parameters = []
    for argument, defaulted in zip(positional + arguments.kwonlyargs, has_default):
        if argument.annotation is None:
            raise StageArgumentError(f"{path}:{argument.lineno}: parameter {argument.arg} of {function}() has no "
                                     "type; a stage's parameters are typed (the type makes the flag)")
        types_named = union_members(argument.annotation)
        optional = "None" in types_named
        named = [name for name in types_named if name != "None"]
        kind = "config" if named == ["PipelineConfig"] else "switch" if named == ["bool"] else "value"
        parameters.append(StageParameter(argument.arg, required=not defaulted and not optional, kind=kind))
    return tuple(parameters)


def union_members(annotation: ast.expr) -> list[str]:
    """The types of an annotation as source text: `Path | None` -> ["Path", "None"]."""
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return union_members(annotation.left) + union_members(annotation.right)
    return [ast.unparse(annotation)]


def stage_arguments(command: str, arguments: dict[str, str | bool]) -> str:
    """The flags of `python -m pipeline <command>` for a rule: `arguments` maps the stage function's parameter names
    to shell text (Snakemake placeholders such as "{input.model:q}", formatted when the job runs), or, for a
    switch, True / False / the text of true or false. A required flag is written `--flag VALUE`, an optional one
    `--flag=VALUE` (its value may be empty). Fails naming the stage and the parameter when a name is not a
    parameter of the stage or a required parameter is missing."""
    module, function = stage_function(command)
    where = f"stage {command} ({module}.{function})"
    parameters = {parameter.name: parameter for parameter in stage_parameters(command)}
    for name in arguments:
        if name not in parameters:
            raise StageArgumentError(f"{where} has no parameter {name!r}; its parameters: {', '.join(parameters)}")
    for parameter in parameters.values():
        if parameter.required and parameter.name not in arguments:
            raise StageArgumentError(f"{where} needs {parameter.name!r} ({parameter.flag}), which the rule does "
                                     "not give")
    words = []
    for name, value in arguments.items():
        parameter = parameters[name]
        if parameter.kind == "switch" and isinstance(value, bool):
            words += [parameter.flag] if value else []
        elif parameter.kind == "switch":
            words.append(f"{parameter.flag}={value}")  # formatted to true or false when the job runs
        elif isinstance(value, str) and parameter.required:
            words += [parameter.flag, value]
        elif isinstance(value, str):
            # One word: Snakemake's :q writes an empty value as nothing, and `--flag=` is still the empty value.
            words.append(f"{parameter.flag}={value}")
        else:
            raise StageArgumentError(f"{where}: {name!r} is {value!r}; a rule passes shell text, such as "
                                     f"'{{input.{name}:q}}'")
    return " ".join(words)


# ------------------------------------------------------------------------------------------------ the command line


def switch_value(text: str) -> bool:
    """The value of a switch written out: --ce-only=true or --ce-only=false."""
    if text not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text == "true"


def text_or_none(text: str) -> str | None:
    return text or None


def value_converter(annotation, where: str):
    """The function that turns a flag's text into the parameter's value, and its metavar (None: argparse's)."""
    is_union = typing.get_origin(annotation) in (typing.Union, types.UnionType)  # `X | None`, `Literal[..] | None`
    members = typing.get_args(annotation) if is_union else (annotation,)
    optional = type(None) in members
    named = [member for member in members if member is not type(None)]
    if len(named) == 1 and typing.get_origin(named[0]) is typing.Literal:
        choices = typing.get_args(named[0])
        metavar = "{" + ",".join(map(str, choices)) + "}"

        def convert(text: str):
            if text not in choices:
                raise argparse.ArgumentTypeError(f"invalid choice {text!r} (choose from {', '.join(choices)})")
            return text
    elif len(named) == 1 and named[0] in VALUE_TYPES:
        convert, metavar = named[0], None  # argparse's: the parameter's name
    elif set(named) == {str, Path}:  # a folder or a hub name: passed on as written
        convert, metavar = str, None
    else:
        raise TypeError(f"{where}: type {annotation} has no command-line form (Path, str, int, float, bool, a "
                        "Literal of strings or PipelineConfig, each optionally | None)")
    if not optional:
        return convert, metavar

    def convert_or_none(text: str):
        return None if text == "" else convert(text)

    convert_or_none.__name__ = getattr(convert, "__name__", "value")  # argparse names it in "invalid ... value"
    return convert_or_none, metavar


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of `python -m pipeline <command>`: one flag per parameter of the stage's function."""
    module_name, function_name = stage_function(command)
    module = importlib.import_module(module_name)
    function = getattr(module, function_name)
    hints = typing.get_type_hints(function)
    defaults = {name: parameter.default for name, parameter in inspect.signature(function).parameters.items()}
    flag_help = getattr(module, "FLAG_HELP", {})
    parser = argparse.ArgumentParser(prog=f"python -m pipeline {command}", description=module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for parameter in stage_parameters(command):
        default = defaults[parameter.name]
        options = {"dest": parameter.name, "required": parameter.required,
                   "default": None if default is inspect.Parameter.empty else default,
                   "help": flag_help.get(parameter.name)}
        if parameter.kind == "config":
            # Parsed once the command line is (config_from_json), so that its errors name the config key.
            optional = type(None) in typing.get_args(hints[parameter.name])
            parser.add_argument(parameter.flag, metavar="JSON", type=text_or_none if optional else str,
                                **{**options, "help": flag_help.get(parameter.name, CONFIG_HELP)})
        elif parameter.kind == "switch":
            parser.add_argument(parameter.flag, nargs="?", const=True, type=switch_value, metavar="true|false",
                                **options)
        else:
            convert, metavar = value_converter(hints[parameter.name],
                                               f"{module_name}.{function_name}({parameter.name})")
            parser.add_argument(parameter.flag, type=convert, metavar=metavar, **options)
    return parser


def main(command: str, argv: list[str]) -> int:
    """`python -m pipeline <command> ARGV`: parse the flags, then call the stage's function with them."""
    from pipeline.outputs.logs import setup_logging
    from pipeline.plan.config import config_from_json

    values = vars(command_parser(command).parse_args(argv))
    setup_logging()
    for parameter in stage_parameters(command):
        if parameter.kind == "config" and values[parameter.name] is not None:
            values[parameter.name] = config_from_json(values[parameter.name])
    module_name, function_name = stage_function(command)
    getattr(importlib.import_module(module_name), function_name)(**values)
    return 0
