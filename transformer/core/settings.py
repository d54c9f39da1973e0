"""params.yaml as typed dataclasses: the reading, the conversion and the checks they share.

`load(TrainConfig, "train")` reads one section into its dataclass (transformer/core/sections/, one
module per section, so that a stage depends on the settings it reads and no others): a missing
section gives the defaults; an unknown key, a wrong type or a bad value is a ConfigError naming
the file and the dotted key. The whole file (every section, the presets, `python -m
transformer.config check`) is transformer/config.py's.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

PARAMS = Path("params.yaml")
# params.yaml's sections, in order (transformer/config.py maps each to its dataclass); a section
# not named here is a typo, refused by every reader
SECTIONS = (
    "download",
    "helpers",
    "score",
    "backtranslate",
    "distill",
    "tokenizer",
    "shard",
    "model",
    "train",
    "average",
    "decode",
    "evaluate",
    "package",
    "retrain",
)
T = TypeVar("T")


class ConfigError(ValueError):
    """A params.yaml problem, always naming the file and the dotted key."""


def choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"{key} must be one of {', '.join(options)}, got {value!r}")


def at_least(section: str, obj: Any, low: float, *keys: str) -> None:
    for k in keys:
        if getattr(obj, k) < low:
            raise ConfigError(f"{section}.{k} must be >= {low}, got {getattr(obj, k)}")


def fraction(section: str, obj: Any, *keys: str) -> None:
    for k in keys:
        if not 0.0 <= getattr(obj, k) < 1.0:
            raise ConfigError(f"{section}.{k} must be in [0, 1), got {getattr(obj, k)}")


def build(tp: Any, value: Any, key: str, src: str) -> Any:
    """Convert `value` to type `tp`, recursing into dataclasses, lists and dicts."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{src}: {key} must be a mapping, got {value!r}")
        hints = typing.get_type_hints(tp)
        # keys of the section that others read (a ClassVar of the dataclass): skipped here
        value = {k: v for k, v in value.items() if k not in getattr(tp, "IGNORED", ())}
        known_keys(tp, value, key, src)
        kwargs = {k: build(hints[k], v, f"{key}.{k}", src) for k, v in value.items()}
        try:
            return tp(**kwargs)
        except ConfigError as e:
            raise ConfigError(f"{src}: {e}") from None
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{src}: {key} must be a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [build(item, v, f"{key}[{i}]", src) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{src}: {key} must be a mapping, got {value!r}")
        _, item = typing.get_args(tp)
        return {k: build(item, v, f"{key}.{k}", src) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and (
        not isinstance(value, tp) or (isinstance(value, bool) and tp is not bool)
    ):
        raise ConfigError(f"{src}: {key} must be {tp.__name__}, got {value!r}")
    return value


# libyaml's loader where PyYAML has it: ~7x faster than the pure-Python one (a 26 kB dvc.lock:
# 131 -> 19 ms), and every stage, flow and CLI parses params.yaml or dvc.lock
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Any:
    """`yaml.safe_load(text)`, with libyaml where available."""
    return yaml.load(text, Loader=SAFE_LOADER)


def read_yaml(path: Path) -> Any:
    """`path` parsed, or a ConfigError naming the file, line and column of a syntax error."""
    try:
        return parse_yaml(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{path}: not valid YAML: {where}{getattr(e, 'problem', e)}") from None


def read_params(path: Path = PARAMS) -> dict[str, Any]:
    """The raw params mapping, with unknown sections rejected."""
    if not path.exists():
        raise ConfigError(f"{path}: no such params file (run from the project root)")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections")
    known_sections(data, str(path))
    return data


def known_sections(names: Any, src: str) -> None:
    unknown = [k for k in names if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"{src}: unknown section {unknown[0]} (valid: {', '.join(SECTIONS)})")


def known_keys(tp: Any, keys: Any, key: str, src: str) -> None:
    names = [f.name for f in dataclasses.fields(tp)]
    unknown = [k for k in keys if k not in names]
    if unknown:
        raise ConfigError(f"{src}: unknown key {key}.{unknown[0]} (valid keys: {', '.join(names)})")


def load(cls: type[T], section: str, path: Path = PARAMS) -> T:
    """Section `section` of params.yaml as a `cls`; a missing section gives the defaults."""
    return build(cls, read_params(path).get(section) or {}, section, str(path))
