"""params.yaml as a whole: SECTIONS (every section's dataclass), load_all(), check_key() for
an override's key, and the presets (presets/NAME.yaml over the defaults). Torch-free: the
flows check overrides with it; `python -m transformer.config` is its command line."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml

from transformer.core import settings
from transformer.core.files import atomic_write
from transformer.core.sections.average import AverageConfig
from transformer.core.sections.backtranslate import BacktranslateConfig
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.distill import DistillConfig
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.evaluate import EvaluateConfig
from transformer.core.sections.helpers import HelpersConfig
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.package import PackageConfig
from transformer.core.sections.retrain_flow import RetrainFlowConfig
from transformer.core.sections.score import ScoreConfig
from transformer.core.sections.shard import ShardConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import (
    PARAMS,
    ConfigError,
    build,
    known_keys,
    known_sections,
    read_yaml,
)

PRESETS = Path(__file__).resolve().parents[2] / "presets"
DEMO = "demo"  # the offline demo's preset: the flows' recipe where none is named

SECTIONS: dict[str, type] = {
    "download": DownloadConfig,
    "helpers": HelpersConfig,  # the champions a run uses (a line's meta.uses), pinned
    "score": ScoreConfig,
    "backtranslate": BacktranslateConfig,
    "distill": DistillConfig,  # a student's teacher translations (a line's meta.uses.teacher)
    "tokenizer": TokenizerConfig,
    "shard": ShardConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "average": AverageConfig,
    "decode": DecodeConfig,
    "evaluate": EvaluateConfig,
    "package": PackageConfig,
    "retrain": RetrainFlowConfig,  # the stage settings and the flow-only ones
}


def check_key(dotted: str, src: str) -> None:
    """ConfigError unless `section.key.subkey` is in the schema (under a mapping such as
    download.splits any key is allowed): a key checked before it is written anywhere."""
    section, *path = dotted.split(".")
    known_sections([section], src)
    tp, key = SECTIONS[section], section
    for name in path:
        if not dataclasses.is_dataclass(tp):
            return
        known_keys(tp, [name], key, src)
        tp, key = typing.get_type_hints(tp)[name], f"{key}.{name}"


def load_all(path: Path = PARAMS) -> dict[str, Any]:
    """Every section, validated: {name: dataclass instance}."""
    data = settings.read_params(path)
    return {
        name: build(cls, data.get(name) or {}, name, str(path)) for name, cls in SECTIONS.items()
    }


def merge(base: dict, over: dict) -> dict:
    """`over` laid over `base`, nested mappings merged key by key (neither is modified)."""
    out = dict(base)
    for k, v in over.items():
        if v is None and isinstance(out.get(k), dict):
            continue  # an empty section (comments only): the defaults, as load() reads it
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def preset_params(name: str) -> dict[str, Any]:
    """The full params mapping of preset `name`: the defaults with the preset's overrides."""
    path = PRESETS / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"no preset {name!r} (available: {', '.join(presets())})")
    over = read_yaml(path)
    defaults = {n: dataclasses.asdict(cls()) for n, cls in SECTIONS.items()}
    merged = merge(defaults, over)
    for name_, cls in SECTIONS.items():  # validate before anything is written
        build(cls, merged[name_], name_, str(path))
    return merged


def write_preset(name: str, out: Path = PARAMS) -> None:
    """Replace `out` with preset `name`, atomically."""
    merged = preset_params(name)
    header = f"# Written by `python -m transformer.config preset {name}`; edit freely.\n"
    with atomic_write(out, "w") as f:
        f.write(header + yaml.safe_dump(merged, sort_keys=False, default_flow_style=False))
