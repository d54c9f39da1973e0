"""What a run produced and what it came from: scores, signatures, hashes, revisions.

The metrics files are read defensively: the stages own their formats, so every value is looked
up under a few likely key paths and a missing one is reported by name instead of failing the run.
"""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from flows.dag import Stage, locked_outs

DOWNLOAD, TOKENIZER, SHARD, EVALUATE = "download", "tokenizer", "shard", "evaluate"  # dvc.yaml

# field -> (stage whose metrics hold it, key paths to try; "/" separates nesting levels)
FIELDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bleu": (EVALUATE, ("bleu", "bleu/score", "sacrebleu/bleu", "sacrebleu/score")),
    "chrf": (EVALUATE, ("chrf", "chrf/score", "chrf2", "sacrebleu/chrf")),
    "bleu_signature": (
        EVALUATE,
        ("signatures/bleu", "bleu_signature", "bleu/signature", "signature"),
    ),
    "chrf_signature": (EVALUATE, ("signatures/chrf", "chrf_signature", "chrf/signature")),
    "model_sha256": (EVALUATE, ("model_sha256", "model/sha256")),
    "tokenizer_sha256": (EVALUATE, ("tokenizer_sha256", "tokenizer/sha256")),
    "checkpoints_averaged": (
        EVALUATE,
        ("averaged_checkpoints", "checkpoints_averaged", "checkpoints"),
    ),
    "test_sha256": (EVALUATE, ("test_sha256", "test/sha256", "references_sha256")),
}


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"a/b": leaf} for nested dicts; lists and scalars are leaves."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(flatten(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


def pick(flat: dict[str, Any], paths: tuple[str, ...]) -> Any:
    """The first leaf whose key path is, or ends with, one of `paths`; None if none does."""
    for p in paths:
        for key in sorted(flat, key=lambda k: k.count("/")):
            if key == p or key.endswith("/" + p):
                return flat[key]
    return None


def read_metrics(project: Path, stage: Stage | None) -> dict[str, Any]:
    """The stage's metrics files merged and flattened (missing or unreadable files give {})."""
    flat: dict[str, Any] = {}
    for path in stage.metrics if stage else ():
        try:
            flat.update(flatten(json.loads((project / path).read_text())))
        except (OSError, ValueError):
            continue
    return flat


def git_revision(project: Path) -> str:
    """HEAD's commit, with "+dirty" when tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=project, capture_output=True, text=True,
                              check=False).stdout  # outside a git repo: ""

    rev = git("rev-parse", "HEAD").strip() or "no commit"
    return rev + ("+dirty" if git("status", "--porcelain", "--untracked-files=no").strip() else "")


def outs_hash(project: Path, dag: dict[str, Stage], name: str) -> str:
    """DVC's content hashes of a stage's outputs (metrics excluded), from dvc.lock."""
    stage = dag.get(name)
    outs = locked_outs(project).get(name, {})
    data = {p: h for p, h in outs.items() if stage and p not in stage.metrics}
    return ",".join(f"{p}={h}" for p, h in sorted(data.items()))


def data_hash(project: Path, dag: dict[str, Stage]) -> str:
    """DVC's content hash of the download stage's data outputs."""
    return outs_hash(project, dag, DOWNLOAD)


def test_set_hash(eval_flat: dict[str, Any], manifest: dict[str, Any], split: str = "test"
                  ) -> str | None:
    """The scored set's identity: evaluate's own hash, else the manifest's sha256s of the files
    of `split` (the split evaluate scored: a valid score is never compared with a test one)."""
    if found := pick(eval_flat, FIELDS["test_sha256"][1]):
        return str(found)
    parts = sorted(
        f"{k}={v}"
        for k, v in manifest.items()
        if k.endswith("sha256") and any(c.startswith(split) for c in k.split("/"))
    )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest() if parts else None


def lineage(project: Path, dag: dict[str, Stage], **extra: Any) -> dict[str, Any]:
    """The run's record: every FIELDS value (None when missing), hashes, revision, `extra`."""
    metrics = {name: read_metrics(project, dag.get(name)) for name in (DOWNLOAD, EVALUATE)}
    record = {f: pick(metrics[stage], paths) for f, (stage, paths) in FIELDS.items()}
    record["split"] = str(pick(metrics[EVALUATE], ("split",)) or "test")
    record["test_sha256"] = test_set_hash(metrics[EVALUATE], metrics[DOWNLOAD], record["split"])
    record["data_hash"] = data_hash(project, dag)
    # With BPE-dropout (shard.bpe_dropout) the shards no longer follow from data + tokenizer
    record["shards_hash"] = outs_hash(project, dag, SHARD) or None
    if record["tokenizer_sha256"] is None:  # fall back to DVC's hash of the tokenizer outputs
        toks = locked_outs(project).get(TOKENIZER, {})
        record["tokenizer_sha256"] = ",".join(f"{p}={h}" for p, h in sorted(toks.items())) or None
    record["git_revision"] = git_revision(project)
    record.update(extra)
    return record


def missing(record: dict[str, Any], dag: dict[str, Stage]) -> list[str]:
    """`file: key` for each expected value the metrics files did not provide."""
    return [
        f"{', '.join(dag[stage].metrics) if stage in dag else stage + ' (no such stage)'}: {f}"
        for f, (stage, _) in FIELDS.items()
        if record.get(f) is None
    ]


def curves(project: Path, dag: dict[str, Stage]) -> list[tuple[str, int, str, str]]:
    """(plot file, points, first value, last value) for each .tsv/.csv under the plot outputs."""
    rows = []
    for stage in dag.values():
        for plot in stage.plots:
            base = project / plot
            for f in sorted(base.rglob("*") if base.is_dir() else [base]):
                if f.suffix not in (".tsv", ".csv"):
                    continue
                with open(f, newline="") as fh:
                    data = list(csv.reader(fh, delimiter="\t" if f.suffix == ".tsv" else ","))
                if len(data) > 1:
                    rows.append(
                        (str(f.relative_to(project)), len(data) - 1, data[1][-1], data[-1][-1])
                    )
    return rows
