"""The real six-stage pipeline through the `pipeline/demo` deployment, with tiny overrides."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prefect_fixtures import (
    ROOT,
    artifact,
    deployment_run,
    dvc_json,
    git_init,
    run_id,
    served,
    sh,
)

TINY = [
    "download.synthetic.train=300",
    "download.synthetic.valid=20",
    "download.synthetic.test=20",
    "tokenizer.vocab_size=300",
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_layers=1",
    "train.max_steps=10",
    "train.save_every_steps=5",
    "train.valid_every_steps=5",
    "average.last_k=2",
    "decode.beam_size=1",
]


@pytest.mark.slow
def test_real_pipeline_through_deployment(prefect_server: dict, tmp_path: Path) -> None:
    project = tmp_path / "checkout"
    project.mkdir()
    files = sh("git", "ls-files", "-co", "--exclude-standard", cwd=ROOT).split()
    tar = subprocess.run(
        ["tar", "-cf", "-", *[f for f in files if (ROOT / f).is_file()]],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-xf", "-"], cwd=project, input=tar, check=True)
    git_init(project)
    sh("git", "add", "-A", cwd=project)
    sh("git", "commit", "-qm", "checkout", cwd=project)
    with served(project, prefect_server):
        r = deployment_run(prefect_server, "pipeline/demo", "-p", f"overrides={json.dumps(TINY)}")
    assert r.returncode == 0, r.stdout + r.stderr
    table = {row["field"]: row["value"] for row in artifact(run_id(r.stdout), "lineage")}
    assert "missing" not in table, table  # every lineage key found in the real metrics files
    assert float(table["bleu"]) >= 0 and table["bleu_signature"].startswith("nrefs:1|")
    assert dvc_json(project, "status") == {}
    # the experiment commit holds the metrics, never the (uncached) checkpoints
    refs = sh("git", "for-each-ref", "refs/exps", "--format=%(objectname) %(refname)",
              cwd=project).splitlines()
    (exp,) = [r.split()[0] for r in refs if r.endswith("/" + table["experiment"])]
    committed = sh("git", "ls-tree", "-r", "--name-only", exp, cwd=project).split()
    assert "dvc.lock" in committed
    assert not [f for f in committed if f.startswith("data/checkpoints")]
    # links, not copies: the cache adds no second copy of the shards; checkpoints not cached
    shard = next((project / "data/shards/train").glob("*.bin"))
    assert shard.stat().st_nlink == 2
    cached = list((project / ".dvc/cache").rglob("*"))
    ckpt = next((project / "data/checkpoints").glob("step_*.pt")).stat().st_size
    assert ckpt not in {f.stat().st_size for f in cached if f.is_file()}
    # another machine: git clone + dvc pull is an up-to-date workspace, metrics and curves too;
    # the checkpoints stayed behind, which `--allow-missing` accepts
    dvc = (sys.executable, "-m", "dvc")
    sh(*dvc, "remote", "add", "-d", "store", str(tmp_path / "remote"), cwd=project)
    sh("git", "add", "-A", cwd=project)
    sh("git", "commit", "-qm", "the run", cwd=project)
    sh(*dvc, "push", cwd=project)
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(project), str(clone), cwd=tmp_path)
    sh(*dvc, "pull", "--allow-missing", cwd=clone)
    assert dvc_json(clone, "status") == {
        "train": [{"changed outs": {"data/checkpoints": "deleted"}}],
        "average": [{"changed deps": {"data/checkpoints": "deleted"}}],
    }
    assert "Data and pipelines are up to date" in sh(*dvc, "repro", "--allow-missing",
                                                     "--dry", cwd=clone)
    bleu = json.loads((clone / "data/metrics/evaluate.json").read_text())["bleu"]
    assert bleu == float(table["bleu"])
    assert (clone / "data/live/plots/metrics/train/loss.tsv").is_file()
