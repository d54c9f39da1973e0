"""@flow promote: put a finished experiment through the BLEU promotion gate.

    python -m flows.promote EXPERIMENT               # a `dvc exp show` name, a commit, a tag
                                                     # exit status 0 promoted, 3 refused
    python -m flows.promote EXPERIMENT --line NAME   # one run by hand (dvc exp run): its line
    python -m flows.run promote/promote -p experiment=EXPERIMENT --wait

Any experiment qualifies, one a flow ran or one run by hand (`dvc exp run`): its record is read
from its commit (params, dvc.lock, metrics). The gate is the one scheduled retraining uses: the
candidate must be scored on the same split of the same test set (sha256) with the same
sacreBLEU signature, and beat the champion's BLEU by more than `retrain.margin` with sacreBLEU's
paired bootstrap p below `retrain.alpha`, against the champion's own hypotheses; on each further
set (`evaluate.extra_splits`) no significant BLEU drop, and chrF down by at most
`retrain.max_chrf_drop` anywhere (flows/significance.py). A candidate without a BLEU score is
never promoted. The candidate meets only its own line's champion (flows/lines.py): --line, or
the line its run recorded (a flow run records the line whose recipe it ran); the gate's settings
are the line's as the project's HEAD declares them (flows/recipe.py). A promotion is a new
version of the line's artifact in the production stage (flows/registry.py); the decision itself,
against the team's git remote, is flows/decision.py's.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows import lines, recipe, registry
from flows.artifacts import written
from flows.decision import decide
from flows.pipeline import start_attempt
from flows.workspace import WorkspaceError, git
from transformer.core.settings import ConfigError

REFUSED = 3  # the command's exit status when the gate keeps the champion (1: an error)


def resolve_experiment(project: Path, experiment: str) -> str:
    """The commit of `experiment`: an experiment's name (refs/exps), or any git revision."""
    refs = git("for-each-ref", "refs/exps", "--format=%(objectname) %(refname)", cwd=project)
    found = [
        sha
        for sha, ref in (line.split() for line in refs.splitlines())
        if ref.rsplit("/", 1)[1] == experiment
    ]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise WorkspaceError(f"{len(found)} experiments are named {experiment!r}: give its commit")
    try:
        return git(
            "rev-parse", "--verify", "--end-of-options", f"{experiment}^{{commit}}", cwd=project
        )
    except WorkspaceError:
        raise WorkspaceError(
            f"{project}: no experiment or revision {experiment!r} "
            "(`dvc exp show` lists the experiments)"
        ) from None


def summary(out: dict[str, Any]) -> str:
    """The decision in one line: the candidate, its BLEU, the verdict and why."""
    cand = out.get("candidate") or {}
    name = cand.get("experiment") or str(cand.get("experiment_commit"))[:9]
    bleu = "-" if cand.get("bleu") is None else f"{float(cand['bleu']):.2f}"
    verdict = f"promoted as {out['version']}" if out["promoted"] else "refused"
    return f"experiment {name}: BLEU {bleu}; {verdict}: {out['reason']}"


def report(out: dict[str, Any], title: str) -> str:
    """The decision as markdown: the champion before, the candidate, why."""
    rows = [
        ("champion before", out.get("champion_before") or {}),
        ("candidate", out.get("candidate") or {}),
    ]
    verdict = f"promoted as {out['version']}" if out["promoted"] else "champion kept"
    tested = out.get("gate") or {}
    return "\n".join([*head(out, title, verdict, rows), *student(tested), *gate_table(tested)])


def student(tested: dict[str, Any]) -> list[str]:
    """A student's figures against its teacher (flows/distilled.py), where the line has one."""
    s = tested.get("student")
    if not s:
        return []
    return [
        "",
        (
            f"Against its teacher {s['teacher']} ({s['split']}, paired bootstrap, "
            f"{s['resamples']} resamples; the race stage's speeds, one thread, each as served):"
        ),
        "",
        "| | BLEU | sentences/s | rule | failed |",
        "|---|---|---|---|---|",
        f"| student | {s['bleu']:.2f} | {s['sentences_per_second']} | | |",
        f"| teacher | {s['teacher_bleu']:.2f} | {s['teacher_sentences_per_second']} | | |",
        (
            f"| gap | {s['gap']:.2f} (p {s['p']:.4f}) | | max_gap {s['max_gap']} | "
            f"{'yes' if 'gap' in s['failed'] else 'no'} |"
        ),
        (
            f"| speed-up | | {s['speedup']:.2f}x | min_speedup {s['min_speedup']} | "
            f"{'yes' if 'speed' in s['failed'] else 'no'} |"
        ),
    ]


GATE_HEADER = (
    "| set | sentences | candidate BLEU | champion BLEU | delta | p | chrF | champion chrF "
    "| delta | p |"
)


def gate_table(tested: dict[str, Any]) -> list[str]:
    """The noise test's figures as markdown rows, one per set (none when it did not run): each
    system's BLEU with the bootstrap's mean and 95% confidence interval."""
    rules, lines = tested.get("rules") or {}, []
    if tested.get("tests"):
        lines += [
            "",
            (
                f"Paired bootstrap (sacreBLEU), {cell(rules.get('samples'))} resamples, seed "
                f"{cell(rules.get('seed'))}; margin {cell(rules.get('margin'))}, alpha "
                f"{cell(rules.get('alpha'))}, max chrF drop {cell(rules.get('max_chrf_drop'))}. "
                "BLEU (bootstrap mean ± 95% CI):"
            ),
            "",
            GATE_HEADER,
            "|---|---|---|---|---|---|---|---|---|---|",
            *(
                f"| {t['set']} | {t['sentences']} | {with_ci(t, '')} | {with_ci(t, 'champion_')} "
                f"| {t['bleu_delta']:+.2f} | {t['p']:.4f} | {t['chrf']:.2f} | "
                f"{t['champion_chrf']:.2f} | {t['chrf_delta']:+.2f} | {t['chrf_p']:.4f} |"
                for t in tested["tests"]
            ),
        ]
    return lines + [f"- not tested: {u}" for u in tested.get("untested") or []]


def with_ci(t: dict[str, Any], who: str) -> str:
    """ "31.20 (31.18 ± 0.95)": BLEU, then the bootstrap's mean and CI where recorded (decisions
    before they were have the score alone)."""
    score = f"{t[who + 'bleu']:.2f}"
    if t.get(who + "bleu_ci") is None:
        return score
    return f"{score} ({t[who + 'bleu_mean']:.2f} ± {t[who + 'bleu_ci']:.2f})"


NONE = "—"  # a value a record does not have (a table shows no `None`)
EMPTY = {"champion before": "no champion yet", "candidate": "none trained"}  # a missing row


def cell(value: Any, width: int | None = None) -> str:
    """A table cell: NONE for a missing value, else the value (its first `width` characters)."""
    if value is None or value == "":
        return NONE
    return str(value)[:width] if width else str(value)


def head(out: dict[str, Any], title: str, verdict: str, rows: list) -> list[str]:
    """The decision's title, reason and the two experiments' table (a missing champion said)."""
    return [
        f"# {title}: {verdict}",
        "",
        out["reason"],
        "",
        "| | experiment | version | commit | BLEU | data | code | params |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {label} | {cell(r.get('experiment'))} | {cell(r.get('version'))} | "
            f"{cell(r.get('experiment_commit'), 9)} | {cell(r.get('bleu'))} | "
            f"{cell(r.get('data_hash'))} | {cell(r.get('code_hash'))} | "
            f"{cell(r.get('params_sha256'), 12)} |"
            if r
            else f"| {label} | {EMPTY.get(label, NONE)} |" + f" {NONE} |" * 6
            for label, r in rows
        ),
    ]


def line_of(root: Path, commit: str, line: str | None) -> str:
    """The line to gate the experiment at `commit` in: `line`, else the line its run recorded,
    else the project's only line, else the line its recorded recipe belongs to (a flow run from
    before runs recorded their line). None fits: a RegistryError listing the lines and --line."""
    if line is not None:
        return line
    record = registry.record_at(root, commit)
    if record.get("line"):
        return record["line"]
    declared = lines.read(root, "HEAD")
    if len(declared) == 1:
        return declared[0].name
    why = "it was run by hand (`dvc exp run`: its commit records no recipe)"
    if "preset" in record:  # a flow run's
        ran = (record["preset"], record.get("overrides") or [])
        try:
            fits = recipe.belongs(root, record["code_revision"], *ran)
        except lines.LineError:  # its revision declares no (readable) lines
            fits = []
        if len(fits) == 1:
            return fits[0].name
        said = f"preset {ran[0]}, overrides {' '.join(ran[1]) or 'none'}"
        why = f"its recipe ({said}) is " + (
            f"each of {', '.join(x.name for x in fits)}'s alike" if fits else "no line's"
        )
    raise registry.RegistryError(
        f"experiment {record.get('experiment') or commit[:9]} belongs to no line: {why}. "
        f"{root / 'dvc.yaml'} declares {recipe.describe(declared)}: name one with --line NAME "
        "(the promote/promote deployment: -p line=NAME)"
    )


@flow(name="promote", log_prints=True)
def promote(
    experiment: str,
    project: str = ".",
    margin: float | None = None,
    line: str | None = None,
    allow_margin_only: bool = False,
    local_only: bool = False,
) -> dict[str, Any]:
    """Gate experiment `experiment` (name or revision) against its line's champion (`line`, or
    the line its run recorded: line_of); promote it if it beats the champion. The gate's
    settings are the line's as the project's HEAD declares them (flows/recipe.py), `margin`
    (when given) and `allow_margin_only` (as retrain.allow_margin_only) over them.
    `local_only`: decide in this clone's tags without asking the git remote origin (a later
    `python -m flows.registry publish` pushes)."""
    start_attempt()  # a crashed decision is rescheduled, a bounded number of times
    root = Path(project).resolve()
    commit = resolve_experiment(root, experiment)
    found = recipe.resolve(root, line_of(root, commit, line))
    rules = found.rules
    if allow_margin_only:
        rules = replace(rules, allow_margin_only=True)
    margin = rules.margin if margin is None else margin
    run = f"promote flow run {flow_run.get_id()}"
    out = decide(
        root, commit, margin, run, rules=rules, line=found.line.name, local_only=local_only
    )
    written(  # its description is what `python -m flows.run --wait` prints
        create_markdown_artifact,
        report(out, f"Promote {experiment}"),
        key="promotion-decision",
        description=summary(out),
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m flows.promote",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("experiment", help="experiment name (dvc exp show), commit or tag")
    parser.add_argument("--project", default=".", help="the project's checkout (default: .)")
    parser.add_argument(
        "--margin", type=float, help="BLEU the champion must be beaten by (default: retrain.margin)"
    )
    parser.add_argument(
        "--allow-margin-only",
        action="store_true",
        help="where a record never kept hypotheses, let the margin alone decide "
        "(retrain.allow_margin_only; hypotheses kept but unreadable are refused regardless)",
    )
    parser.add_argument("--line", help="the line to gate it in (default: the one its run recorded)")
    parser.add_argument(
        "--local-only",
        action="store_true",
        help="decide in this clone's tags, without the git remote origin (default: a decision "
        "is made against origin's tags and pushed there, all tags at once)",
    )
    args = parser.parse_args(argv)
    try:
        # checked before the flow starts: a bad line or gate is one line, not a failed run
        root = Path(args.project).resolve()
        line = line_of(root, resolve_experiment(root, args.experiment), args.line)
        recipe.resolve(root, line)
        out = promote(
            args.experiment,
            args.project,
            args.margin,
            line,
            args.allow_margin_only,
            args.local_only,
        )
    except (WorkspaceError, registry.RegistryError, ConfigError, lines.LineError) as e:
        sys.exit(f"error: {e}")
    print(
        ("promoted as " + out["version"] if out["promoted"] else "not promoted")
        + ": "
        + out["reason"]
    )
    sys.exit(0 if out["promoted"] else REFUSED)


if __name__ == "__main__":
    main()
