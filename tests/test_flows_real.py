"""The real seven-stage pipeline through the `pipeline/demo` deployment, with tiny overrides:
a run whose serve process is killed mid-train and that resumes by itself (followed by
`flows.run --wait`), its record, its experiment on another machine,
its promotion, and the champion fetched in a fresh clone and translating."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from helpers.checkout import checkout
from helpers.docs import walkthrough
from helpers.lines import TINY_MODEL
from prefect_fixtures import (
    BIN,
    artifact,
    client,
    deployment_run,
    dvc_json,
    fetch_champion,
    run_id,
    run_logs,
    served,
    sh,
    wait_until,
)

from flows.workspace import WORKSPACE
from transformer.model import checkpoint

TINY = [
    *TINY_MODEL,
    "train.max_steps=60",
    "train.save_every_steps=10",
    "train.valid_every_steps=30",
    "average.last_k=2",
    "decode.beam_size=1",
]
TERMINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
LOG_LINES = 240  # the most log lines a run (two attempts here, 13 stages) may send the server
# docs/export.md's lines: the champion's hf/ folder with transformers and nothing else
HF_ONLY = """
import sys
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("champion/hf")
model = AutoModelForSeq2SeqLM.from_pretrained("champion/hf")
lines = [line for line in open("in.en").read().splitlines() if line]
batch = tokenizer(lines, return_tensors="pt", padding=True)
out = tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
ours = [m for m in sys.modules if m.split(".")[0] in ("transformer", "flows")]
print(f"{len(out)} translations, project modules imported: {ours}")
"""


def state(run: str):
    with client() as c:
        return c.read_flow_run(run).state


@pytest.mark.slow
def test_real_pipeline_killed_resumed_promoted_fetched(
    prefect_server: dict, tmp_path: Path
) -> None:
    project = checkout(tmp_path)
    params = (project / "params.yaml").read_bytes()
    ws = project / WORKSPACE
    with served(project, prefect_server) as serve:
        # a run killed (kill -9) with its serve process once it has written checkpoints; what
        # a script waits on follows it across the crash and the retry
        waiter = subprocess.Popen(
            [sys.executable, "-m", "flows.run", "pipeline/demo"]
            + ["-p", f"overrides={json.dumps(TINY)}", "--wait"],
            cwd=project,
            env=prefect_server,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        started = waiter.stdout.readline()
        run = run_id(started)
        wait_until(
            "a checkpoint of the run", lambda: (ws / "data/checkpoints/step_00000020.pt").exists()
        )
        serve.kill()
        serve.wait()
    # the run crashes saying what died, the automation reschedules it, and the next serve
    # process resumes it: Completed, no person
    wait_until(
        "the crashed run to be rescheduled",
        lambda: state(run).name == "AwaitingRetry",
        every=1.0,
    )
    with client() as c:
        crashed = [s for s in c.read_flow_run_states(run) if s.is_crashed()]
    assert "the process serving this flow run" in crashed[-1].message
    with served(project, prefect_server):
        wait_until(
            "the resumed run to finish", lambda: state(run).type.value in TERMINAL, every=1.0
        )
        printed = started + waiter.communicate(timeout=600)[0]
    assert state(run).is_completed(), state(run)
    assert waiter.returncode == 0, printed
    assert "Crashed: the process serving" in printed, printed
    assert "ended Completed after 2 attempt(s)" in printed, printed
    logged = run_logs(run)
    text = "\n".join(logged)
    assert "attempt 2 of 3; the last one crashed: the process serving" in text
    assert "resuming from data/checkpoints/step_000000" in text
    assert not [p for p in psutil.process_iter(["cwd"]) if str(project) in (p.info["cwd"] or "")]
    assert (project / "params.yaml").read_bytes() == params
    assert sh("git", "status", "--porcelain", cwd=project) == ""
    assert dvc_json(ws, "status") == {}
    record = {row["field"]: row["value"] for row in artifact(run, "lineage")}
    assert "missing" not in record, record  # every lineage key found in the real metrics
    assert float(record["bleu"]) >= 0 and record["bleu_signature"].startswith("nrefs:1|")
    assert len(logged) <= LOG_LINES  # progress bars reach the log at a bounded rate
    # no blank lines; the stages' indented metrics JSON arrives as one line each
    assert not [m for m in logged if m.strip() in ("", "{", "}")]
    assert any(m.startswith("{") and '"pairs_in"' in m for m in logged)
    # the experiment commit holds the metrics, never the (uncached) checkpoints
    exp_commit = record["experiment_commit"]
    committed = sh("git", "ls-tree", "-r", "--name-only", exp_commit, cwd=project).split()
    assert "dvc.lock" in committed
    assert not [f for f in committed if f.startswith("data/checkpoints")]
    # links, not copies: the cache adds no second copy of the shards; checkpoints not cached
    shard = next((ws / "data/shards/train").glob("*.bin"))
    assert shard.stat().st_nlink == 2
    cached = list((project / ".dvc/cache").rglob("*"))
    ckpt = next((ws / "data/checkpoints").glob("step_*.pt")).stat().st_size
    assert ckpt not in {f.stat().st_size for f in cached if f.is_file()}
    # another machine: the experiment's commit + dvc pull is up to date, metrics and curves
    # too; the checkpoints stayed behind, which `--allow-missing` accepts
    dvc = (sys.executable, "-m", "dvc")
    sh(*dvc, "push", cwd=ws)
    clone = tmp_path / "clone"
    sh("git", "clone", "-q", str(project), str(clone), cwd=tmp_path)
    sh("git", "fetch", "-q", "origin", "+refs/exps/*:refs/exps/*", cwd=clone)
    sh("git", "checkout", "-q", exp_commit, cwd=clone)
    sh(*dvc, "pull", "--allow-missing", cwd=clone)
    assert dvc_json(clone, "status") == {
        "train": [{"changed outs": {"data/checkpoints": "deleted"}}],
        "average": [{"changed deps": {"data/checkpoints": "deleted"}}],
    }
    assert "Data and pipelines are up to date" in sh(
        *dvc, "repro", "--allow-missing", "--dry", cwd=clone
    )
    bleu = json.loads((clone / "data/metrics/evaluate.json").read_text())["bleu"]
    assert bleu == float(record["bleu"])
    assert (clone / "data/live/plots/metrics/train/loss.tsv").is_file()
    # the resumed run's experiment through the gate: the first champion, pushed to the remote
    exp = record["experiment"]
    out = sh(sys.executable, "-m", "flows.promote", exp, cwd=project, env=prefect_server)
    assert "promoted as v1.0.0: no champion yet" in out
    # the remote loses it (emptied, or a new one): `flows.registry publish` pushes it again
    shutil.rmtree(tmp_path / "remote")
    out = sh(sys.executable, "-m", "flows.registry", "publish", cwd=project, env=prefect_server)
    assert "v1.0.0: published" in out, out
    # another machine: a fresh clone fetches the champion and translates with it
    fresh = fetch_champion(project, tmp_path)
    src = "Lena bought 28 apples.\n\nThe meeting is at 3:35 PM.\n"
    (fresh / "in.en").write_text(src)
    translate = walkthrough()[-1]  # docs/orchestration.md's command, as it is written there
    assert translate == shlex.split("transformer-translate --model champion -i in.en -o out.de")
    sh(str(BIN / translate[0]), *translate[1:], cwd=fresh)
    assert len((fresh / "out.de").read_text().split("\n")) == 4  # 3 lines, the blank one kept
    # ... and with Hugging Face transformers alone: no module of this project is imported
    hf = sh(sys.executable, "-P", "-c", HF_ONLY, cwd=fresh)
    # (sh merges stderr, where transformers' progress bars go, after the printed line)
    assert "2 translations, project modules imported: []" in hf.splitlines(), hf
    champion = json.loads((fresh / "champion/lineage.json").read_text())
    assert champion["bleu"] == float(record["bleu"])
    assert champion["lineage"]["model_sha256"] == record["model_sha256"]

    # a cancelled run stops its train stage as the preemption notice does: the update in
    # progress saved (no periodic save after the resume point: it is the only new checkpoint),
    # the run Cancelled
    longer = [o for o in TINY if not o.startswith("train.max_")] + ["train.max_steps=1000000"]
    longer += ["train.save_every_steps=1000000", "train.valid_every_steps=1000000"]
    longer += ["train.log_every_steps=5"]
    curve = ws / "data/live/plots/metrics/train/loss.tsv"  # dvclive's: step, loss

    def updated_past_60() -> bool:  # an update after the resume point done and logged
        rows = curve.read_text().splitlines()[1:] if curve.exists() else []
        return any(int(row.split("\t")[0]) > 60 for row in rows)

    with served(project, prefect_server):
        r = deployment_run(
            prefect_server, "pipeline/demo", "-p", f"overrides={json.dumps(longer)}", watch=False
        )
        cancelled = run_id(r.stdout)
        wait_until("an update of the longer run past its resume point", updated_past_60)
        sh(str(BIN / "prefect"), "flow-run", "cancel", cancelled, cwd=project, env=prefect_server)
        wait_until("the run to end", lambda: state(cancelled).type.value in TERMINAL, every=1.0)
    assert state(cancelled).name == "Cancelled", state(cancelled)
    saved = checkpoint.list_checkpoints(ws / "data/checkpoints")
    cut = checkpoint.load(saved[-1])
    assert cut["step"] > 60 and not cut["final"], [p.name for p in saved]
    assert not list((ws / "data/checkpoints").glob(".*.tmp"))  # nothing half-written
    assert "preempted at step" in "\n".join(run_logs(cancelled))  # the stage's own word
