"""params.yaml, the one config, as a whole: every section validated, the presets.

    python -m transformer.config check          # validate params.yaml
    python -m transformer.config list           # the presets
    python -m transformer.config preset NAME    # presets/NAME.yaml over the defaults -> params.yaml
    python -m transformer.config keys KEY...    # each dotted key is in the schema (overrides)
    python -m transformer.config show SECTION   # the section as validated, as JSON

The flows run these in the run's workspace, so that its revision's own schema decides.

Defaults are the offline demo; a preset (presets/NAME.yaml) overrides some of them. A stage
reads only its own sections (`settings.load(TrainConfig, "train")`, the dataclasses in
transformer/core/sections/): no stage imports this module but package, which records them all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from transformer.core.presets import SECTIONS, check_key, load_all, presets, write_preset
from transformer.core.settings import (
    PARAMS,
    ConfigError,
)


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
