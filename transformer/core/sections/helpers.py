"""The other lines' champions a run uses (issue 81): the roles they are used in, params.yaml
`helpers` (one pin per role) and where each role's package lands.

A line declares the champions it uses in dvc.yaml (`meta.uses`, flows/lines.py), each in a role
of ROLES; a run pins each to a version (`helpers.ROLE`: LINE@VERSION; LINE alone: declared, but
that line has no champion yet; empty: none), the flows fetch its package into the helpers
stage's folder `data/helpers/ROLE/` (flows/helpers.py; by hand `dvc artifacts get . LINE --rev
VERSION -o data/helpers/ROLE` and `-S helpers.ROLE=LINE@VERSION`), and the helpers stage checks
it (transformer/helpers.py). A role with no champion to use holds only NONE, a line saying why.
Torch-free: the flows and the stages read the same table.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer.core.layout import MODEL
from transformer.core.settings import ConfigError

NONE = "NONE"  # the only file of a role's folder when no champion is used in it


@dataclass(frozen=True)
class Role:
    reverse: bool  # the champion translates the other way (tgt -> src of the line using it)
    what: str  # what the stages use it for, in words
    # no run without it: a declared line with no champion yet is an error naming that line (a
    # student has no data without its teacher), and `required: false` cannot be declared
    required: bool = False


# A new role is one more entry; the declaration's checks and the helpers stage follow this table.
ROLES = {
    "backward": Role(True, "scores the corpus (tgt -> src) and back-translates monolingual text"),
    "forward": Role(False, "scores the corpus (src -> tgt) with the backward model"),
    # issue 82: a distilled student's teacher; its translations of the train sources are the
    # student's targets (transformer/distill.py), its speed the student's yardstick (race.py)
    "teacher": Role(False, "translates the train sources a student learns from (src -> tgt)", True),
}


def direction(role: str, langs: tuple[str, str]) -> tuple[str, str]:
    """The (src, tgt) a champion in `role` must translate for a line of `langs`."""
    return (langs[1], langs[0]) if ROLES[role].reverse else langs


def parse_pin(pin: str) -> tuple[str | None, str | None]:
    """params.yaml's `helpers.ROLE`: (line, version); "" -> (None, None), "de-en" -> ("de-en",
    None) (declared, no champion yet), "de-en@v1.0.0" -> ("de-en", "v1.0.0")."""
    line, _, version = pin.partition("@")
    return (line or None), (version or None)


def pin(line: str, version: str | None) -> str:
    return f"{line}@{version}" if version else line


def folder(helpers_dir: Path, role: str) -> Path:
    return Path(helpers_dir) / role


def package(helpers_dir: Path, role: str) -> Path | None:
    """The package used in `role` (the helpers stage checked it), or None: no help in it."""
    found = folder(helpers_dir, role)
    return found if (found / MODEL).is_file() else None


def why_none(helpers_dir: Path, role: str) -> str:
    """Why `role` has no package: the helpers stage's NONE line (or that nothing is there)."""
    marker = folder(helpers_dir, role) / NONE
    if marker.is_file():
        return marker.read_text().strip()
    return f"{folder(helpers_dir, role)}: no package (the helpers stage has not run)"


def describe(record: dict[str, Any] | None) -> list[str]:
    """The helpers stage's metrics (a package's lineage.json `helpers`) in words, one per role
    declared: "backward de-en@v1.0.0", "backward de-en: none (no champion yet; ...)"."""
    out = []
    for role, used in (record or {}).items():
        if not isinstance(used, dict) or not used.get("line"):
            continue
        if used.get("version"):
            out.append(f"{role} {pin(used['line'], used['version'])}")
        else:
            out.append(f"{role} {used['line']}: none ({used.get('why') or 'no champion'})")
    return out


# a pin: "" (none), LINE (declared, no champion yet: trained without it) or LINE@VERSION
PIN = re.compile(r"^([A-Za-z0-9][\w./-]*?)(@v\d+\.\d+\.\d+)?$")


@dataclass
class HelpersConfig:
    """params.yaml `helpers`: one field per role of ROLES (tests/test_score.py checks it)."""

    backward: str = ""  # the reverse line's champion (tgt -> src): scoring, back-translation
    forward: str = ""  # another line's champion of this direction (src -> tgt): scoring
    teacher: str = ""  # a student's teacher (src -> tgt): distillation (issue 82)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value and not PIN.match(value):
                raise ConfigError(
                    f"helpers.{f.name} must be LINE@vX.Y.Z (a champion's version), LINE (no "
                    f"champion yet) or empty, got {value!r}"
                )
