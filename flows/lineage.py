"""What a run produced and what it came from: scores, signatures, hashes, revisions, recipe.

A record is read from a `Snapshot`: the files of a project as they are in a folder (the run
workspace after a run) or as a commit holds them (an experiment, a champion), DVC-tracked
metrics included. The evaluate, shard and parent stages' values are read at the exact key paths
transformer/core/metrics.py names, the contract with the stages that write them; a missing one is a
MetricsError naming the file and the key.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from flows.dag import Stage, commit_sha, files_at, locked_outs
from transformer.core.layout import NOT_PACKAGED
from transformer.core.metrics import CONTRACT, KEYS, get
from transformer.core.sections import helpers as roles
from transformer.core.settings import parse_yaml

DOWNLOAD, TOKENIZER, SHARD, EVALUATE = "download", "tokenizer", "shard", "evaluate"  # dvc.yaml
PARENT = "parent"  # dvc.yaml: the model a continued retrain started from
HELPERS = "helpers"  # dvc.yaml: the other lines' champions a run used (flows/helpers.py)
TRAIN = "train"  # dvc.yaml: its metrics' `origin` (the run it went on from), its progress, its turn

# evaluate's values that metrics written by older versions of the stage may lack: the record
# falls back to the manifest's and DVC's hashes (test_set_hash, lineage)
OPTIONAL = ("test_sha256", "tokenizer_sha256")


class Unreadable(Exception):
    """A file the snapshot's commit tracks that cannot be read: its DVC cache entry missing and
    the remote unreachable, an OS error. Never taken for an absent file (the gate fails closed)."""


class Snapshot:
    """A project's files in its folder (rev None) or at a commit (DVC-tracked files through DVC,
    from the local cache or the remote, through the commit's one DVC file system: dag.files_at)."""

    def __init__(self, project: Path, rev: str | None = None):
        self.project, self.rev = Path(project), rev

    def text(self, path: str) -> str | None:
        """The file's text, or None where it does not exist."""
        if self.rev is None:
            p = self.project / path
            return p.read_text() if p.is_file() else None
        r = subprocess.run(
            ["git", "show", f"{self.rev}:{path}"],
            cwd=self.project,
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode == 0:
            return r.stdout
        data = self.tracked(path)
        return None if data is None else data.decode()

    def tracked(self, path: str) -> bytes | None:
        """A file git or DVC tracks at the snapshot's commit (or in the folder), byte for byte;
        None if the commit has no such file; Unreadable if it has one that cannot be read."""
        from dvc.exceptions import DvcException
        from dvc_data.index import DataIndexError

        if self.rev is None:
            p = self.project / path
            return p.read_bytes() if p.is_file() else None
        sha = commit_sha(self.project, self.rev)
        if sha is None:
            return None
        fs = files_at(str(self.project.resolve()), sha)
        try:  # dvc.yaml's paths: relative, "/"-separated, as the file system takes them
            return fs.read_bytes(path)
        except FileNotFoundError as e:
            if not fs.exists(path):  # in neither git's tree nor DVC's index of the commit
                return None
            error: Exception = e  # DVC knows it, yet no cache or remote holds its content
        except (DvcException, DataIndexError, OSError) as e:  # e.g. a directory's listing lost
            error = e
        raise Unreadable(
            f"{path} at {sha[:9]} cannot be read ({type(error).__name__}: {error}); "
            "`dvc pull` it or make the DVC remote reachable"
        ) from error

    def git(self, *args: str) -> str:
        r = subprocess.run(
            ["git", *args], cwd=self.project, capture_output=True, text=True, check=False
        )
        return r.stdout.strip()  # outside a git repo: ""


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"a/b": leaf} for nested dicts; lists and scalars are leaves."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(flatten(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


def value(snap: Snapshot, stage: Stage, field: str, flat: dict[str, Any] | None = None) -> Any:
    """`field` of the contract (transformer/core/metrics.py) from `stage`'s metrics files, by its
    exact key; MetricsError naming the files and the key when it is not there."""
    flat = read_metrics(snap, stage) if flat is None else flat
    return get(flat, CONTRACT[stage.name], field, ", ".join(stage.metrics))


def read_metrics(snap: Snapshot, stage: Stage | None) -> dict[str, Any]:
    """The stage's metrics files merged and flattened (missing or unreadable files give {})."""
    flat: dict[str, Any] = {}
    for path in stage.metrics if stage else ():
        try:
            flat.update(flatten(json.loads(snap.text(path) or "")))
        except ValueError:
            continue
    return flat


def code_hash(lock_text: str | None) -> str | None:
    """One hash of the code the stages ran, as dvc.lock records it: each stage's command and
    DVC's hashes of its code deps (the .py files dvc.yaml lists); None before any run."""
    lock = (parse_yaml(lock_text) if lock_text else None) or {}
    code = sorted(
        (name, entry.get("cmd"), d["path"], d.get("md5") or d.get("hash", ""))
        for name, entry in (lock.get("stages") or {}).items()
        for d in entry.get("deps", [])
        if d["path"].endswith(".py")
    )
    return hashlib.sha256(json.dumps(code).encode()).hexdigest() if code else None


def code_now(ws: Path) -> str:
    """code_hash of the code checked out in `ws` now: dvc.lock's when `dvc status` sees no
    stage's command or code changed since, else a value no record holds (a change)."""
    from dvc.repo import Repo

    with Repo(str(ws)) as repo:
        status = repo.status()
    changed = sorted(
        name
        for name, changes in status.items()
        for c in changes
        if c == "changed command"
        or (isinstance(c, dict) and any(p.endswith(".py") for p in c.get("changed deps", {})))
    )
    if changed:
        return f"code changed since dvc.lock in stages {', '.join(changed)}"
    return str(code_hash((ws / "dvc.lock").read_text() if (ws / "dvc.lock").exists() else None))


def params_hash(text: str | None) -> str | None:
    """sha256 of params.yaml's content as a package keeps it: the sections about how the flows
    retrain a model left out (NOT_PACKAGED: the gate's settings, a retrain's own decision)."""
    if text is None:
        return None
    params = {k: v for k, v in (parse_yaml(text) or {}).items() if k not in NOT_PACKAGED}
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()


def outs_hash(lock: dict[str, dict[str, str]], dag: dict[str, Stage], name: str) -> str:
    """DVC's content hashes of a stage's outputs (metrics excluded), from dvc.lock."""
    stage = dag.get(name)
    outs = lock.get(name, {})
    data = {p: h for p, h in outs.items() if stage and p not in stage.metrics}
    return ",".join(f"{p}={h}" for p, h in sorted(data.items()))


def test_set_hash(
    eval_flat: dict[str, Any], manifest: dict[str, Any], split: str = "test"
) -> str | None:
    """The scored set's identity: evaluate's own hash (KEYS["test_sha256"]); for metrics written
    before evaluate recorded one (older champions), the manifest's sha256s of the files of
    `split` (the split evaluate scored: a valid score is never compared with a test one)."""
    if found := eval_flat.get(KEYS["test_sha256"]):
        return str(found)
    parts = sorted(
        f"{k}={v}"
        for k, v in manifest.items()
        if k.endswith("sha256") and any(c.startswith(split) for c in k.split("/"))
    )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest() if parts else None


def used(flat: dict[str, Any]) -> str | None:
    """The other lines' champions a run used, in words with their versions (the helpers
    stage's metrics, flattened: "backward/version" ...), or why a declared one was not."""
    nested: dict[str, dict[str, Any]] = {}
    for key, v in flat.items():
        role, _, field = key.partition("/")
        nested.setdefault(role, {})[field] = v
    return "; ".join(roles.describe(nested)) or None


def lineage(snap: Snapshot, dag: dict[str, Stage], rev: str, **extra: Any) -> dict[str, Any]:
    """The record of the run in `snap`, trained from commit `rev`: every FIELDS value (None when
    missing), data/shards/code/params hashes, `extra` (recipe, experiment...)."""
    metrics = {name: read_metrics(snap, dag.get(name)) for name in (DOWNLOAD, EVALUATE)}
    strict = EVALUATE in dag  # a project without the stage: no scores, None
    record = {
        f: value(snap, dag[EVALUATE], f, metrics[EVALUATE])
        if strict and f not in OPTIONAL
        else metrics[EVALUATE].get(KEYS[f])
        for f in KEYS
    }
    if record["split"] is not None:  # the set scored: its hash
        record["split"] = str(record["split"])
        record["test_sha256"] = test_set_hash(metrics[EVALUATE], metrics[DOWNLOAD], record["split"])
    lock_text = snap.text("dvc.lock")
    lock = locked_outs(lock_text)
    record["data_hash"] = outs_hash(lock, dag, DOWNLOAD)
    # With BPE-dropout (shard.bpe_dropout) the shards no longer follow from data + tokenizer
    record["shards_hash"] = outs_hash(lock, dag, SHARD) or None
    if record["tokenizer_sha256"] is None:  # fall back to DVC's hash of the tokenizer outputs
        toks = lock.get(TOKENIZER, {})
        record["tokenizer_sha256"] = ",".join(f"{p}={h}" for p, h in sorted(toks.items())) or None
    if PARENT in dag:  # a continued run's parent version and ancestors
        flat = read_metrics(snap, dag[PARENT])
        for f in CONTRACT[PARENT]:
            record[f] = value(snap, dag[PARENT], f, flat)
    else:  # a project without the parent stage
        record["parent"] = record["parent_chain"] = None
    record["parent_hash"] = outs_hash(lock, dag, PARENT) or None  # the package DVC saw
    record["helpers"] = used(read_metrics(snap, dag.get(HELPERS))) if HELPERS in dag else None
    trained = read_metrics(snap, dag.get(TRAIN))  # a run that went on from another's checkpoints
    origin = {k.removeprefix("origin/"): v for k, v in trained.items() if k.startswith("origin/")}
    record["origin"] = origin or None
    record["code_revision"] = rev
    record["code_hash"] = code_hash(lock_text)
    record["params_sha256"] = params_hash(snap.text("params.yaml"))
    record.update(extra)
    return record
