"""The Prefect server away: `python -m flows.run --wait` gives up after --server-grace seconds
with its own exit status, a deployment that does not exist is named with those that do, and a
train stage outlives a server restart, its progress bar resuming. Real servers on 127.0.0.1,
one of them stopped and started again on its own database."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefect_fixtures import client, client_env, free_port, make_toy, server_process, wait_until

from flows.progress import KEY
from flows.run import NOT_STARTED, UNREACHABLE

# the pipeline's own preamble and stage tasks up to the train stage (the rest is not the point)
UP_TO_TRAIN = """
from pathlib import Path
from prefect import flow
from flows.dag import read_dag
from flows.pipeline import prepare, run_stages

@flow(name="up-to-train")
def up_to_train():
    ws, _ = prepare(Path.cwd(), "HEAD", None, ["train.max_steps=40"])
    dag = read_dag(ws)
    return run_stages(ws, {k: dag[k] for k in ("download", "tokenizer", "train")})

up_to_train()
"""
FOLLOW = "import sys; from flows.run import follow; sys.exit(follow(sys.argv[1], 0, None, 0.2, 2))"


def flows_run(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flows.run", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_server_that_is_not_there_is_given_up_on_naming_it(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    env = {**os.environ, "PREFECT_HOME": str(tmp_path)}
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
    r = flows_run(env, "pipeline/demo", "--wait", "--server-grace", "1")
    assert r.returncode == UNREACHABLE, r.stdout + r.stderr
    assert f"error: the Prefect server at http://127.0.0.1:{port}/api did not answer for 1 s" in (
        r.stdout
    )
    assert "no run started" in r.stdout and "Traceback" not in r.stderr
    help_text = flows_run(env, "--help").stdout
    assert f"{UNREACHABLE} the Prefect server did not answer for --server-grace" in " ".join(
        help_text.split()
    )


def test_a_deployment_that_does_not_exist_is_named_with_those_that_do(
    prefect_server: dict,
) -> None:
    """As `flows.run retrain/retrain` on a project whose lines made retrain/en-de and
    retrain/de-en (a flow of its own here: other tests serve the real names)."""
    with client() as c:
        flow_id = c.create_flow_from_name("lines-80")
        for name in ("en-de", "de-en"):
            c.create_deployment(flow_id, name)
    for asked in ("lines-80/retrain", "lines-80"):
        r = flows_run(prefect_server, asked, "--wait")
        assert r.returncode == NOT_STARTED, r.stdout + r.stderr
        said = r.stdout.split("error: ", 1)[1]
        assert said.startswith(f"no deployment {asked!r} on {prefect_server['PREFECT_API_URL']}")
        assert "; deployments: " in said and "lines-80/de-en, lines-80/en-de" in said, said


@contextlib.contextmanager
def api(env: dict) -> Iterator:
    """A client of the server `env` names (not the session's)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = env["PREFECT_API_URL"]
    with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as c:
        yield c


@pytest.mark.slow
def test_a_train_stage_outlives_a_server_restart(tmp_path: Path) -> None:
    """The server stops while the toy's train stage runs: the bar's updates fail (warnings),
    `flows.run --wait` following the run gives up after its grace naming the server, the stage
    goes on; the server comes back on its database, the bar reaches 100% and the run completes."""
    home, port = tmp_path / "prefect-home", free_port()
    home.mkdir()
    toy = make_toy(tmp_path / "toy")
    hold, started, log = tmp_path / "hold", tmp_path / "started", tmp_path / "flow.log"
    hold.touch()
    env = client_env(home, port) | {
        "TOY_CORPUS": str(toy.parent / "corpus"),
        "TOY_HOLD": str(hold),
        "TOY_STARTED": str(started),
        "TOY_TRAIN_S": "6",  # the bar is read every 0.1 s meanwhile
        "FLOWS_PROGRESS_EVERY_S": "0.1",
        # the engine's client waits out the restart however slow (8 retries: 2 + 4 + ... + 256
        # s), so the stage's end meets the server back: Prefect's default gives up after ~62 s
        "PREFECT_CLIENT_MAX_RETRIES": "8",
    }
    popen = {"cwd": toy, "env": env, "stderr": subprocess.STDOUT, "text": True}
    with server_process(home, port):
        flow = subprocess.Popen([sys.executable, "-c", UP_TO_TRAIN], stdout=log.open("w"), **popen)
        wait_until("the train stage", lambda: started.exists() or flow.poll() is not None)
        assert flow.poll() is None, log.read_text()
        with api(env) as c:
            (run,) = c.read_flow_runs()
            (bar,) = c.read_artifacts()
        assert (bar.key, bar.data) == (KEY, 0.0)
        follower = subprocess.Popen(
            [sys.executable, "-c", FOLLOW, str(run.id)], stdout=subprocess.PIPE, **popen
        )
        seen = ""
        while "stage train: Running" not in seen and (line := follower.stdout.readline()):
            seen += line  # the follower has read the run from the server
        assert "stage train: Running" in seen, seen
    hold.unlink()  # the server is stopped: the stage trains on, the bar cannot be updated
    warned = "not written, the run goes on"
    wait_until("the bar's update to fail", lambda: warned in log.read_text() or flow.poll())
    assert flow.poll() is None, log.read_text()
    followed = follower.communicate(timeout=300)[0]
    assert follower.returncode == UNREACHABLE, followed
    url = env["PREFECT_API_URL"]
    assert f"error: the Prefect server at {url} did not answer for 2 s" in followed
    assert f"stopped following run {run.id}, last seen Running" in followed
    with server_process(home, port):
        flow.wait(timeout=900)
        printed = log.read_text()
        assert flow.returncode == 0, printed
        with api(env) as c:
            state = c.read_flow_run(run.id).state
            (bar,) = [a for a in c.read_artifacts() if a.key == KEY]
            stages = {t.name.rsplit("-", 1)[0]: t.state.name for t in c.read_task_runs()}
    assert state.is_completed(), state
    assert stages["train"] == "Completed" and "toy train: trained 40 steps" in printed
    assert "update_progress_artifact: not written, the run goes on (Prefect API: Connect" in printed
    assert bar.data == 100.0  # the bar resumed: the stage's end set it once the server was back
