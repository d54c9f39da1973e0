"""The champions of other lines a run uses (issue 81): each role's package, checked, or nothing.

    python -m transformer.helpers data/helpers --metrics data/metrics/helpers.json

For each role (ROLES in transformer/core/sections/helpers.py), params.yaml `helpers.ROLE` pins
what the run uses: LINE@VERSION, whose package the flows fetched into data/helpers/ROLE (by
hand: `dvc artifacts get . LINE --rev VERSION -o data/helpers/ROLE`); LINE alone, a declared
line with no champion yet; or nothing. The stage checks a pinned package (its model and tokenizer belong together, it
translates the role's direction) and leaves its files as fetched, so DVC's hash of the folder is
the packages' own and a new champion of a used line reruns the stages that use it. A role
without one is emptied but for NONE, a line saying why, which the stages that use the role
report (they run without that help). The metrics name each role's line and version: the
package stage copies them into lineage.json as `helpers`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from transformer.core import failure, settings
from transformer.core.files import sha256_file, write_json
from transformer.core.layout import LINEAGE, MODEL, TOKENIZER
from transformer.core.sections import helpers as roles
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.helpers import HelpersConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import TokenizerError, read_meta, tokenizer_sha256


class HelperError(ValueError):
    """data/helpers does not hold what params.yaml `helpers` pins; the message names the file."""


def none(helpers_dir: Path, role: str, line: str | None) -> dict[str, Any]:
    """Empty the role's folder but for NONE; its metrics."""
    found = roles.folder(helpers_dir, role)
    if found.is_dir():
        shutil.rmtree(found)
    found.mkdir(parents=True)
    if line:
        why = f"{line} had no champion yet when this run started: trained without it"
    else:
        why = f"no {role} model declared (params.yaml helpers.{role} is empty)"
    (found / roles.NONE).write_text(why + "\n")
    return {"line": line, "version": None, "why": why}


def check(helpers_dir: Path, role: str, pin: str, langs: tuple[str, str]) -> dict[str, Any]:
    """The package pinned in `role`, checked; its metrics."""
    from transformer.model import checkpoint  # torch: ~3 s, which a run with no helper skips

    line, version = roles.parse_pin(pin)
    found = roles.folder(helpers_dir, role)
    model, tok = found / MODEL, found / TOKENIZER
    fetch = f"rm -r {found} && dvc artifacts get . {line} --rev {version} -o {found}"
    if not model.is_file():
        raise HelperError(f"{model}: missing; helpers.{role} pins {pin}: {fetch}")
    try:
        ckpt = checkpoint.load(model, mmap=True)
        meta = read_meta(tok)
    except (checkpoint.CheckpointError, TokenizerError) as e:
        raise HelperError(f"{e} (helpers.{role} pins {pin}: {fetch})") from None
    sha = tokenizer_sha256(tok)
    if ckpt.get("tokenizer_sha256") not in (None, sha):
        raise HelperError(f"{tok}: not the tokenizer {model} was trained with ({fetch})")
    want, got = roles.direction(role, langs), (meta.get("src_lang"), meta.get("tgt_lang"))
    if got != want:
        raise HelperError(
            f"{found}: {pin} translates {got[0]} -> {got[1]}; a {role} model of this "
            f"{langs[0]} -> {langs[1]} run must translate {want[0]} -> {want[1]}"
        )
    lineage = found / LINEAGE
    try:
        scores = json.loads(lineage.read_text()) if lineage.is_file() else {}
    except ValueError as e:
        raise HelperError(f"{lineage}: not valid JSON ({e})") from None
    return {
        "line": line,
        "version": version,
        "model_sha256": sha256_file(model),
        "tokenizer_sha256": sha,
        "src_lang": got[0],
        "tgt_lang": got[1],
        "step": int(ckpt["step"]),
        "bleu": scores.get("bleu"),
    }


def prepare(helpers_dir: Path, cfg: HelpersConfig, langs: tuple[str, str]) -> dict[str, Any]:
    """The stage: each role's package checked, or its folder emptied; the metrics."""
    out = {}
    for role in roles.ROLES:
        pin = getattr(cfg, role)
        line, version = roles.parse_pin(pin)
        if line and not version and roles.ROLES[role].required:
            raise HelperError(
                f"helpers.{role} names the {role} line {line} without a version: {line} has no "
                f"champion yet, and a run with a {role} needs one (retrain {line} first, then "
                f"pin it: helpers.{role}={line}@vX.Y.Z)"
            )
        out[role] = (
            check(helpers_dir, role, pin, langs) if version else none(helpers_dir, role, line)
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.helpers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("helpers", type=Path, help="the folder of the roles' packages")
    parser.add_argument("--metrics", type=Path, help="write what it holds here (JSON)")
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    try:
        cfg = settings.load(HelpersConfig, "helpers", args.params)
        dl = settings.load(DownloadConfig, "download", args.params)
        out = prepare(args.helpers, cfg, (dl.src_lang, dl.tgt_lang))
    except (HelperError, ConfigError, OSError) as e:
        sys.exit(f"error: {e}")
    if args.metrics:
        write_json(args.metrics, out)
    for role, used in out.items():
        print(
            f"{role}: " + (roles.pin(used["line"], used["version"]) if used["version"] else "none")
        )


if __name__ == "__main__":
    failure.recorded("helpers", main)()
