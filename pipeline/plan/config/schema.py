"""The JSON schema Snakemake validates configs against (configs/schema.yaml), generated from the sections' dataclasses:
`python -m pipeline schema > configs/schema.yaml`; a test checks the committed schema is current.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

import yaml

from pipeline.plan.config.loading import to_dict
from pipeline.plan.config.sections import PipelineConfig


def _schema_for_type(tp: Any) -> dict:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return schema_for_dataclass(tp)
    if origin in (typing.Union, types.UnionType):
        options = [_schema_for_type(t) for t in typing.get_args(tp) if t is not type(None)]
        nullable = type(None) in typing.get_args(tp)
        if nullable:
            options.append({"type": "null"})
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin is Literal:
        choices = list(typing.get_args(tp))
        return {"type": "string", "enum": choices}
    if origin is list:
        (item_type,) = typing.get_args(tp)
        return {"type": "array", "items": _schema_for_type(item_type)}
    if origin is dict:
        _, value_type = typing.get_args(tp)
        return {"type": "object", "additionalProperties": _schema_for_type(value_type)}
    return {
        bool: {"type": "boolean"},
        int: {"type": "integer"},
        float: {"type": "number"},
        str: {"type": "string"},
    }[tp]


def schema_for_dataclass(cls: type) -> dict:
    hints = typing.get_type_hints(cls)
    properties = {}
    for f in dataclasses.fields(cls):
        prop = _schema_for_type(hints[f.name])
        meta = dict(f.metadata)
        prop = {"description": meta.get("doc", ""), **prop}
        for constraint in ("minimum", "exclusiveMinimum", "maximum"):
            if constraint in meta:
                target = prop
                if "anyOf" in prop:  # constrain the numeric branch of `int | None`
                    target = next(o for o in prop["anyOf"] if o.get("type") in ("integer", "number"))
                target[constraint] = meta[constraint]
        if not dataclasses.is_dataclass(hints[f.name]):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            prop["default"] = to_dict(default) if dataclasses.is_dataclass(default) else default
        properties[f.name] = prop
    doc = (cls.__doc__ or "").strip()
    return {"type": "object", "description": doc, "additionalProperties": False, "properties": properties}


def pipeline_schema() -> dict:
    schema = schema_for_dataclass(PipelineConfig)
    return {"$schema": "http://json-schema.org/draft-07/schema#", **schema}


def pipeline_schema_yaml() -> str:
    header = "# GENERATED from pipeline/plan/config/sections.py by `python -m pipeline schema > configs/schema.yaml`; do not edit.\n"
    return header + yaml.safe_dump(pipeline_schema(), sort_keys=False, width=110)


def print_schema_main(argv: list[str] | None = None) -> int:
    """`python -m pipeline schema`: print the JSON schema Snakemake validates configs against."""
    print(pipeline_schema_yaml(), end="")
    return 0
