"""A continued retrain of one line starts from that line's champion, not another line's, and its
lineage says so: on the real stages, a real Prefect server and real DVC, the session's champion
of the continuing recipe (helpers/continuing.py: `transformer@v1.0.0`, promoted before its
project declared lines) becomes line `transformer`, beside a line `b` whose v1.0.0 is trained
here (other weights); then transformer's data grows and its retrain continues.

Line b's recipe is the demo reversed, shortened (`demo-de-en`): its run also shows that every
stage runs the German -> English direction and that the package says so."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers.continuing import Champion, preset, write_corpus
from helpers.lines import declare, tags
from prefect_fixtures import sh

from flows import lineage, registry
from flows.dag import locked_outs, read_dag
from flows.workspace import LINES

# b: the demo reversed, smaller and 40 updates (no HF export: no test reads it)
DE_EN = [
    "download.synthetic.train=300",
    "download.synthetic.valid=20",
    "download.synthetic.test=20",
    "tokenizer.vocab_size=300",
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_layers=1",
    "train.max_steps=40",
    "train.save_every_steps=10",
    "train.valid_every_steps=20",
    "average.last_k=2",
    "decode.beam_size=1",
    "package.hf=false",
]
# transformer's continuation is kept short: this test is about where it starts, not how well it
# trains (test_flows_continue's continuation is the one gated beyond noise)
DECLARED = yaml.safe_dump(
    {
        "artifacts": {
            "transformer": {
                "path": "data/package",
                "type": "model",
                "meta": {
                    "recipe": {"preset": "tiny-lines"},
                    "schedule": None,
                    "retrain": {"continuation": {"max_steps": 30}},
                },
            },
            "b": {
                "path": "data/package",
                "type": "model",
                "meta": {"recipe": {"preset": "demo-de-en", "overrides": DE_EN}, "schedule": None},
            },
        }
    },
    sort_keys=False,
)


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


def german_to_english(ws: Path) -> None:
    """The run in workspace `ws` went German -> English, every stage of it."""
    data = ws / "data"
    manifest = json.loads((data / "metrics/download.json").read_text())
    assert (manifest["src_lang"], manifest["tgt_lang"]) == ("de", "en")
    hyps = (data / "eval/hyps.test.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len((data / "raw/test.en").read_text(encoding="utf-8").splitlines())
    scores = json.loads((data / "metrics/evaluate.json").read_text())
    assert scores["n_sentences"] == 20 and "bleu_tok_compound_split" not in scores  # German's
    card = (data / "package/README.md").read_text(encoding="utf-8")
    assert "de-en" in card and "en-de" not in card


@pytest.mark.slow
def test_a_continued_retrain_starts_from_its_own_lines_champion(
    prefect_server: dict, continuing_champion: Champion
) -> None:
    source, corpus, project = (
        continuing_champion.source,
        continuing_champion.corpus,
        continuing_champion.project,
    )
    # the recipe's corpus, relative to a line's run workspace (one level deeper than the
    # project's own, where the champion was trained), where the download stage runs
    relative = os.path.relpath(corpus, project / LINES / "transformer")
    (project / "presets/tiny-lines.yaml").write_text(yaml.safe_dump(preset(relative)))
    sh("git", "add", "presets/tiny-lines.yaml", cwd=project)
    declare(project, DECLARED)
    a1 = continuing_champion.v1  # transformer's v1.0.0 package
    v1_commits = {"transformer": continuing_champion.first["candidate"]["experiment_commit"]}

    first = run_line(project, "b", prefect_server)
    assert first["promoted"] and first["version"] == "v1.0.0", first["reason"]
    assert first["line"] == "b" and first["parent"] is None, first
    v1_commits["b"] = first["candidate"]["experiment_commit"]
    german_to_english(project / LINES / "b")
    b1 = sha(project / LINES / "b/data/package/model.pt")
    assert sha(a1 / "model.pt") != b1  # two champions, told apart by weights
    b_tags = tags(project, "b@*", "b#*", "decision/b/*")

    write_corpus(source, corpus, 400)  # transformer's data grows (b is not retrained)
    out = run_line(project, "transformer", prefect_server)
    ws = project / LINES / "transformer"
    assert out["line"] == "transformer" and out["parent"] == "v1.0.0", out
    assert out["champion_before"]["version"] == "v1.0.0", out["champion_before"]
    assert "trained continued from v1.0.0" in out["reason"], out["reason"]
    # it started from its own champion: the package fetched into data/parent, its tokenizer
    # kept, training on from its weights
    assert sha(ws / "data/parent/model.pt") == sha(a1 / "model.pt")
    kept = (ws / "data/tokenizer/tokenizer.json").read_bytes()
    assert kept == (a1 / "tokenizer/tokenizer.json").read_bytes()
    ckpt = torch.load(max((ws / "data/checkpoints").glob("step_*.pt")), weights_only=True)
    assert ckpt["parent_sha256"] == sha(a1 / "model.pt") != b1

    # its lineage says so: the record (read back from the experiment's commit) names its line
    # and parent, and DVC's hash of data/parent is that of its v1.0.0 package, not b's
    record = registry.record_at(project, out["candidate"]["experiment_commit"])
    assert record["line"] == "transformer" and record["parent"] == "v1.0.0", record
    assert record["parent_chain"] == ["v1.0.0"]

    def package_hash(name: str) -> list[str]:  # DVC's hash of line `name`'s v1.0.0 package
        lock = locked_outs(lineage.Snapshot(project, v1_commits[name]).text("dvc.lock"))
        return md5s(lineage.outs_hash(lock, read_dag(project), "package"))

    assert md5s(record["parent_hash"]) == package_hash("transformer") != package_hash("b")
    package = json.loads((ws / "data/package/lineage.json").read_text())
    assert package["parent"]["chain"] == ["v1.0.0"]
    assert package["parent"]["model_sha256"] == sha(a1 / "model.pt")
    assert tags(project, "b@*", "b#*", "decision/b/*") == b_tags  # b's registry untouched
