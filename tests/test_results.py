"""`make results`: the experiments of a real git + DVC project, one readable line each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prefect_fixtures import git_init, sh

from flows import results

# The real pipeline's metrics layout (train: dvclive's metrics.json; evaluate: BLEU and chrF),
# with scores that follow from the steps, so that each experiment's line is known exactly.
STAGE = r"""
import json, pathlib, sys, yaml
steps = yaml.safe_load(open("params.yaml"))["train"]["max_steps"]
def dump(path, obj):
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(json.dumps(obj))
if sys.argv[1] == "train":
    dump("data/live/metrics.json", {"step": steps, "train": {"loss": 1.0, "seconds": 61.4 * steps},
                                    "trained_on": {"update": "captured",
                                                   "eager_shapes": int(steps < 20)}})
    pathlib.Path("data/model.pt").write_text(str(steps))
else:
    dump("data/metrics/evaluate.json", {"split": "test", "bleu": 1.5 * steps,
                                        "chrf": 10.0 + steps, "set_sha256": "t",
                                        "bleu_signature": "s", "chrf_signature": "c",
                                        "lineage": {"step": steps, "model_sha256": str(steps),
                                                    "averaged_checkpoints": []}})
"""

DVC_YAML = """
stages:
  train:
    cmd: python stage.py train
    deps: [stage.py]
    params: [train]
    outs: [data/model.pt]
    metrics: [data/live/metrics.json]
  evaluate:
    cmd: python stage.py evaluate
    deps: [stage.py, data/model.pt]
    metrics: [data/metrics/evaluate.json]
artifacts:
  transformer:
    path: data/model.pt
    type: model
"""


def project(path: Path, header: str) -> Path:
    path.mkdir()
    (path / "stage.py").write_text(STAGE)
    (path / "dvc.yaml").write_text(DVC_YAML)
    (path / "params.yaml").write_text(header + "train:\n  max_steps: 4\n")
    (path / ".gitignore").write_text("/data/*\n")
    git_init(path)
    dvc = (sys.executable, "-m", "dvc")
    sh(*dvc, "init", "-q", cwd=path)
    sh(*dvc, "repro", cwd=path)
    sh("git", "add", "-A", cwd=path)
    sh("git", "commit", "-qm", "four steps", cwd=path)
    sh(*dvc, "exp", "run", "-n", "longer", "-S", "train.max_steps=60", cwd=path)
    return path


@pytest.mark.slow  # dvc repro and dvc exp run in two projects
def test_every_experiment_whatever_head_with_the_champion_and_decisions(tmp_path):
    """Experiments of an older commit stay listed after a new one; the champion is marked, each
    decision (promoted or refused) given with its reason, read back from git alone."""
    from flows.decision import decide
    from flows.significance import Rules

    demo = project(
        tmp_path / "demo", "# Written by `python -m transformer.config preset demo`; edit freely.\n"
    )
    dvc = (sys.executable, "-m", "dvc")
    sh(*dvc, "exp", "run", "-n", "shorter", "-S", "train.max_steps=10", cwd=demo)
    refs = sh("git", "for-each-ref", "refs/exps", "--format=%(objectname) %(refname)", cwd=demo)
    commits = {ref.rsplit("/", 1)[1]: sha for sha, ref in map(str.split, refs.splitlines())}
    margin_only = Rules(allow_margin_only=True)  # toy.py's records keep no hypotheses
    assert decide(demo, commits["longer"], 0.0, "test", rules=margin_only)["version"] == "v1.0.0"
    assert not decide(demo, commits["shorter"], 0.0, "test", rules=margin_only)["promoted"]
    (demo / "notes.txt").write_text("a later commit\n")
    sh("git", "add", "notes.txt", cwd=demo)
    sh("git", "commit", "-qm", "a later commit", cwd=demo)
    found = results.rows(demo)
    lines = results.table(found, wide=True).splitlines()
    assert lines[0].split() == [
        "experiment",
        "version",
        "parent",
        "recipe",
        "BLEU",
        "steps",
        "time",
        "decision",
        "trained",
        "helpers",
        "student",
    ]
    assert lines[1].split()[:9] == [
        "*",
        "longer",
        "v1.0.0",
        "-",
        "demo",
        "90.00",
        "60",
        "1:01:24",
        "promoted",
    ]
    assert "promoted as v1.0.0: no champion yet" in lines[1]
    assert lines[2].split()[:8] == [
        "shorter",
        "-",
        "-",
        "demo",
        "15.00",
        "10",
        "0:10:14",
        "refused:",
    ]
    assert "does not beat champion 90.00" in lines[2] and len(lines) == 3
    # the update path each run's train stage used (its trained_on record), shapes that fell back
    assert "captured update" in lines[1]  # (the helpers column after it)
    assert "captured update, 1 shape(s) fell back to eager" in lines[2]
    # git alone tells the decisions: annotated tags on the experiments' commits, each naming
    # its candidate on its first line
    tags = sh("git", "tag", "-n1", "--list", "decision/*", cwd=demo).splitlines()
    assert [t.split()[:4] for t in tags] == [
        ["decision/transformer/0001", "transformer:", "longer", "promoted"],
        ["decision/transformer/0002", "transformer:", "shorter", "refused:"],
    ]
    # the narrow table: no recipe or parent, within 120 columns
    lines = results.table(found).splitlines()
    assert lines[0].split() == ["experiment", "version", "BLEU", "steps", "time", "decision"]
    assert lines[1].split()[:7] == ["*", "longer", "v1.0.0", "90.00", "60", "1:01:24", "promoted"]
    assert max(map(len, lines)) <= 120
    # the CLI prints the same table
    out = sh(sys.executable, "-m", "flows.results", str(demo), cwd=tmp_path)
    assert out.splitlines() == lines


def test_the_update_path_used_in_words():
    assert results.update_used({}) is None  # not recorded (a run before the record)
    assert results.update_used({"trained_on/update": "eager"}) == "eager update"
    used = {"trained_on/update": "captured", "trained_on/eager_shapes": 2}
    assert results.update_used(used) == "captured update, 2 shape(s) fell back to eager"
