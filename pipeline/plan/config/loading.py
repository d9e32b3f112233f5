"""Loading a config: YAML or JSON -> the dataclasses of sections.py, every key checked against its annotation and
constraints; an unknown key or a bad value fails naming the key.

Why not pydantic: its models would replace this converter, but not the sections' documented dataclasses that
every stage reads, replaces and hashes, nor the generated configs/schema.yaml (schema.py), which Snakemake's own
validator reads; and pydantic is not a dependency this project declares. The converter
is the one place that knows the annotations, and errors name the key as the config spells it.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.plan.config.sections import ConfigError, PipelineConfig


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp` and convert nested sections; raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping (section), got {value!r}")
        return from_dict(tp, value, key)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise ConfigError(f"{key}: must not be null")
        errors = []
        for option_type in options:
            if option_type is type(None):
                continue
            try:
                return _convert(value, option_type, key)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches none of: " + "; ".join(errors))
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}")
        return value
    if origin is list:
        (item_type,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_convert(item, item_type, f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        _, value_type = typing.get_args(tp)
        return {k: _convert(v, value_type, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {_type_name(tp)} for {key}")


def _check_constraints(value: Any, metadata: dict, key: str) -> None:
    if value is None or isinstance(value, (bool, str, list, dict)):
        return
    if "minimum" in metadata and value < metadata["minimum"]:
        raise ConfigError(f"{key}: {value!r} must be >= {metadata['minimum']}")
    if "exclusiveMinimum" in metadata and value <= metadata["exclusiveMinimum"]:
        raise ConfigError(f"{key}: {value!r} must be > {metadata['exclusiveMinimum']}")
    if "maximum" in metadata and value > metadata["maximum"]:
        raise ConfigError(f"{key}: {value!r} must be <= {metadata['maximum']}")


def from_dict(cls: type, data: dict | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a plain dict; unknown keys and bad values raise ConfigError naming the key."""
    data = data or {}
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        if name not in known:
            where = f"{prefix}.{name}" if prefix else name
            raise ConfigError(f"{where}: unknown config key (valid keys here: {', '.join(sorted(known))})")
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        converted = _convert(value, hints[name], key)
        _check_constraints(converted, dict(known[name].metadata), key)
        kwargs[name] = converted
    return cls(**kwargs)  # __post_init__ checks raise ConfigError naming their keys


def to_dict(config: Any) -> dict:
    """The plain-dict form of a config (round-trips through from_dict)."""
    return dataclasses.asdict(config)


def load_config(path: str | Path, overrides: dict | None = None) -> PipelineConfig:
    """Load a YAML config file (plus optional nested overrides) into a PipelineConfig."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    if overrides:
        data = deep_merge(data, overrides)
    try:
        return from_dict(PipelineConfig, data)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def config_from_json(text: str) -> PipelineConfig:
    """Parse the JSON a Snakemake rule passes to a stage (a subset of the pipeline config)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"--config-json: invalid JSON: {error}") from None
    return from_dict(PipelineConfig, data)


def deep_merge(base: dict, update: dict) -> dict:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
