"""The project's lines: one model each (a language pair, a size), declared in dvc.yaml.

Each entry under dvc.yaml's `artifacts:` is a line, with its settings in the artifact's `meta:`

    artifacts:
      en-de:
        path: data/package
        type: model
        meta:
          recipe: {preset: demo, overrides: [train.max_steps=800]}
          schedule: {cron: "0 3 * * 1", timezone: UTC}     # null: run by hand only
          retrain: {margin: 0.5, mode: continue}          # over the recipe's retrain section
          uses: {backward: {line: de-en, required: false}}  # other lines' champions (issue 81)

An artifact without `meta` (a project from before lines) is one line with the behaviour it had:
the recipe is the project's params.yaml (or serve's --retrain-preset/--retrain-override), the
schedule serve's --cron, the gate params.yaml's retrain section. read() checks every line
before anything runs: a bad one is a LineError naming dvc.yaml, the line and the key.

`uses` names, per role (ROLES in transformer/core/sections/helpers.py), the line whose champion
a run of this one uses: `backward` translates the other way (the reverse line: scoring the
corpus), `forward` the same way, `teacher` the same way too: the line is a distilled student
(issue 82), trained on its teacher's translations and gated on its speed and gap against it
(`uses: {teacher: {line: en-de}}`). Each run pins the used line's champion as it is when the
run starts (flows/helpers.py); a line with no champion yet is trained without, unless
`required: true` (always, for a teacher: a HelperError naming the teacher line). A line that
uses itself, or one of another language pair or direction, is a LineError.
Torch-free; the recipe is checked by transformer.core.presets, as `python -m transformer.config
check` checks it. read(project, rev) reads the lines as a commit declares them (its dvc.yaml,
params.yaml and presets/), which is what a run of that commit trains (flows/recipe.py).
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

META_KEYS = ("recipe", "schedule", "retrain", "uses")
RECIPE_KEYS = ("preset", "overrides")
SCHEDULE_KEYS = ("cron", "timezone")
USE_KEYS = ("line", "required")


class LineError(ValueError):
    """A bad declaration: names dvc.yaml, the line and the key."""


@dataclass(frozen=True)
class Use:
    """Another line's champion, used in `role` (meta.uses.ROLE)."""

    role: str
    line: str
    required: bool = False  # no champion yet: an error, not a run without it


@dataclass(frozen=True)
class Line:
    name: str
    path: str  # the artifact's path (dvc.yaml's): the packaged model
    preset: str | None = None  # None: the project's params.yaml as committed
    overrides: tuple[str, ...] = ()  # the recipe's, then the retrain meta's as retrain.KEY=VALUE
    cron: str | None = None
    timezone: str | None = None
    declared: bool = True  # False: an artifact without meta (today's single artifact)
    retrain: dict[str, Any] = field(default_factory=dict)
    uses: tuple[Use, ...] = ()
    langs: tuple[str, str] | None = None  # (download.src_lang, tgt_lang) its recipe resolves to


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a duplicate key (yaml keeps the last one silently)."""


def _mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise LineError(
                f"dvc.yaml line {key_node.start_mark.line + 1}: {key!r} is declared twice "
                f"(first on line {seen[key] + 1})"
            )
        seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


class Files:
    """The files that declare the lines: dvc.yaml, params.yaml and the presets, as the project's
    folder has them (rev None; the presets this code ships) or as commit `rev` holds them."""

    def __init__(self, project: Path, rev: str | None = None):
        self.project, self.commit = Path(project), None
        if rev is not None:
            found = self._git("rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}")
            self.commit = found.strip() if found else None
            if self.commit is None:
                raise LineError(f"{self.project}: no commit {rev!r} to read the lines from")

    def _git(self, *args: str) -> str | None:
        r = subprocess.run(
            ["git", *args], cwd=self.project, capture_output=True, text=True, check=False
        )
        return None if r.returncode else r.stdout

    def where(self, path: str) -> str:
        """How an error names the file: its path, and the commit it was read from."""
        return str(self.project / path) + (f" at {self.commit[:9]}" if self.commit else "")

    def text(self, path: str) -> str | None:
        """The file's text, or None where there is none."""
        if self.commit is None:
            file = self.project / path
            return file.read_text() if file.is_file() else None
        return self._git("show", f"{self.commit}:./{path}")

    def presets(self) -> list[str]:
        if self.commit is None:
            from transformer.core import presets

            return presets.presets()
        listed = self._git("ls-tree", "--name-only", self.commit, "--", "presets/") or ""
        return sorted(Path(p).stem for p in listed.split() if p.endswith(".yaml"))

    def write_preset(self, name: str, out: Path) -> None:
        """Preset `name` as `python -m transformer.config preset NAME` writes it, into `out`."""
        from transformer.core import presets

        if self.commit is None:
            presets.write_preset(name, out)
            return
        over = yaml.safe_load(self.text(f"presets/{name}.yaml") or "") or {}
        defaults = {n: asdict(cls()) for n, cls in presets.SECTIONS.items()}
        out.write_text(yaml.safe_dump(presets.merge(defaults, over), sort_keys=False))


# (project, dvc.yaml, params.yaml) -> lines, for the folder; (project, commit) for a commit
_checked: dict[tuple[Path, str, str] | tuple[Path, str], list[Line]] = {}


def read(project: Path = Path("."), rev: str | None = None) -> list[Line]:
    """Every line of the project's dvc.yaml, in declaration order, each checked: as the folder
    has it (rev None), or as commit `rev` declares it."""
    files = Files(Path(project), rev)
    if files.commit is None:
        path, params = files.project / "dvc.yaml", files.text("params.yaml")
        text = path.read_text()
        key: tuple = (path.resolve(), text, params or "")
    else:
        text = files.text("dvc.yaml")
        if text is None:
            raise LineError(f"{files.where('dvc.yaml')}: no such file")
        key = (files.project.resolve(), files.commit)
    if key not in _checked:
        _checked[key] = _read(files, text)
    return _checked[key]


def _read(files: Files, text: str) -> list[Line]:
    path = files.where("dvc.yaml")
    try:
        arts = (yaml.load(text, Loader=_Loader) or {}).get("artifacts") or {}
    except yaml.YAMLError as e:
        raise LineError(f"{path}: not valid YAML: {e}") from None
    except LineError as e:
        raise LineError(f"{path}: {str(e).removeprefix('dvc.yaml ')}") from None
    if not arts:
        raise LineError(f"{path}: no model declared (no entry under artifacts:)")
    found = [check(files, name, spec or {}) for name, spec in arts.items()]
    check_uses(files.where("dvc.yaml"), found)
    return found


def check_uses(where_file: str, found: list[Line]) -> None:
    """Each line's `uses`: a line declared here, not itself, of the role's direction."""
    from transformer.core.sections import helpers as roles

    by_name = {x.name: x for x in found}
    for x in found:
        for u in x.uses:
            where = f"{where_file}: artifacts.{x.name}.meta.uses.{u.role}.line"
            other = by_name.get(u.line)
            if other is None:
                raise LineError(f"{where}: no line {u.line!r} (declared: {', '.join(by_name)})")
            if other is x:
                raise LineError(f"{where}: {x.name} uses itself (a {u.role} model is another line)")
            want = roles.direction(u.role, x.langs)
            if other.langs != want:
                have = " -> ".join(other.langs or ("?", "?"))
                raise LineError(
                    f"{where}: {u.line} translates {have}; a {u.role} model of {x.name} "
                    f"({' -> '.join(x.langs)}) must translate {' -> '.join(want)}"
                )


def get(project: Path, name: str | None, rev: str | None = None) -> Line:
    """Line `name`, or the project's only line when `name` is None (at commit `rev`, if given)."""
    found = read(project, rev)
    where = Files(Path(project), rev).where("dvc.yaml")
    if name is None:
        if len(found) == 1:
            return found[0]
        raise LineError(
            f"{where} declares {len(found)} lines "
            f"({', '.join(x.name for x in found)}): name one (--line NAME)"
        )
    for x in found:
        if x.name == name:
            return x
    raise LineError(
        f"{where}: no line {name!r} under artifacts: (declared: {', '.join(x.name for x in found)})"
    )


def check(files: Files, name: str, spec: dict[str, Any]) -> Line:
    """The Line of artifact `name`, or LineError naming the line and the key."""
    from gto.constants import assert_name_is_valid
    from gto.exceptions import ValidationError

    where = f"{files.where('dvc.yaml')}: artifacts.{name}"
    try:
        assert_name_is_valid(name)
    except ValidationError as e:
        raise LineError(f"{where}: not a name GTO can tag: {e}") from None
    if not spec.get("path"):
        raise LineError(f"{where}.path: missing")
    meta = spec.get("meta")
    if meta is None:
        return Line(name, spec["path"], declared=False, langs=project_langs(files))
    meta = _keys(meta, META_KEYS, f"{where}.meta")
    recipe = _keys(meta.get("recipe") or {}, RECIPE_KEYS, f"{where}.meta.recipe")
    preset = recipe.get("preset")
    overrides = recipe.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise LineError(f"{where}.meta.recipe.overrides: a list of KEY=VALUE strings")
    gate = _keys(meta.get("retrain") or {}, None, f"{where}.meta.retrain")
    every = [*overrides, *retrain_overrides(gate)]
    sections = check_recipe(files, preset, overrides, where, ".meta.recipe.overrides")
    langs = (sections["download"].src_lang, sections["download"].tgt_lang)
    if gate:
        check_recipe(files, preset, every, where, ".meta.retrain")
    cron, tz = schedule(meta.get("schedule"), f"{where}.meta.schedule")
    used = uses(meta.get("uses"), f"{where}.meta.uses")
    return Line(name, spec["path"], preset, tuple(every), cron, tz, True, gate, used, langs)


def uses(value: Any, where: str) -> tuple[Use, ...]:
    """meta.uses: {ROLE: {line: NAME, required: bool}} as Uses, each key checked."""
    from transformer.core.sections import helpers as roles

    out = []
    for role, spec in _keys(value or {}, tuple(roles.ROLES), where).items():
        spec = _keys(spec, USE_KEYS, f"{where}.{role}")
        if not isinstance(spec.get("line"), str) or not spec["line"]:
            raise LineError(f"{where}.{role}.line: missing (the name of the line it uses)")
        must = roles.ROLES[role].required
        required = spec.get("required", must)
        if not isinstance(required, bool):
            raise LineError(f"{where}.{role}.required: true or false, got {spec['required']!r}")
        if must and not required:
            raise LineError(
                f"{where}.{role}.required: a {role} is always required ({roles.ROLES[role].what}:"
                " no run without it); leave the key out"
            )
        out.append(Use(role, spec["line"], required))
    return tuple(out)


def project_langs(files: Files) -> tuple[str, str] | None:
    """The language pair of the project's params.yaml (an undeclared line's recipe)."""
    from transformer.core.settings import parse_yaml

    try:
        dl = (parse_yaml(files.text("params.yaml") or "{}") or {}).get("download") or {}
    except ValueError:  # not a params file: checked where a run reads it
        return None
    return dl.get("src_lang", "en"), dl.get("tgt_lang", "de")


def _keys(value: Any, allowed: tuple[str, ...] | None, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise LineError(f"{where}: a mapping, got {value!r}")
    for k in value:
        if allowed is not None and k not in allowed:
            raise LineError(f"{where}.{k}: unknown key (known: {', '.join(allowed)})")
    return value


def retrain_overrides(gate: dict[str, Any], prefix: str = "retrain") -> list[str]:
    """The retrain meta as `dvc exp run -S` overrides, nested mappings flattened."""
    out = []
    for k, v in gate.items():
        if isinstance(v, dict):
            out += retrain_overrides(v, f"{prefix}.{k}")
        else:
            text = {True: "true", False: "false"}.get(v, v) if isinstance(v, bool) else v
            out.append(f"{prefix}.{k}={text}")
    return out


def check_recipe(
    files: Files, preset: str | None, overrides: list[str], where: str, part: str
) -> dict[str, Any]:
    """The preset and overrides applied as a run applies them, then validated as `python -m
    transformer.config check` validates params.yaml: every section, {name: its settings}."""
    from dvc.utils.hydra import apply_overrides

    from transformer.core import presets
    from transformer.core.settings import ConfigError

    if preset is not None and preset not in (known := files.presets()):
        raise LineError(
            f"{where}.meta.recipe.preset: no preset {preset!r} (available: {', '.join(known)})"
        )
    try:
        for o in overrides:
            if "=" not in o:
                raise ConfigError(f"{o!r} is not KEY=VALUE")
            presets.check_key(o.split("=", 1)[0].lstrip("+~"), f"override {o!r}")
    except ConfigError as e:
        raise LineError(f"{where}{part}: {e}") from None
    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.yaml"
        if preset is None:
            params.write_text(files.text("params.yaml") or "{}\n")
        else:
            files.write_preset(preset, params)
        try:
            if overrides:
                apply_overrides(params, list(overrides))
            return presets.load_all(params)
        except Exception as e:  # noqa: BLE001  hydra's and the sections' errors alike
            msg = str(e).replace(str(params), "the recipe")
            raise LineError(f"{where}{part}: refused by the config check: {msg}") from None


def schedule(value: Any, where: str) -> tuple[str | None, str | None]:
    """(cron, timezone) as Prefect's CronSchedule accepts them; (None, None) for none."""
    if value is None:
        return None, None
    value = _keys(value, SCHEDULE_KEYS, where)
    if not value.get("cron"):
        raise LineError(f"{where}.cron: missing (or schedule: null for none)")
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=str(value["cron"]), timezone=value.get("timezone") or "UTC")
    except ValueError as e:
        first = next(x for x in str(e).splitlines() if "Value error" in x).strip()
        raise LineError(f"{where}: {first}") from None
    return str(value["cron"]), value.get("timezone")
