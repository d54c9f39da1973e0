"""A promotion decision: the BLEU gate, and the decision as a transaction against the team's
git remote `origin` (flows/tags.py) with the package on the DVC remote (flows/registry.py).

gate() says whether a candidate beats its line's champion. decide() makes the decision: with
`origin`, origin's tags first, the winner's package published and checked before any tag, every
new tag pushed at once (decided again where another machine took a name; failing closed where
origin cannot be reached); without it (or `local_only`), in this clone's tags. A winner whose
package could not be published is `unpublished` until a later decision (or `python -m
flows.registry publish`, complete()) decides it again. Torch-free and Prefect-free but for the
run logger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flows import distilled, lines, registry, significance, tags
from flows.lineage import Unreadable
from flows.locks import registry_lock
from flows.shell import logger

COMPARABLE = ("split", "test_sha256", "bleu_signature")
Tester = Callable[[], tuple[list[dict[str, Any]], list[str]]]


def gate(
    candidate: dict[str, Any],
    champion: dict[str, Any] | None,
    margin: float,
    tester: Tester | None = None,
    rules: significance.Rules | None = None,
) -> tuple[bool, str]:
    """(promote?, why): only a comparable candidate with BLEU above champion + margin wins;
    with `tester` (the paired tests of each set, and why any set was not tested), only one
    better beyond noise on its split and not significantly worse on any (significance.judge)."""
    if candidate.get("bleu") is None:
        return False, "the candidate has no BLEU score; not promoted"
    if champion is None or champion.get("bleu") is None:
        return True, "no champion yet" if champion is None else "the champion has no BLEU score"
    for key in COMPARABLE:
        if candidate.get(key) is None or candidate.get(key) != champion.get(key):
            return False, (
                f"not comparable: {key} differs (champion {champion.get(key)!r}, "
                f"candidate {candidate.get(key)!r}); champion kept"
            )
    new, old = float(candidate["bleu"]), float(champion["bleu"])
    if tester is not None:
        rules = replace(rules or significance.Rules(), margin=margin)
        try:
            found = tester()
        except Unreadable as e:  # fails closed: never judged on less than the records promise
            return False, f"the gate cannot read what it must compare: {e}; champion kept"
        return significance.judge(candidate["split"], (new, old), *found, rules)
    if new - old > margin:
        return True, f"candidate BLEU {new:.2f} beats champion {old:.2f} by more than {margin}"
    return False, (
        f"candidate BLEU {new:.2f} does not beat champion {old:.2f} by more than "
        f"the margin {margin}; champion kept"
    )


TRIES = 5  # decisions against origin in a row before giving up (another machine kept winning)


def decide(
    project: Path,
    commit: str,
    margin: float,
    by: str,
    trained: str | None = None,
    rules: significance.Rules | None = None,
    line: str | None = None,
    local_only: bool = False,
) -> dict[str, Any]:
    """Gate the experiment at `commit` against line `line`'s champion (the only line's when
    None); promote it if it wins. `trained`: how the candidate was trained (a retrain's
    continuation, or why it fell back to scratch), kept in the decision's tag. `rules`: the
    noise test's (retrain.alpha ...; its margin is `margin`).

    With a git remote `origin` (and not `local_only`) the decision is a transaction against it
    (transaction()): origin's tags first, the package on the DVC remote before any production
    tag, every tag pushed at once. A candidate whose package could not be published before
    (an `unpublished` decision of the line) is decided again first."""
    line, path = registry.artifact(project, line)
    shared = not local_only and tags.has_remote(project)
    once = transaction if shared else _decide
    with registry_lock(project):  # lines decide one at a time here: one git repository
        if shared:
            sync(project, line)
        for waiting in registry.unpublished(project, line):
            # only where this clone holds the package (another machine's completes its own)
            if waiting != commit and registry.cached(project, path, waiting):
                once(project, waiting, margin, f"{by} (completing)", None, rules, line, [])
        return once(project, commit, margin, by, trained, rules, line, [])


def sync(project: Path, line: str) -> list[str]:
    """tags.sync(), its failure a RegistryError: nothing is decided on a stale view."""
    try:
        return tags.sync(project, line)
    except tags.TagPushError as e:
        raise registry.RegistryError(f"line {line}: no decision made: {e}") from None


def transaction(project, commit, margin, by, trained, rules, line, made) -> dict[str, Any]:
    """_decide() against origin: sync its tags of the line, decide, push every new tag with
    `git push --atomic`; decided again (from origin's new view) where another machine took a
    name meanwhile, TRIES times. Fails closed, with nothing pushed and no local tag left, when
    origin cannot be reached or holds a tag this clone holds otherwise."""
    for attempt in range(1, TRIES + 1):
        made = []
        try:
            pending = tags.sync(project, line)  # numbered from origin's view
            out = _decide(project, commit, margin, by, trained, rules, line, made, shared=True)
            tags.push_atomic(project, pending + made)
            return out
        except tags.Rejected as e:
            tags.delete_local(project, made)
            logger().warning("line %s: %s; deciding again (%d/%d)", line, e, attempt, TRIES)
        except tags.TagPushError as e:  # unreachable, or a conflict: never decided on less
            tags.delete_local(project, made)
            raise registry.RegistryError(f"line {line}: no decision made: {e}") from None
        except BaseException:
            tags.delete_local(project, made)
            raise
    raise registry.RegistryError(
        f"line {line}: {tags.REMOTE} took the decision's tag names {TRIES} times in a row "
        "(other machines deciding the same line); run it again"
    )


def _decide(project, commit, margin, by, trained, rules, line, made, shared=False) -> dict:
    """One decision in this clone's tags; the tags it made are appended to `made`. `shared`:
    a decision for origin, so a package that cannot reach a DVC remote is not promoted."""
    registry.publish_pending(project)
    candidate = registry.record_at(project, commit)
    lost = None
    try:
        before = registry.champion(project, line)
    except Unreadable as e:  # its metrics lost: never "no champion yet"
        before, lost = None, f"the champion's record cannot be read: {e}; champion kept"
    rules = replace(rules or significance.Rules(), margin=margin)
    tested: dict[str, Any] = {"rules": asdict(rules), "tests": [], "untested": []}

    def tester() -> tuple[list[dict[str, Any]], list[str]]:
        found = significance.compare(project, candidate, before, rules)
        tested["tests"], tested["untested"] = found
        return found

    if lost:
        promote, reason = False, lost
    elif before and before.get("experiment_commit") == commit:
        promote, reason = False, "the candidate is the champion already"
    else:
        promote, reason = gate(candidate, before, margin, tester, rules)
        if teacher := distilled.teacher_of(project, line):  # a student: its teacher's rules too
            ok, why, tested["student"] = distilled.gate(project, candidate, rules, teacher)
            promote, reason = promote and ok, f"{why}; against the line's champion: {reason}"
    out: dict[str, Any] = {
        "line": line,
        "promoted": promote,
        "reason": reason,
        "candidate": candidate,
        "champion_before": before,
        "version": None,
        "gate": tested,  # every figure of the noise test: BLEU, chrF, deltas, p, resamples, seed
    }
    if promote:
        out.update(publish(project, commit, line, reason, by, tested, candidate, made, shared))
    verdict = f"promoted as {out['version']}" if out["promoted"] else "refused"
    if out.get("unpublished"):
        verdict = "not published"
    out["decision_tag"] = registry.record_decision(
        project, commit, f"{verdict}: {out['reason']}", decision_details(out, by, trained), line
    )
    made.append(out["decision_tag"])
    logger().info("%s: %s", commit[:9], out["reason"])
    return out


def publish(project, commit, line, reason, by, tested, candidate, made, shared) -> dict:
    """The winner's package to the DVC remote, checked there, then its version and production
    tags (appended to `made`); where the package cannot be published, no tag: the decision
    says why and stays `unpublished` until a later decision completes it."""
    _, path = registry.artifact(project, line)
    try:
        if registry.push(project, path, commit) is None and shared:
            raise registry.RegistryError(registry.NO_REMOTE)
    except registry.RegistryError as e:
        return {
            "promoted": False,
            "unpublished": str(e),
            "reason": (
                f"won the gate ({reason}), but its package is not on the DVC remote: {e}. No "
                f"production tag was made; the next decision of {line} or `python -m "
                "flows.registry publish` completes it"
            ),
        }
    keys = ("bleu", "chrf", "bleu_signature", "split", "test_sha256", "preset", "overrides")
    summary = {k: candidate.get(k) for k in keys}
    summary.update(promoted_at=datetime.now(UTC).isoformat(), promoted_by=by, gate=tested)
    version, new = registry.register(project, commit, summary, reason, line)
    made.extend(new)
    return {"version": version}


def decision_details(out: dict[str, Any], by: str, trained: str | None = None) -> dict[str, Any]:
    """What a decision tag records besides its verdict: who, when, the two experiments, and how
    the candidate was trained where a retrain says."""

    def brief(r: dict[str, Any] | None) -> dict[str, Any] | None:
        keys = ("experiment", "experiment_commit", "version", "bleu", "preset", "overrides")
        return {k: r.get(k) for k in keys if k in r} if r else None

    return {
        "by": by,
        "at": datetime.now(UTC).isoformat(),
        "candidate": brief(out["candidate"]),
        "champion_before": brief(out["champion_before"]),
        **({"gate": out["gate"]} if out.get("gate") else {}),
        **({"trained": trained} if trained else {}),
        **({"unpublished": out["unpublished"]} if out.get("unpublished") else {}),
    }


def complete(project: Path) -> list[dict[str, Any]]:
    """Decide again every candidate whose package could not be published when it won
    (unpublished()) and that this clone holds: the decisions."""
    from flows import recipe

    out = []
    for x in lines.read(Path(project)):
        for commit in registry.unpublished(project, x.name):
            if registry.cached(project, x.path, commit):
                rules = recipe.resolve(Path(project), x.name).rules
                out.append(
                    decide(
                        Path(project),
                        commit,
                        rules.margin,
                        "flows.registry publish",
                        rules=rules,
                        line=x.name,
                    )
                )
    return out
