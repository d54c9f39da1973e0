"""@flow retrain: a fixed recipe (preset + overrides) retrained when something it depends on
changed since the champion; the candidate goes through the promotion gate (flows/promote.py).

"Changed" is any of: the training data (DVC's hash of the refreshed download stage's output),
the code (DVC's hashes of the stages' commands and code deps; `dvc status` in the workspace),
the recipe (the resolved params.yaml, `retrain` section aside). Nothing changed: nothing is
trained.

With `retrain.mode: continue` the candidate starts from the champion: its package is fetched
into the parent stage's folder (dvc.yaml), its tokenizer kept, its weights trained on for
`retrain.continuation`. It trains from scratch instead, saying why in the decision, when there is
no champion, when the recipe changed the model's shape, the tokenizer's settings or the language
pair, or when the champion's tokenizer leaves more than `retrain.max_oov_rate` of the new data's
words to single bytes (measured where it first meets the new data: `python -m transformer.data.vocab
fit`, before any stage but download). The flow decides first (`decide_start`, pure), writes the
decision into params.yaml once, then runs each stage once.

Each line of the project (flows/lines.py) retrains in its own run workspace behind its own lock,
against its own champion: `line` names it (the deployment `retrain/NAME` passes it); the
project's only line when None. The other lines' champions it uses (its `meta.uses`) are pinned
as the run starts (flows/helpers.py): a new champion of a used line is a changed recipe, and the
decision names each one used, or says the run trained without it.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows import helpers, lineage, recipe, registry, tags, workspace
from flows.artifacts import written
from flows.dag import Stage, read_dag
from flows.decision import decide, sync
from flows.locks import workspace_lock
from flows.pipeline import prepare, run_experiment, run_stages, start_attempt
from flows.promote import report, summary
from flows.shell import apply_params, logger, read_section, run
from transformer.core.layout import TOKENIZER
from transformer.core.sections.model import LATER, WEIGHT_KEYS
from transformer.core.settings import parse_yaml

IDENTITY = ("data_hash", "code_hash", "params_sha256")  # what a champion was made from

# params that must be the champion's for its weights and tokenizer to fit the recipe
KEPT = {
    "model": WEIGHT_KEYS,  # the model's, as a checkpoint is loaded only into one that has them
    "tokenizer": ("type", "vocab_size", "min_frequency"),
    "download": ("src_lang", "tgt_lang"),
}


def identity(ws: Path, dag: dict[str, Stage]) -> dict[str, Any]:
    """The IDENTITY values of the workspace as it is now (data refreshed, recipe applied)."""
    snap = lineage.Snapshot(ws)
    return {
        "data_hash": lineage.outs_hash(
            lineage.locked_outs(snap.text("dvc.lock")), dag, lineage.DOWNLOAD
        ),
        "code_hash": lineage.code_now(ws),  # DVC's view: `dvc status` of the stages' code
        "params_sha256": lineage.params_hash(snap.text("params.yaml")),
    }


def unfit(champion_params: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """The KEPT settings in which the recipe differs from the champion's, as "key a -> b"."""

    def kept(p: dict[str, Any], section: str, k: str) -> Any:
        v = p.get(section, {}).get(k)
        # a model key added since the champion was made: it had the value that reproduces it
        return LATER.get(k) if v is None and section == "model" else v

    return [
        f"{section}.{k} {kept(champion_params, section, k)!r} -> {kept(params, section, k)!r}"
        for section, keys in KEPT.items()
        for k in keys
        if kept(champion_params, section, k) != kept(params, section, k)
    ]


def fetch_parent(
    root: Path, ws: Path, dag: dict[str, Stage], version: str, line: str | None = None
) -> Path:
    """Line `line`'s champion's package (`dvc artifacts get . NAME --rev V`) into the parent
    stage's output folder in the workspace, replacing what was there; that folder."""
    from dvc.repo import Repo

    (out,) = [o for o in dag[lineage.PARENT].outs if o not in dag[lineage.PARENT].metrics]
    name, _ = registry.artifact(root, line)
    dest = ws / out
    shutil.rmtree(dest, ignore_errors=True)  # into an existing folder DVC would nest it
    with Repo(str(root)) as repo:
        repo.artifacts.download(name, version=version, out=str(dest), force=True)
    logger().info("fetched the champion %s@%s into %s", name, version, dest)
    return dest


def probe(ws: Path, dag: dict[str, Stage], parent: Path) -> dict[str, Any]:
    """The fit of the parent package's tokenizer to the new train data (vocab.Subwords.fit), by
    the workspace's own code: where the kept tokenizer first meets the new data."""
    dl = read_section(ws, "download")
    outs = [o for o in dag[lineage.DOWNLOAD].outs if o not in dag[lineage.DOWNLOAD].metrics]
    # the folder that holds the train pairs (download also writes the monolingual part)
    raw = next((o for o in outs if (ws / o / f"train.{dl['src_lang']}").exists()), outs[0])
    files = [f"{raw}/train.{dl[k]}" for k in ("src_lang", "tgt_lang")]
    cmd = [sys.executable, "-m", "transformer.data.vocab", "fit", str(parent / TOKENIZER), *files]
    return json.loads(run(cmd, ws, "the champion's tokenizer on the new data")[-1])


@dataclass(frozen=True)
class Start:
    """How the candidate trains: from the champion `parent` (a version) or from scratch (None);
    why; the overrides that say so in params.yaml."""

    parent: str | None
    why: str
    overrides: tuple[str, ...] = ()


def decide_start(
    mode: str,
    champion: dict[str, Any] | None,
    theirs: dict[str, Any] | None,
    params: dict[str, Any],
    max_oov_rate: float,
    fit: Callable[[str], dict[str, Any]],
) -> Start:
    """Scratch or continue, and why, from retrain.mode, the champion's record and params
    (`theirs`), the recipe's params and retrain.max_oov_rate. `fit(version)` gives the
    champion's tokenizer's fit to the new data; it is asked only when all else allows going on."""
    if mode == "scratch":
        return Start(None, "from scratch (retrain.mode scratch)")
    scratch = ("retrain.mode=scratch",)
    if not champion or not champion.get("version"):
        return Start(None, "from scratch: no champion to continue from", scratch)
    version = champion["version"]
    if differs := unfit(theirs or {}, params):
        why = f"from scratch: the recipe changed {'; '.join(differs)} since {version}"
        return Start(None, why, scratch)
    if (rate := fit(version)["oov_rate"]) > max_oov_rate:
        why = (
            f"from scratch: {version}'s tokenizer leaves {rate:.2%} of the new train data's "
            f"words to single bytes, more than retrain.max_oov_rate {max_oov_rate:.2%}"
        )
        return Start(None, why, scratch)
    why = (
        f"continued from {version} (its tokenizer kept, OOV rate {rate:.2%}; its weights "
        "trained on for retrain.continuation)"
    )
    return Start(version, why, (f"retrain.parent={version}",))


def plan(
    root: Path,
    ws: Path,
    dag: dict[str, Stage],
    champion: dict[str, Any] | None,
    line: str | None = None,
) -> tuple[Start, dict[str, Any]]:
    """The decision on what is known after the download stage (the champion's package fetched
    only to measure its tokenizer's fit), and the retrain section as the workspace reads it."""
    from transformer.core.settings import read_params

    cfg = read_section(ws, "retrain")
    theirs = None
    if champion and champion.get("experiment_commit"):
        text = lineage.Snapshot(root, champion["experiment_commit"]).text("params.yaml")
        theirs = parse_yaml(text or "{}")

    def fit(version: str) -> dict[str, Any]:
        return probe(ws, dag, fetch_parent(root, ws, dag, version, line))

    mode, params = cfg["mode"], read_params(ws / "params.yaml")
    return decide_start(mode, champion, theirs, params, cfg["max_oov_rate"], fit), cfg


def used(
    root: Path, ws: Path, champion: dict[str, Any] | None, pinned: helpers.Pinned, changed: list
) -> list[str]:
    """The decision's words on the other lines' champions the run uses: each one's version (or
    that it has none yet), and, where the recipe changed, the pins that moved since the
    champion (a used line's new champion)."""
    from transformer.core.settings import read_params

    out = [f"using {pinned.text()}"] if pinned.said else []
    if "params_sha256" in changed and champion and champion.get("experiment_commit"):
        text = lineage.Snapshot(root, champion["experiment_commit"]).text("params.yaml")
        moved = helpers.changed(parse_yaml(text or "{}"), read_params(ws / "params.yaml"))
        if moved:
            out.append(
                f"used champions changed since {champion.get('version')}: {'; '.join(moved)}"
            )
    return out


@flow(name="retrain", log_prints=True)
def retrain(
    preset: str | None = recipe.LINE_RECIPE,
    overrides: list[str] | None = None,
    rev: str = "HEAD",
    project: str = ".",
    refresh_data: bool = True,
    download_retries: int = 3,
    retry_delay_s: float = 10.0,
    line: str | None = None,
    local_only: bool = False,
) -> dict[str, Any]:
    """Retrain line `line`'s recipe when its data, code or params changed since the line's
    champion; promote the candidate only if it passes the line's gate. Returns the decision and
    why. The line's recipe and gate are read from commit `rev`, the one trained (flows/recipe.py).

    `preset` "line" (the default): the line's own recipe (its dvc.yaml meta), `overrides` after
    the recipe's; the demo preset for a project whose artifact declares no line. Any other
    preset, or None (the project's params.yaml as committed), replaces the recipe; the gate
    stays the line's."""
    root = Path(project).resolve()
    # a bad declaration stops here, before any run
    run = recipe.resolve(root, line, workspace.resolve(root, rev), preset, overrides or [])
    found, preset, overrides = run.line, run.preset, list(run.overrides)
    line = found.name
    if not local_only and tags.has_remote(root):  # the champions as origin knows them
        for name in (line, *(u.line for u in found.uses)):
            sync(root, name)
    pinned = helpers.pins(root, found)  # a required champion missing: stops here too
    overrides = [*overrides, *pinned.overrides]
    key = line if found.declared else None  # an undeclared single artifact: today's workspace
    with workspace_lock(root, key):
        start_attempt()
        ws, commit = prepare(root, run.commit, preset, overrides, key)
        dag = read_dag(ws)
        force = (lineage.DOWNLOAD,) if refresh_data else ()  # fetch the source again
        downloaded = run_stages(
            ws, {lineage.DOWNLOAD: dag[lineage.DOWNLOAD]}, download_retries, retry_delay_s, force
        )
        now, champion = identity(ws, dag), registry.champion(root, line)
        changed = [k for k in IDENTITY if not champion or champion.get(k) != now[k]]
        out: dict[str, Any] = {
            "line": line,
            "retrained": bool(changed),
            "promoted": False,
            "champion_before": champion,
            "candidate": None,
            "version": None,
            "parent": None,
            "helpers": pinned.text() or None,
        }
        if not changed:
            out["reason"] = (
                f"data, code and recipe unchanged since the champion {champion.get('version')} "
                f"({champion.get('experiment')}): nothing retrained"
            )
        else:
            logger().info("changed since the champion: %s", ", ".join(changed))
            start, _ = plan(root, ws, dag, champion, line)
            trained = "; ".join([start.why, *used(root, ws, champion, pinned, changed)])
            logger().info("training %s", trained)
            if start.overrides:  # the decision, written once; then each stage runs once
                apply_params(ws, None, list(start.overrides))
            extra = [*overrides, *start.overrides]
            # the decision writes retrain.* keys only, which the download stage does not read
            candidate = run_experiment(
                ws,
                commit,
                preset,
                extra,
                download_retries,
                retry_delay_s,
                downloaded,
                dag,
                line,
                champion,
            )
            run_id = f"retrain flow run {flow_run.get_id()}"
            out.update(
                decide(
                    root,
                    candidate["experiment_commit"],
                    run.rules.margin,
                    run_id,
                    trained=trained,
                    rules=run.rules,
                    line=line,
                    local_only=local_only,
                )
            )
            out["parent"] = start.parent
            out["stages"] = candidate["stages"]
            out["trained"] = trained
            out["reason"] = f"{', '.join(changed)} changed; trained {trained}; {out['reason']}"
    logger().info("retrain: %s", out["reason"])
    written(  # its description is what `python -m flows.run --wait` prints
        create_markdown_artifact,
        report(out, "Retrain"),
        key="retrain-decision",
        description=summary(out) if out["retrained"] else out["reason"],
    )
    return out
