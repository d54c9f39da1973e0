"""One resolution of a line (flows/lines.py): the recipe a run of it trains and the gate that
judges its candidates, as the revision that runs declares them (its dvc.yaml, params.yaml and
presets/, read from git, never the working tree); and the line a run's recipe belongs to.

The retrain flow, the promote flow and `python -m flows.promote` all take a line's recipe and
gate from resolve(); the pipeline flow records the line its run's recipe belongs to (belongs()),
which is the line `python -m flows.promote EXPERIMENT` then gates the experiment in.

The gate's settings are the line's own: the retrain section of the line's recipe (its preset's,
or params.yaml's when it names none) with the line's meta.retrain over it, whatever a run's
overrides say; a line that declares no recipe (a project from before lines) has params.yaml's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from flows import lines
from flows.significance import Rules
from transformer.core.presets import DEMO

# the retrain flow's default preset: the line's declared recipe (a name no preset file can take:
# the presets are checked against presets/*.yaml, and "line" is not one)
LINE_RECIPE = "line"


@dataclass(frozen=True)
class Resolved:
    """A line at a commit: what a run of it trains (preset, overrides) and its gate."""

    line: lines.Line
    commit: str
    preset: str | None
    overrides: tuple[str, ...]
    rules: Rules


def resolve(
    project: Path,
    name: str | None = None,
    rev: str = "HEAD",
    preset: str | None = LINE_RECIPE,
    overrides: list[str] | tuple[str, ...] = (),
) -> Resolved:
    """Line `name` (the only line when None) as commit `rev` declares it: the recipe a run with
    `preset` and `overrides` trains (recipe()) and the line's gate (gate()). LineError naming
    dvc.yaml (at that commit), the line and the key when it cannot."""
    files = lines.Files(Path(project), rev)
    found = lines.get(project, name, files.commit)
    preset, extra = recipe(found, preset, list(overrides))
    return Resolved(found, str(files.commit), preset, tuple(extra), gate(files, found))


def recipe(
    found: lines.Line, preset: str | None, overrides: list[str]
) -> tuple[str | None, list[str]]:
    """The preset and overrides a run of line `found` trains: with `preset` LINE_RECIPE the
    line's own recipe, `overrides` after the line's (the demo preset for a line that declares
    none); any other preset, or None (params.yaml as committed), replaces the recipe."""
    if preset != LINE_RECIPE:
        return preset, overrides
    if not found.declared:
        return DEMO, overrides  # a line without a declared recipe (retrain/retrain's)
    return found.preset, [*found.overrides, *overrides]


def gate(files: lines.Files, found: lines.Line) -> Rules:
    """Line `found`'s gate: its recipe's retrain section, meta.retrain over it (line.overrides
    end with it), as `files` (a commit) declare them."""
    if found.declared:
        where, part = f"{files.where('dvc.yaml')}: artifacts.{found.name}", ".meta.retrain"
    else:
        where, part = f"{files.where('params.yaml')} (line {found.name}'s gate)", ""
    sections = lines.check_recipe(files, found.preset, list(found.overrides), where, part)
    return Rules.of(asdict(sections["retrain"]))


def belongs(
    project: Path, rev: str, preset: str | None, overrides: list[str] | tuple[str, ...]
) -> list[lines.Line]:
    """The lines, as commit `rev` declares them, whose recipe a run of `preset` and `overrides`
    ran: the same preset and the line's overrides first (a run may add its own after them, as
    `-p overrides` on `retrain/NAME` does), the gate's settings (retrain.*, which change no
    model) aside; of several, those whose recipe says the most. One, or none that fits, or
    several that fit as well."""
    fits = {}
    for x in lines.read(project, rev):
        own = model_overrides(x.overrides)
        if x.declared and x.preset == preset and model_overrides(overrides)[: len(own)] == own:
            fits[x.name] = (x, len(own))
    most = max((n for _, n in fits.values()), default=0)
    return [x for x, n in fits.values() if n == most]


def model_overrides(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """The overrides less the gate's and the retrain flow's settings (retrain.*)."""
    return [o for o in overrides if not o.lstrip("+~").startswith("retrain.")]


def describe(found: list[lines.Line]) -> str:
    """The lines' recipes in one phrase, for an error that lists them."""

    def one(x: lines.Line) -> str:
        if not x.declared:
            return f"{x.name} (no recipe declared)"
        own = model_overrides(x.overrides)
        return f"{x.name} (preset {x.preset}{', overrides ' + ' '.join(own) if own else ''})"

    return "; ".join(one(x) for x in found)
