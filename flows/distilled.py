"""A student's gate (issue 82): a line whose declaration names a teacher (meta.uses.teacher) is
promoted only when its candidate is both close enough to the teacher and fast enough against
it, besides beating its own line's champion (decision.gate).

- Quality: its BLEU on the evaluate split at most `retrain.max_gap` below the teacher's, the
  difference measured by sacreBLEU's paired bootstrap (significance.paired_bs: the same
  resamples as the champion's test) of the candidate's hypotheses against the teacher's.
- Speed: at least `retrain.min_speedup` times the teacher's sentences per second.

Both come from the candidate's own run: the race stage (transformer/race.py) decoded the split
with the student and with the teacher champion it was trained from (the version the run pinned),
on the same machine, one thread each, each with its serving settings, and kept the teacher's
hypotheses. A candidate without that race (its teacher not used, the stage missing) is refused.
Torch-free.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flows import lines, significance
from flows.dag import read_dag
from flows.lineage import Snapshot, Unreadable
from transformer.core.files import split_lines

RACE = "race"  # dvc.yaml: the stage that races the student against its teacher


def teacher_of(project: Path, line: str) -> str | None:
    """The teacher line `line` declares (meta.uses.teacher), or None: not a student."""
    found = lines.get(Path(project), line)
    return next((u.line for u in found.uses if u.role == "teacher"), None)


def said(flat: dict[str, Any]) -> str | None:
    """A run's race in words, from its flattened metrics: "0.40 below en-de@v1.0.0, 2.10x";
    None where the run raced no teacher (`make results --wide`)."""
    if not flat.get("teacher/line"):
        return None
    return (
        f"{flat.get('bleu_gap')} below {flat['teacher/line']}@{flat.get('teacher/version')}, "
        f"{flat.get('speedup')}x"
    )


def raced(project: Path, commit: str) -> tuple[dict[str, Any], list[str] | None]:
    """(the race stage's metrics at `commit`, the teacher's hypotheses); ({}, None) where the
    commit's pipeline has no race stage."""
    stage = read_dag(project, rev=commit).get(RACE)
    if stage is None or not stage.metrics:
        return {}, None
    snap = Snapshot(project, commit)
    metrics = json.loads(snap.text(stage.metrics[0]) or "{}")
    (out,) = [o for o in stage.outs if o not in stage.metrics]
    if not metrics.get("teacher"):
        return metrics, None
    data = snap.tracked(f"{out}/{metrics['hyps']}")
    if data is None:  # named by the metrics, so written: lost, not never kept
        raise Unreadable(f"{commit[:9]}: the teacher's hypotheses {out}/{metrics['hyps']} are gone")
    return metrics, split_lines(data, f"{commit[:9]}:{out}/{metrics['hyps']}")


def gate(
    project: Path, candidate: dict[str, Any], rules: significance.Rules, teacher: str
) -> tuple[bool, str, dict[str, Any]]:
    """(both rules pass?, why, the figures): the student `candidate` of line `teacher`."""
    commit = candidate["experiment_commit"]
    try:
        race, theirs = raced(project, commit)
        mine = significance.scored_sets(project, commit, candidate)
        refs = significance.references(project, commit, candidate.get("split") or "test")
    except Unreadable as e:  # fails closed, as the champion's gate
        return False, f"student of {teacher}: cannot read what it must compare: {e}", {}
    if theirs is None or not mine or mine[0].hyps is None or refs is None:
        why = race.get("skipped") or "no race stage, hypotheses or references at its commit"
        return False, f"student of {teacher}: not raced against its teacher ({why})", {}
    test = significance.paired_bs(refs[0], theirs, mine[0].hyps, refs[1], rules.samples, rules.seed)
    return judge(test, race, rules)


def judge(
    test: dict[str, Any], race: dict[str, Any], rules: significance.Rules
) -> tuple[bool, str, dict[str, Any]]:
    """(both rules pass?, why, the figures) of a student's paired test against its teacher
    (significance.paired_bs, the teacher the baseline) and its race (the race stage's metrics);
    a refusal names each rule failed."""
    t = race["teacher"]
    gap, speedup = -test["bleu_delta"], float(race["speedup"])
    figures = {
        "teacher": f"{t.get('line')}@{t.get('version')}",
        "split": race.get("split"),
        "bleu": test["bleu"],
        "teacher_bleu": test["champion_bleu"],
        "gap": round(gap, 4),
        "p": test["p"],
        "bleu_ci": test.get("bleu_ci"),
        "max_gap": rules.max_gap,
        "sentences_per_second": race["student"]["sentences_per_second"],
        "teacher_sentences_per_second": t["sentences_per_second"],
        "speedup": speedup,
        "min_speedup": rules.min_speedup,
        "resamples": rules.samples,
        "seed": rules.seed,
    }
    failed = []
    if gap > rules.max_gap:
        failed.append(
            f"gap: BLEU {test['bleu']:.2f}, {gap:.2f} below the teacher's {test['champion_bleu']:.2f}"
            f" (p {test['p']:.4f}), more than max_gap {rules.max_gap}"
        )
    if speedup < rules.min_speedup:
        failed.append(
            f"speed: {speedup:.2f}x the teacher's sentences/s ({figures['sentences_per_second']} "
            f"vs {figures['teacher_sentences_per_second']}), below min_speedup {rules.min_speedup}"
        )
    figures["failed"] = [f.split(":")[0] for f in failed]
    said = (
        f"BLEU gap {gap:.2f} (max_gap {rules.max_gap}), {speedup:.2f}x the speed "
        f"(min_speedup {rules.min_speedup})"
    )
    if failed:
        return False, f"student of {figures['teacher']} refused: {'; '.join(failed)}", figures
    return True, f"student of {figures['teacher']}: {said}", figures
