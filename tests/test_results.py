"""`make results`: experiments of a real git + DVC project, one readable line each."""

from __future__ import annotations

import sys
from pathlib import Path

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
    dump("data/live/metrics.json", {"step": steps, "train": {"loss": 1.0, "seconds": 61.4 * steps}})
    pathlib.Path("data/model.pt").write_text(str(steps))
else:
    dump("data/metrics/evaluate.json", {"split": "test", "bleu": 1.5 * steps,
                                        "chrf": 10.0 + steps, "lineage": {"step": steps}})
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


def test_one_line_per_experiment(tmp_path):
    demo = project(
        tmp_path / "demo", "# Written by `python -m transformer.config preset demo`; edit freely.\n"
    )
    head = sh("git", "rev-parse", "--short=7", "HEAD", cwd=demo).strip()
    lines = results.table(results.rows(demo, results.exp_show(demo))).splitlines()
    assert [line.split() for line in lines] == [
        ["experiment", "preset", "BLEU", "chrF", "steps", "time"],
        ["workspace", "demo", "90.00", "70.00", "60", "1:01:24"],  # `exp run` leaves it applied
        ["main", f"({head})", "demo", "6.00", "14.00", "4", "0:04:06"],
        ["longer", "demo", "90.00", "70.00", "60", "1:01:24"],
    ]
    assert lines[3].startswith("  longer")  # beneath the commit it branched from
    assert max(map(len, lines)) < 80

    # no header (params.yaml written by hand): no preset; the CLI prints the same table
    bare = project(tmp_path / "bare", "")
    out = sh(sys.executable, "-m", "flows.results", str(bare), cwd=tmp_path)
    assert out.splitlines()[3].split() == ["longer", "-", "90.00", "70.00", "60", "1:01:24"]
