"""The promotion gate's noise test: sacreBLEU's paired bootstrap of a candidate against the
champion on each test set both were scored on, from the hypotheses their packages keep.

The test is sacreBLEU's own (`significance.PairedTest`, test type `bs`): the same resamples,
statistic and p-value as `SACREBLEU_SEED=SEED sacrebleu REF -i CHAMPION CANDIDATE --paired-bs
--paired-bs-n N -m bleu chrf`. Its p is two-sided (how often a resampled |difference|, centred,
exceeds the real one), so a set's verdict reads it with the difference's sign: better when BLEU
rose with p < alpha, worse when it fell with p < alpha. Two identical systems get the smallest p
(a zero difference is not attributed to chance), hence the margin as well.

Where the hypotheses come from: the package's eval/ folder (the package stage keeps the evaluate
stage's hypotheses there, so the champion fetched from the DVC remote carries them), else the
evaluate stage's own folder at the experiment's commit (DVC cache). The references are the
candidate's test set (data/raw at its commit); the champion's scores are of the same files, or
the set is not compared (its sha256 differs): the gate never decodes again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows import lines
from flows.dag import read_dag
from flows.lineage import DOWNLOAD, EVALUATE, Snapshot, Unreadable
from transformer.core.files import split_lines
from transformer.core.layout import EVAL
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.retrain_flow import RetrainFlowConfig
from transformer.core.settings import parse_yaml


@dataclass(frozen=True)
class Rules:
    """The gate's settings (params.yaml retrain: margin, alpha, max_chrf_drop,
    bootstrap_samples, bootstrap_seed, allow_margin_only, max_gap, min_speedup), defaulting to the section's own
    (RetrainFlowConfig)."""

    margin: float = RetrainFlowConfig.margin
    alpha: float = RetrainFlowConfig.alpha
    max_chrf_drop: float = RetrainFlowConfig.max_chrf_drop
    samples: int = RetrainFlowConfig.bootstrap_samples
    seed: int = RetrainFlowConfig.bootstrap_seed
    allow_margin_only: bool = RetrainFlowConfig.allow_margin_only
    max_gap: float = RetrainFlowConfig.max_gap  # a student's (flows/distilled.py)
    min_speedup: float = RetrainFlowConfig.min_speedup

    @classmethod
    def of(cls, retrain: dict[str, Any]) -> Rules:
        """From the retrain section as the project's code validates it (shell.read_section)."""
        return cls(
            float(retrain["margin"]),
            float(retrain["alpha"]),
            float(retrain["max_chrf_drop"]),
            int(retrain["bootstrap_samples"]),
            int(retrain["bootstrap_seed"]),
            bool(retrain.get("allow_margin_only", False)),  # a project's code from before it
            float(retrain.get("max_gap", RetrainFlowConfig.max_gap)),
            float(retrain.get("min_speedup", RetrainFlowConfig.min_speedup)),
        )


@contextlib.contextmanager
def sacrebleu_seed(seed: int) -> Iterator[None]:
    """SACREBLEU_SEED as sacreBLEU reads it (its CLI and PairedTest take the seed from there)."""
    before = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if before is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = before


def paired_bs(
    refs: list[str], champion: list[str], candidate: list[str], tgt_lang: str, n: int, seed: int
) -> dict[str, Any]:
    """BLEU and chrF of both, the candidate's deltas and sacreBLEU's paired-bootstrap p-values
    (the champion the baseline), with the evaluate stage's metric settings."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    if not len(refs) == len(champion) == len(candidate):
        raise ValueError(
            f"{len(refs)} references, {len(champion)} champion and {len(candidate)} candidate "
            "hypotheses"
        )
    metrics = {"bleu": BLEU(trg_lang=tgt_lang), "chrf": CHRF()}
    with sacrebleu_seed(seed):
        test = PairedTest(
            [("champion", champion), ("candidate", candidate)],
            metrics,
            [refs],
            test_type="bs",
            n_samples=n,
        )
        _, scores = test()
    (bleu, chrf) = (scores[k] for k in list(scores)[1:])  # named by sacreBLEU: BLEU, chrF2
    return {
        "sentences": len(refs),
        "bleu": round(bleu[1].score, 4),
        "champion_bleu": round(bleu[0].score, 4),
        # the resamples' mean BLEU and its 95% confidence interval (±), each system's
        "bleu_mean": round(float(bleu[1].mean), 4),
        "bleu_ci": round(float(bleu[1].ci), 4),
        "champion_bleu_mean": round(float(bleu[0].mean), 4),
        "champion_bleu_ci": round(float(bleu[0].ci), 4),
        "bleu_delta": round(bleu[1].score - bleu[0].score, 4),
        "p": bleu[1].p_value,
        "chrf": round(chrf[1].score, 4),
        "champion_chrf": round(chrf[0].score, 4),
        "chrf_delta": round(chrf[1].score - chrf[0].score, 4),
        "chrf_p": chrf[1].p_value,
        "resamples": n,
        "seed": seed,
    }


def judge(
    primary: str,
    bleu: tuple[float, float],
    tests: list[dict[str, Any]],
    untested: list[str],
    rules: Rules,
) -> tuple[bool, str]:
    """(promote?, why). On `primary` (evaluate.split) the candidate's BLEU must beat the
    champion's by more than the margin with p < alpha; on every tested set BLEU must not drop
    with p < alpha, nor chrF by more than max_chrf_drop. `bleu`: (candidate, champion) of the
    records, the margin's figures when `primary` could not be tested (said in the reason)."""
    main = next((t for t in tests if t["set"] == primary), None)
    delta = main["bleu_delta"] if main else bleu[0] - bleu[1]
    problems = []
    if main is None and not rules.allow_margin_only:
        problems.append(
            f"{primary}: no paired test, and the margin alone decides only when asked for "
            "(retrain.allow_margin_only, `python -m flows.promote --allow-margin-only`)"
        )
    elif not delta > rules.margin:
        problems.append(
            f"{primary}: BLEU {delta:+.2f}, not above the margin {rules.margin}"
            if main  # else the margin alone on the records' BLEU, said as the gate always said it
            else f"candidate BLEU {bleu[0]:.2f} does not beat champion {bleu[1]:.2f} by more "
            f"than the margin {rules.margin}"
        )
    elif main and not main["p"] < rules.alpha:
        problems.append(f"{primary}: p {main['p']:.4f} >= alpha {rules.alpha}, may be noise")
    for t in tests:
        if t["bleu_delta"] < 0 and t["p"] < rules.alpha:
            problems.append(f"{t['set']}: BLEU significantly worse (p {t['p']:.4f})")
        if -t["chrf_delta"] > rules.max_chrf_drop:
            problems.append(
                f"{t['set']}: chrF {t['chrf_delta']:+.2f}, a drop above max_chrf_drop "
                f"{rules.max_chrf_drop}"
            )
    figures = [figure(t) for t in tests]
    if tests:
        figures.append(f"paired bootstrap, {rules.samples} resamples, seed {rules.seed}")
    figures += [f"not tested: {u}" for u in untested]
    said = f"[{'; '.join([*figures, f'margin {rules.margin}, alpha {rules.alpha}'])}]"
    if problems:
        return False, f"{'; '.join(problems)} {said}; champion kept"
    if main:
        return True, f"better beyond noise {said}"
    return True, (
        f"candidate BLEU {bleu[0]:.2f} beats champion {bleu[1]:.2f} by more than {rules.margin}, "
        f"its noise untested {said}"
    )


def figure(t: dict[str, Any]) -> str:
    """One set's figures: "test: BLEU 31.20 vs 30.10 (+1.10, p 0.0030), chrF ... (+0.20)"."""
    return (
        f"{t['set']}: BLEU {t['bleu']:.2f} vs {t['champion_bleu']:.2f} ({t['bleu_delta']:+.2f}, "
        f"p {t['p']:.4f}), chrF {t['chrf']:.2f} vs {t['champion_chrf']:.2f} "
        f"({t['chrf_delta']:+.2f}, p {t['chrf_p']:.4f})"
    )


@dataclass(frozen=True)
class Scored:
    """One set an experiment was scored on: its name, the sha256 of its files, its hypotheses
    (None where its evaluate metrics name none: a record that never kept them)."""

    name: str
    sha256: str | None
    hyps: list[str] | None


def scored_sets(project: Path, commit: str, record: dict[str, Any]) -> list[Scored]:
    """The sets the experiment at `commit` was scored on, its evaluate.split first (the
    record's split and test_sha256), then `sets` of the evaluate metrics."""
    dag = read_dag(project, rev=commit)
    stage = dag.get(EVALUATE)
    if stage is None or not stage.metrics:
        return []
    snap = Snapshot(project, commit)
    evaluated = json.loads(snap.text(stage.metrics[0]) or "{}")
    (eval_dir,) = [o for o in stage.outs if o not in stage.metrics] or [None]
    package = lines.read(project)[0].path  # every line's package is at dvc.yaml's one path
    found = [(record.get("split"), record.get("test_sha256"), evaluated.get("hyps"))]
    for name, r in (evaluated.get("sets") or {}).items():
        found.append((name, r.get("set_sha256"), r.get("hyps")))
    out = []
    for name, sha, hyps in found:
        places = [f"{package}/{EVAL}/{hyps}", *([f"{eval_dir}/{hyps}"] if eval_dir else [])]
        data = next((d for p in places if hyps and (d := snap.tracked(p)) is not None), None)
        if hyps and data is None:  # named by the metrics, so written: lost, not never kept
            raise Unreadable(f"{commit[:9]}: {name}'s hypotheses {hyps} are in none of {places}")
        text = None if data is None else split_lines(data, f"{commit[:9]}:{hyps}")
        out.append(Scored(str(name), sha, text))
    return out


def references(project: Path, commit: str, split: str) -> tuple[list[str], str] | None:
    """(the reference lines of `split`, the target language) as the download stage wrote them
    at `commit`; None where they are not at hand."""
    snap = Snapshot(project, commit)
    params = parse_yaml(snap.text("params.yaml") or "{}") or {}
    tgt = (params.get("download") or {}).get("tgt_lang", DownloadConfig.tgt_lang)
    dag = read_dag(project, rev=commit)
    stage = dag.get(DOWNLOAD)
    if stage is None:
        return None
    for raw in (o for o in stage.outs if o not in stage.metrics):
        if (data := snap.tracked(f"{raw}/{split}.{tgt}")) is not None:
            return split_lines(data, f"{commit[:9]}:{raw}/{split}.{tgt}"), tgt
    return None


def compare(
    project: Path,
    candidate: dict[str, Any],
    champion: dict[str, Any],
    rules: Rules,
) -> tuple[list[dict[str, Any]], list[str]]:
    """(the paired test of every set both were scored on, candidate's evaluate.split first;
    why any set was not tested). Unreadable where hypotheses or references that the records
    say exist cannot be read: the gate refuses rather than judge on less."""
    mine = scored_sets(project, candidate["experiment_commit"], candidate)
    theirs = {s.name: s for s in scored_sets(project, champion["experiment_commit"], champion)}
    tests, untested = [], []
    for s in mine:
        other = theirs.get(s.name)
        if other is None:
            untested.append(f"{s.name}: the champion was not scored on it")
        elif other.sha256 != s.sha256:
            untested.append(f"{s.name}: another test set than the champion's (sha256 differs)")
        elif s.hyps is None or other.hyps is None:
            whose = "the candidate's" if s.hyps is None else "the champion's"
            untested.append(f"{s.name}: {whose} record never kept hypotheses")
        elif (refs := references(project, candidate["experiment_commit"], s.name)) is None:
            untested.append(f"{s.name}: the references are not at hand")
        else:
            t = paired_bs(refs[0], other.hyps, s.hyps, refs[1], rules.samples, rules.seed)
            tests.append({"set": s.name, "test_sha256": s.sha256, **t})
    return tests, untested
