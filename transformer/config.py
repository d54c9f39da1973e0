"""params.yaml, the one config, as a whole: every section validated, the presets.

    python -m transformer.config check          # validate params.yaml
    python -m transformer.config list           # the presets
    python -m transformer.config preset NAME    # presets/NAME.yaml over the defaults -> params.yaml
    python -m transformer.config keys KEY...    # each dotted key is in the schema (overrides)
    python -m transformer.config show SECTION   # the section as validated, as JSON

The flows run these in the run's workspace, so that its revision's own schema decides.

Defaults are the offline demo; a preset (presets/NAME.yaml) overrides some of them. A stage
reads only its own sections (`settings.load(TrainConfig, "train")`, the dataclasses in
transformer/sections/): no stage imports this module but package, which records them all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from transformer import settings
from transformer.files import atomic_write
from transformer.sections.average import AverageConfig
from transformer.sections.decode import DecodeConfig
from transformer.sections.download import DownloadConfig
from transformer.sections.evaluate import EvaluateConfig
from transformer.sections.model import ModelConfig
from transformer.sections.package import PackageConfig
from transformer.sections.retrain_flow import RetrainFlowConfig
from transformer.sections.shard import ShardConfig
from transformer.sections.tokenizer import TokenizerConfig
from transformer.sections.train import TrainConfig
from transformer.settings import PARAMS, ConfigError, build, known_keys, known_sections, read_yaml

PRESETS = Path(__file__).resolve().parent.parent / "presets"
SECTIONS: dict[str, type] = {
    "download": DownloadConfig,
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m transformer.config", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("preset", help="write presets/NAME.yaml over the defaults to params.yaml")
    p.add_argument("name", help="one of: " + ", ".join(presets()))
    p.add_argument("--out", type=Path, default=PARAMS)
    sub.add_parser("list", help="list the presets")
    sub.add_parser("check", help="validate params.yaml")
    k = sub.add_parser("keys", help="check that each dotted key (an override's) is in the schema")
    k.add_argument("keys", nargs="+")
    s = sub.add_parser("show", help="one section of params.yaml, validated, as JSON")
    s.add_argument("section", choices=list(SECTIONS))
    s.add_argument("--params", type=Path, default=PARAMS, help="the params file")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "preset":
            write_preset(args.name, args.out)
            print(f"{args.out}: now preset {args.name}")
        elif args.cmd == "list":
            print("\n".join(presets()))
        elif args.cmd == "keys":
            for key in args.keys:
                check_key(key, f"override {key!r}")
        elif args.cmd == "show":
            section = load_all(args.params)[args.section]
            print(json.dumps(dataclasses.asdict(section)))
        else:
            load_all()
            print(f"{PARAMS}: ok")
    except ConfigError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
