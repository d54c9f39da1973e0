"""A continued retrain of one line starts from that line's champion, not another line's, and its
lineage says so: two lines of the continuing recipe (helpers/continuing.py) on the real stages,
a real Prefect server and real DVC, each with a v1.0.0 of its own (different weights), then
line a's data grows and its retrain continues."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers.continuing import FIRST_PAIRS, preset, project_with_recipe, write_corpus
from helpers.lines import declare, tags
from prefect_fixtures import sh

from flows import lineage, registry
from flows.dag import locked_outs, read_dag
from flows.workspace import LINES

# each line's v1.0.0 trained from scratch; b's shorter, so the two champions' weights differ.
# a's continuation is kept short: this test is about where it starts, not how well it trains
DECLARED = """artifacts:
  a:
    path: data/package
    type: model
    meta:
      recipe: {preset: tiny-lines}
      schedule: null
      retrain: {continuation: {max_steps: 30}}
  b:
    path: data/package
    type: model
    meta:
      recipe: {preset: tiny-lines, overrides: [train.max_steps=30]}
      schedule: null
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def md5s(hashes: str) -> list[str]:
    """The content hashes of an outs_hash string ("path=md5,..."), without the paths."""
    return [h.split("=", 1)[1] for h in hashes.split(",")]


RUN_LINE = """
import json, sys
from flows.retrain import retrain
out = retrain(line=sys.argv[1])
print("RESULT " + json.dumps(out, default=str))
"""


def run_line(project: Path, name: str, env: dict) -> dict:
    """Line `name`'s retrain, as its deployment `retrain/NAME` runs it (the line alone: its
    recipe as HEAD declares it), in the project, with the project's own code."""
    r = subprocess.run(
        [sys.executable, "-c", RUN_LINE, name],
        cwd=project,
        env={**env, "PYTHONPATH": str(project)},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    (found,) = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(found.removeprefix("RESULT "))


@pytest.mark.slow
def test_a_continued_retrain_starts_from_its_own_lines_champion(
    prefect_server: dict, tmp_path: Path
) -> None:
    source, corpus, project = project_with_recipe(tmp_path, FIRST_PAIRS)
    # the recipe's corpus, relative to a line's run workspace (one level deeper than the
    # project's own), where the download stage runs
    relative = os.path.relpath(corpus, project / LINES / "a")
    (project / "presets/tiny-lines.yaml").write_text(yaml.safe_dump(preset(relative)))
    sh("git", "add", "presets/tiny-lines.yaml", cwd=project)
    declare(project, DECLARED)

    champions, v1_commits = {}, {}
    for name in ("a", "b"):
        first = run_line(project, name, prefect_server)
        assert first["promoted"] and first["version"] == "v1.0.0", first["reason"]
        assert first["line"] == name and first["parent"] is None, first
        champions[name] = tmp_path / f"{name}-v1"
        v1_commits[name] = first["candidate"]["experiment_commit"]
        shutil.copytree(project / LINES / name / "data/package", champions[name])
    a1, b1 = champions["a"], champions["b"]
    assert sha(a1 / "model.pt") != sha(b1 / "model.pt")  # two champions, told apart by weights
    b_tags = tags(project, "b@*", "b#*", "decision/b/*")

    write_corpus(source, corpus, 400)  # line a's data grows (b is not retrained)
    out = run_line(project, "a", prefect_server)
    ws = project / LINES / "a"
    assert out["line"] == "a" and out["parent"] == "v1.0.0", out
    assert out["champion_before"]["version"] == "v1.0.0", out["champion_before"]
    assert "trained continued from v1.0.0" in out["reason"], out["reason"]
    # it started from a's champion: the package fetched into data/parent, its tokenizer kept,
    # training on from its weights
    assert sha(ws / "data/parent/model.pt") == sha(a1 / "model.pt")
    kept = (ws / "data/tokenizer/tokenizer.json").read_bytes()
    assert kept == (a1 / "tokenizer/tokenizer.json").read_bytes()
    ckpt = torch.load(max((ws / "data/checkpoints").glob("step_*.pt")), weights_only=True)
    assert ckpt["parent_sha256"] == sha(a1 / "model.pt") != sha(b1 / "model.pt")

    # its lineage says so: the record (read back from the experiment's commit) names its line
    # and parent, and DVC's hash of data/parent is that of a's v1.0.0 package, not b's
    record = registry.record_at(project, out["candidate"]["experiment_commit"])
    assert record["line"] == "a" and record["parent"] == "v1.0.0", record
    assert record["parent_chain"] == ["v1.0.0"]

    def package_hash(name: str) -> list[str]:  # DVC's hash of line `name`'s v1.0.0 package
        lock = locked_outs(lineage.Snapshot(project, v1_commits[name]).text("dvc.lock"))
        return md5s(lineage.outs_hash(lock, read_dag(project), "package"))

    assert md5s(record["parent_hash"]) == package_hash("a") != package_hash("b")
    package = json.loads((ws / "data/package/lineage.json").read_text())
    assert package["parent"]["chain"] == ["v1.0.0"]
    assert package["parent"]["model_sha256"] == sha(a1 / "model.pt")
    assert tags(project, "b@*", "b#*", "decision/b/*") == b_tags  # b's registry untouched
