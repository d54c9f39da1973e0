"""The other lines' champions a run uses (a line's dvc.yaml `meta.uses`, flows/lines.py): pinned
when the run starts, fetched into the helpers stage's folder, said in its decision.

`pins` resolves each role the line declares to the used line's champion as it is now, as the
params.yaml override `helpers.ROLE=LINE@VERSION`: a new champion of a used line changes the
recipe's params, so the using line's next retrain runs (as a changed corpus makes it), and a
run's versions never change under it, so two lines that use each other (iterative
back-translation) take turns and never loop. A used line with no champion yet is pinned as
`helpers.ROLE=LINE`: the run trains without it and says so, unless the declaration says
`required: true` (HelperError, before the run starts, naming what to run first).

`fetch` puts the packages a prepared workspace's params.yaml pins into the helpers stage's
output folder (dvc.yaml), `data/helpers/ROLE`, as `dvc artifacts get . LINE --rev VERSION`
does; the stage checks them and DVC hashes them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows import lines, registry
from flows.dag import Stage
from flows.shell import logger
from flows.workspace import git
from transformer.core.sections import helpers as roles
from transformer.core.settings import parse_yaml

HELPERS = "helpers"  # dvc.yaml: the stage whose output folder holds a folder per role


class HelperError(RuntimeError):
    """A used champion that is required and missing, or cannot be fetched; names the line."""


@dataclass(frozen=True)
class Pinned:
    """The overrides that pin a run's used champions, and each one in words."""

    overrides: tuple[str, ...] = ()
    said: tuple[str, ...] = ()

    def text(self) -> str:
        return "; ".join(self.said)


def pins(root: Path, line: lines.Line) -> Pinned:
    """Each champion `line` uses, at its version now (see the module's docstring)."""
    overrides, said = [], []
    for use in line.uses:
        commit = registry.champion_commit(root, use.line)
        version = registry.version_of(root, commit, use.line) if commit else None
        if version is None and use.required:
            instead = (
                f"{line.name} is its student and has no data without it"
                if roles.ROLES[use.role].required
                else "or set required: false to train without it"
            )
            raise HelperError(
                f"{root / 'dvc.yaml'}: artifacts.{line.name}.meta.uses.{use.role}: the "
                f"{use.role} line {use.line} has no champion yet and the {use.role} model is "
                f"required: retrain it first (python -m flows.run retrain/{use.line} --wait); "
                + instead
            )
        overrides.append(f"helpers.{use.role}={roles.pin(use.line, version)}")
        if version is None:
            said.append(f"{use.role} {use.line}: no champion yet, trained without it")
        else:
            said.append(f"{use.role} {roles.pin(use.line, version)}")
    return Pinned(tuple(overrides), tuple(said))


def changed(theirs: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """The pins that differ between the champion's params and the run's, as "role a -> b"."""
    before, after = ((p or {}).get(HELPERS) or {} for p in (theirs, now))
    return [
        f"{role} {before.get(role) or 'none'} -> {after.get(role) or 'none'}"
        for role in roles.ROLES
        if (before.get(role) or "") != (after.get(role) or "")
    ]


def fetch(ws: Path, dag: dict[str, Stage]) -> dict[str, str]:
    """Each package the workspace's params.yaml pins (helpers.ROLE = LINE@VERSION) into the
    helpers stage's folder, replacing what was there; {role: pin} of those fetched."""
    stage = dag.get(HELPERS)
    text = (ws / "params.yaml").read_text() if (ws / "params.yaml").exists() else ""
    pinned = ((parse_yaml(text) or {}).get(HELPERS) or {}) if stage else {}
    wanted = {r: p for r, p in pinned.items() if isinstance(p, str) and roles.parse_pin(p)[1]}
    if not wanted:
        return {}
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    (out,) = [o for o in stage.outs if o not in stage.metrics]
    # the project whose worktree `ws` is: its git tags are the registry
    common = git("rev-parse", "--path-format=absolute", "--git-common-dir", cwd=ws)
    with Repo(str(Path(common).parent)) as repo:
        for role, pin in wanted.items():
            name, version = roles.parse_pin(pin)
            dest = roles.folder(ws / out, role)
            shutil.rmtree(dest, ignore_errors=True)  # into an existing folder DVC would nest it
            try:
                repo.artifacts.download(name, version=version, out=str(dest), force=True)
            except DvcException as e:
                raise HelperError(
                    f"helpers.{role}: cannot fetch {pin} ({e}); `dvc pull` it or make the DVC "
                    "remote reachable"
                ) from e
            logger().info("fetched the %s model %s into %s", role, pin, dest)
    return wanted
