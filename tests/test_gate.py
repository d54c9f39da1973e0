"""The promotion gate's noise test: its p-value is sacreBLEU's CLI's on the same files; its
decisions (margin met but p too high, a chrF drop, one of several sets significantly worse);
and through the real retrain flow on a real Prefect server with real DVC, a candidate equal to
the champion up to noise (another seed) refused with its p; the better one promoted is
test_flows_continue's continuation.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.continuing import PRESET, Champion
from prefect_fixtures import BIN, artifact

from flows import registry, results
from flows.decision import gate
from flows.promote import report
from flows.significance import Rules, paired_bs
from flows.workspace import WORKSPACE
from transformer.core.sections.retrain_flow import RetrainFlowConfig
from transformer.core.settings import ConfigError, build

SIG = {"test_sha256": "t", "bleu_signature": "s", "split": "test"}


def drop_words(refs: list[str], share: float, seed: int) -> list[str]:
    """A system that leaves out about `share` of the reference's words."""
    rng = random.Random(seed)
    return [" ".join(w for w in r.split() if rng.random() > share) for r in refs]


def test_the_p_value_is_sacrebleus_cli_on_the_same_files(tmp_path: Path, shared_data: Path):
    """`SACREBLEU_SEED=7 sacrebleu REF -i CHAMPION CANDIDATE --paired-bs --paired-bs-n 300`: the
    same p for BLEU and chrF (printed to 4 decimals; p is k/(n+1), so k is the same)."""
    refs = (shared_data / "multi30k/test_2016_flickr.de").read_text().splitlines()[:200]
    champion, candidate = drop_words(refs, 0.30, 1), drop_words(refs, 0.29, 2)
    for name, lines in (("ref.de", refs), ("champion.txt", champion), ("cand.txt", candidate)):
        (tmp_path / name).write_text("".join(line + "\n" for line in lines))
    ours = paired_bs(refs, champion, candidate, "de", 300, 7)
    cli = [str(BIN / "sacrebleu"), "ref.de", "-i", "champion.txt", "cand.txt", "--paired-bs"]
    cli += ["--paired-bs-n", "300", "-m", "bleu", "chrf", "-l", "en-de", "-f", "text"]
    env = {"SACREBLEU_SEED": "7", "PATH": str(BIN)}
    out = subprocess.run(cli, cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    (bleu_p, chrf_p) = map(float, re.findall(r"\(p = ([0-9.]+)\)", out.stdout))
    assert "bs:300|seed:7" in out.stdout  # the CLI ran the test we asked for
    for theirs, mine in ((bleu_p, ours["p"]), (chrf_p, ours["chrf_p"])):
        assert round(theirs * 301) == round(mine * 301) and abs(theirs - mine) < 5e-5
    assert 0.05 < ours["p"] < 1  # a p that says something: not the floor 1/301, not 1
    assert round(ours["bleu"], 1) == (float(re.findall(r"cand.txt │\s+([0-9.]+)", out.stdout)[0]))
    assert (ours["resamples"], ours["seed"], ours["sentences"]) == (300, 7, 200)
    # the bootstrap's mean and 95% confidence interval, as the CLI prints them
    for name, who in (("cand.txt", ""), ("champion.txt", "champion_")):
        mean, ci = re.findall(rf"{name} │\s+[0-9.]+ \(([0-9.]+) ± ([0-9.]+)\)", out.stdout)[0]
        assert (round(ours[who + "bleu_mean"], 1), round(ours[who + "bleu_ci"], 1)) == (
            float(mean),
            float(ci),
        )
    # and the decision shows them in the gate's row, with no `None` for what it lacks
    shown = report(
        {"promoted": False, "reason": "r", "champion_before": None, "candidate": None,
         "gate": {"rules": {}, "tests": [{**ours, "set": "test"}]}},
        "Promote x",
    )  # fmt: skip
    assert f"| {ours['bleu']:.2f} ({ours['bleu_mean']:.2f} ± {ours['bleu_ci']:.2f}) |" in shown
    assert "None" not in shown and "| champion before | no champion yet |" in shown


def test_the_gate_imports_no_torch():
    """flows/ never imports torch: the gate tests text (sacreBLEU), not models."""
    code = (
        "import sys, flows.significance, flows.promote, flows.retrain; print(sorted(sys.modules))"
    )
    mods = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "'flows.significance'" in mods.stdout and "'torch'" not in mods.stdout


def set_test(
    name: str, bleu: float, old: float, p: float, chrf: float = 0.0, chrf_old: float = 0.0
):
    """A set's paired test as significance.paired_bs reports it."""
    return {
        "set": name,
        "sentences": 500,
        "bleu": bleu,
        "champion_bleu": old,
        "bleu_delta": round(bleu - old, 4),
        "p": p,
        "chrf": chrf,
        "champion_chrf": chrf_old,
        "chrf_delta": round(chrf - chrf_old, 4),
        "chrf_p": 0.5,
        "resamples": 1000,
        "seed": 12345,
        "allow_margin_only": False,
    }


def decide(tests: list[dict], rules: Rules | None = None, untested=()) -> tuple[bool, str]:
    rules = rules or Rules()
    cand, champ = {"bleu": tests[0]["bleu"], **SIG}, {"bleu": tests[0]["champion_bleu"], **SIG}
    return gate(cand, champ, rules.margin, lambda: (tests, list(untested)), rules)


def test_margin_met_but_p_too_high_is_refused_with_its_p():
    keep, why = decide([set_test("test", 31.0, 30.0, 0.2130, 60, 60)], Rules(margin=0.5))
    assert not keep
    assert "test: p 0.2130 >= alpha 0.05, may be noise" in why and why.endswith("champion kept")
    assert "BLEU 31.00 vs 30.00 (+1.00, p 0.2130)" in why
    assert "paired bootstrap, 1000 resamples, seed 12345" in why
    keep, why = decide([set_test("test", 31.0, 30.0, 0.0130, 60, 60)], Rules(margin=0.5))
    assert keep and why.startswith(
        "better beyond noise [test: BLEU 31.00 vs 30.00 (+1.00, p 0.0130)"
    )
    keep, why = decide([set_test("test", 30.3, 30.0, 0.0010, 60, 60)], Rules(margin=0.5))
    assert not keep and "test: BLEU +0.30, not above the margin 0.5" in why  # significant, small


def test_a_chrf_drop_beyond_the_limit_is_refused():
    better = set_test("test", 32.0, 30.0, 0.001, 58.4, 60.0)
    keep, why = decide([better], Rules(max_chrf_drop=1.0))
    assert not keep and "test: chrF -1.60, a drop above max_chrf_drop 1.0" in why
    assert decide([better], Rules(max_chrf_drop=2.0))[0]


def test_several_sets_one_significantly_worse_is_refused():
    main = set_test("test", 32.0, 30.0, 0.001, 60, 60)
    level = set_test("valid", 29.5, 30.0, 0.40, 60, 60)  # lower, but within noise
    worse = set_test("valid", 28.0, 30.0, 0.02, 60, 60)
    keep, why = decide([main, level])
    assert keep, why
    keep, why = decide([main, worse])
    assert not keep and "valid: BLEU significantly worse (p 0.0200)" in why
    assert "valid: BLEU 28.00 vs 30.00 (-2.00, p 0.0200)" in why
    # a set the champion was not scored on, or on other files, is said, not silently passed
    keep, why = decide([main], untested=["valid: the champion was not scored on it"])
    assert keep and "not tested: valid: the champion was not scored on it" in why


def test_without_the_champions_hypotheses_the_margin_decides_only_when_asked_for():
    cand, champ = {"bleu": 31.0, **SIG}, {"bleu": 30.0, **SIG}
    why_not = ["test: the champion's record never kept hypotheses"]
    keep, why = gate(cand, champ, 0.5, lambda: ([], why_not), Rules())  # the default: refused
    assert not keep and "test: no paired test, and the margin alone decides only when" in why
    assert "retrain.allow_margin_only" in why and why.endswith("champion kept")
    asked = Rules(allow_margin_only=True)
    keep, why = gate(cand, champ, 0.5, lambda: ([], why_not), asked)
    assert keep and why.startswith("candidate BLEU 31.00 beats champion 30.00 by more than 0.5")
    assert "its noise untested" in why
    keep, why = gate(cand, {**champ, "bleu": 30.8}, 0.5, lambda: ([], why_not), asked)
    assert not keep and why.startswith("candidate BLEU 31.00 does not beat champion 30.80 by")
    assert "not tested: test: the champion's record never kept hypotheses" in why


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("alpha", 0.0, r"retrain\.alpha must be in \(0, 1\], got 0\.0"),
        ("alpha", float("nan"), r"retrain\.alpha must be in \(0, 1\], got nan"),
        ("max_chrf_drop", -1.0, r"retrain\.max_chrf_drop must be a number >= 0"),
        ("bootstrap_seed", 0, r"retrain\.bootstrap_seed must be >= 1, got 0"),
        ("bootstrap_samples", 0, r"retrain\.bootstrap_samples must be >= 1, got 0"),
    ],
)
def test_bad_gate_settings_are_named(key, value, error):
    with pytest.raises(ConfigError, match=error):
        build(RetrainFlowConfig, {key: value}, "retrain", "params.yaml")


def test_the_gates_defaults_are_the_retrain_sections():
    """Rules() (the gate without settings: flows/promote.py) is the params.yaml defaults."""
    assert Rules() == Rules.of(dataclasses.asdict(RetrainFlowConfig()))


@pytest.mark.slow
def test_noise_is_refused_with_its_p(prefect_server: dict, continuing_champion: Champion) -> None:
    """The shared champion's very recipe (helpers/continuing.py: trained from scratch, as the
    first retrain of a recipe is) with another seed: equal up to noise, refused with its p.
    The better candidate promoted beyond noise is test_flows_continue's continuation (v2.0.0).
    At this scale two seeds can differ by more than test-set noise: the test asserts that the
    gate is not fooled (refused, its p in the reason), not which rule refused it; the pure tests
    above cover each rule."""
    from flows.retrain import retrain

    project, first = continuing_champion.project, continuing_champion.first
    assert first["version"] == "v1.0.0" and first["candidate"]["bleu"] > 0, first
    kept = sorted(p.name for p in (project / WORKSPACE / "data/package/eval").iterdir())
    assert kept == ["hyps.test.txt", "hyps.valid.txt"]  # the package keeps both sets' hypotheses

    recipe = [*first["candidate"]["overrides"], "train.seed=2"]  # another seed, nothing else
    state = retrain(preset=PRESET, overrides=recipe, project=str(project), return_state=True)
    noise, noise_run = state.result(), str(state.state_details.flow_run_id)
    assert not noise["promoted"], noise["reason"]
    (test, valid) = noise["gate"]["tests"]
    assert (test["set"], valid["set"], test["sentences"]) == ("test", "valid", 20)
    assert not (test["bleu_delta"] > 0 and test["p"] < 0.05), test  # not better beyond noise
    assert f"p {test['p']:.4f}" in noise["reason"], noise["reason"]
    assert test["bleu"] == noise["candidate"]["bleu"]  # the gate's BLEU is the evaluate stage's
    assert test["champion_bleu"] == first["candidate"]["bleu"]
    decision = artifact(noise_run, "retrain-decision")
    both = (f"{test[w + 'bleu']:.2f} ({test[w + 'bleu_mean']:.2f} ± {test[w + 'bleu_ci']:.2f})"
            for w in ("", "champion_"))  # fmt: skip
    assert f"| test | 20 | {' | '.join(both)} |" in decision and "None" not in decision

    # every figure in the decision's tag and in `make results`
    tags = registry.decision_tags(project)
    assert [t["verdict"].split(":")[0] for t in tags] == ["promoted as v1.0.0", "refused"]
    recorded = tags[1]["gate"]
    assert recorded["tests"][0]["p"] == test["p"]
    assert recorded["rules"] == {
        "margin": 0.0,
        "alpha": 0.05,
        "max_chrf_drop": 1.0,
        "samples": 1000,
        "seed": 12345,
        "allow_margin_only": False,
        "max_gap": 1.0,  # a student's rules (flows/distilled.py), unused without a teacher
        "min_speedup": 3.0,
    }
    table = results.table(results.rows(project), wide=True)
    assert f"p {test['p']:.4f}" in table
    assert "1000 resamples, seed 12345" in table
    print(json.dumps(noise["gate"]["tests"], indent=1), file=sys.stderr)


STAGES = """
stages:
  download:
    cmd: mkdir -p data/raw && cp refs.txt data/raw/test.de
    deps: [refs.txt]
    outs: [data/raw]
  evaluate:
    cmd: mkdir -p data/eval && cp system.txt data/eval/hyps.test.txt && cp scored.json
      data/metrics/evaluate.json
    deps: [system.txt, scored.json]
    outs: [data/eval]
    metrics: [{data/metrics/evaluate.json: {cache: false}}]
artifacts:
  transformer: {path: data/package, type: model}
"""


def scored_commit(project: Path, system: list[str]) -> str:
    """The evaluate stage run on `system`'s lines, pushed to the remote, committed."""
    (project / "system.txt").write_text("".join(f"{line}\n" for line in system))
    (project / "scored.json").write_text(json.dumps({"split": "test", "hyps": "hyps.test.txt"}))
    (project / "data/metrics").mkdir(parents=True, exist_ok=True)
    for cmd in (("repro", "-q"), ("push", "-q")):
        subprocess.run([sys.executable, "-m", "dvc", *cmd], cwd=project, check=True)
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    subprocess.run(["git", "commit", "-qm", "scored"], cwd=project, check=True)
    return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=project, text=True).strip()


def test_kept_hypotheses_that_cannot_be_read_are_refused_with_the_reason(tmp_path: Path):
    """A real DVC remote, then gone, the cache emptied: the champion's hypotheses, which its
    evaluate metrics say were kept, cannot be read. The gate refuses, naming the file, instead
    of judging on the margin; with them at hand it runs the paired test."""
    from prefect_fixtures import DVC, git_init, sh

    from flows import significance
    from flows.lineage import Snapshot, Unreadable

    project = tmp_path / "project"
    project.mkdir()
    git_init(project)
    sh(*DVC, "init", "-q", cwd=project)
    sh(*DVC, "remote", "add", "-d", "store", str(tmp_path / "remote"), cwd=project)
    sh(*DVC, "config", "core.site_cache_dir", str(tmp_path / "site"), cwd=project)
    (project / "dvc.yaml").write_text(STAGES)
    (project / ".gitignore").write_text("/data/raw\n/data/eval\n")
    refs = [f"ein kleiner satz nummer {i}" for i in range(30)]
    (project / "refs.txt").write_text("".join(f"{r}\n" for r in refs))
    champion_commit = scored_commit(project, drop_words(refs, 0.3, 1))
    candidate_commit = scored_commit(project, drop_words(refs, 0.1, 2))
    record = {**SIG, "split": "test", "test_sha256": "t"}
    champion = {**record, "bleu": 40.0, "experiment_commit": champion_commit}
    candidate = {**record, "bleu": 60.0, "experiment_commit": candidate_commit}
    rules = Rules(samples=100)

    def tester():
        return significance.compare(project, candidate, champion, rules)

    (test,), untested = tester()  # at hand: tested
    assert test["set"] == "test" and test["bleu_delta"] > 0 and not untested

    subprocess.run(["rm", "-rf", str(project / ".dvc/cache"), str(tmp_path / "remote")], check=True)
    snap = Snapshot(project, champion_commit)
    assert snap.tracked("data/eval/no-such-file") is None  # absent is still absent
    with pytest.raises(Unreadable, match=r"data/eval/hyps\.test\.txt at [0-9a-f]{9} cannot be"):
        snap.tracked("data/eval/hyps.test.txt")
    keep, why = gate(candidate, champion, 0.0, tester, Rules(allow_margin_only=True))
    assert not keep and why.startswith("the gate cannot read what it must compare: ")
    assert "hyps.test.txt" in why and why.endswith("champion kept")
