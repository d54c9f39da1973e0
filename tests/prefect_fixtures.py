"""A real Prefect server on 127.0.0.1, `python -m flows.serve` processes and toy DVC projects.

Imported by tests/test_flows*.py. The toy project is a real git + DVC repository whose stages
are quick Python scripts with the real pipeline's stage names, file layout and metrics keys.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SERVED = "polling for scheduled runs"  # what `serve` prints once its deployments exist
DVC = (sys.executable, "-m", "dvc")  # the venv's dvc
# how long a server or serve process may take to start: minutes on a machine whose cores are
# busy with other jobs (a bound that never decides a test on an idle one)
STARTUP_S = 600.0

TOY_STAGES = r"""
import hashlib, json, os, pathlib, shutil, sys, time
import yaml

P = yaml.safe_load(open("params.yaml"))
stage = sys.argv[1]
env = os.environ.get
if env("TOY_RUNLOG"):
    with open(env("TOY_RUNLOG"), "a") as f:
        f.write(stage + "\n")
print(f"toy {stage}: start", flush=True)

def sha(p):
    return hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()

def dump(path, obj):
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(json.dumps(obj, indent=1))

def barrier(me, other):  # proves two stages run at once: each waits for the other to start
    d = env("TOY_BARRIER")
    if d:
        pathlib.Path(d, me).touch()
        for _ in range(600):
            if pathlib.Path(d, other).exists():
                return
            time.sleep(0.05)
        sys.exit(f"toy {me}: {other} never started alongside")

if stage == "download":  # the upstream corpus (TOY_CORPUS) is outside the repo, like a WMT server
    fail = env("TOY_FAIL_ONCE")
    if fail and os.path.exists(fail):
        os.unlink(fail)
        sys.exit("toy download: connection reset (simulated)")
    os.makedirs("data/raw", exist_ok=True)
    files = {}
    for split in ("train", "test"):
        text = pathlib.Path(env("TOY_CORPUS"), f"{split}.txt").read_text()
        pathlib.Path(f"data/raw/{split}.en").write_text(text)
        files[split] = {"files": {f"{split}.en": {"sha256": sha(f"data/raw/{split}.en")}}}
    dump("data/metrics/download.json", {"source": "toy", "splits": files})
elif stage == "helpers":  # the real stage's record (transformer/helpers.py) of what was fetched
    out = {}
    for role in ("backward", "forward"):
        line, _, version = ((P.get("helpers") or {}).get(role) or "").partition("@")
        d = pathlib.Path("data/helpers", role)
        if version:
            out[role] = {"line": line, "version": version, "model_sha256": sha(d / "model.pt")}
        else:
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            (d / "NONE").write_text("none\n")
            why = f"{line} had no champion yet when this run started" if line else "none"
            out[role] = {"line": line or None, "version": None, "why": why}
    dump("data/metrics/helpers.json", out)
elif stage == "tokenizer":
    barrier("tokenizer", "stats")
    words = sorted(set(open("data/raw/train.en").read().split()))
    os.makedirs("data/tokenizer", exist_ok=True)
    pathlib.Path("data/tokenizer/tokenizer.json").write_text(json.dumps(words))
elif stage == "stats":
    barrier("stats", "tokenizer")
    dump("data/stats.json", {"lines": len(open("data/raw/train.en").readlines())})
elif stage == "train":  # persist: a killed run's retry finds its checkpoints, as the real one
    steps = P["train"]["max_steps"]
    if env("TOY_OOM_TRAIN") and os.path.exists(env("TOY_OOM_TRAIN")):  # as torch raises it
        from transformer.core import failure
        OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
        def oom():
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        failure.recorded("train", oom)()
    if env("TOY_FAIL_TRAIN") and os.path.exists(env("TOY_FAIL_TRAIN")):
        print("Traceback (most recent call last):", flush=True)
        sys.exit("error: data/shards/train.bin: not a shard (simulated corruption)")
    os.makedirs("data/checkpoints", exist_ok=True)
    done = sorted(pathlib.Path("data/checkpoints").glob("step_*.pt"))
    if done and done[-1].read_text().startswith(f"{steps} partial"):
        print(f"toy train: resuming from {done[-1]}", flush=True)
    else:
        for old in done:
            old.unlink()
        pathlib.Path("data/checkpoints/step_00000001.pt").write_text(f"{steps} partial")
    if env("TOY_SPANS"):  # when each train stage ran, by its workspace
        with open(env("TOY_SPANS"), "a") as f:
            f.write(f"{os.getcwd()} start {time.time()}\n")
    if env("TOY_STARTED"):
        pathlib.Path(env("TOY_STARTED")).touch()
    hold = env("TOY_HOLD")
    while hold and os.path.exists(hold):
        time.sleep(0.05)
    for s in (steps // 2, steps):
        ckpt = pathlib.Path(f"data/checkpoints/step_{s:08d}.pt")
        ckpt.write_text(f"{s} {sha('data/raw/train.en')}")
    # dvclive's files, as the real stage writes them: a log point per step, a validation per
    # tenth, metrics.json after each; TOY_TRAIN_S spreads the steps over that many seconds
    live, pace = pathlib.Path("data/live/plots/metrics"), float(env("TOY_TRAIN_S") or 0)
    shutil.rmtree(live, ignore_errors=True)
    for s in range(1, steps + 1):
        rows = {"train/loss": 10 / s, "train/cpu_steal": 0.0}
        if s % max(steps // 10, 1) == 0 or s == steps:
            rows.update({"valid/loss": 12 / s, "valid/bleu": s / 10, "valid/chrf": 50 * s / steps})
        for name, x in rows.items():
            f = live / f"{name}.tsv"
            f.parent.mkdir(parents=True, exist_ok=True)
            new = not f.exists()
            with open(f, "a") as fh:
                fh.write(f"step\t{name.split('/')[1]}\n" * new + f"{s}\t{x:.3f}\n")
        dump("data/live/metrics.json", {"step": s, "train": {"loss": 10 / s, "seconds": s}})
        time.sleep(pace / steps)
    if env("TOY_SPANS"):
        with open(env("TOY_SPANS"), "a") as f:
            f.write(f"{os.getcwd()} end {time.time()}\n")
    print(f"toy train: trained {steps} steps", flush=True)
elif stage == "evaluate":
    ckpts = sorted(str(p) for p in pathlib.Path("data/checkpoints").glob("step_*.pt"))
    os.makedirs("data/eval", exist_ok=True)
    pathlib.Path("data/eval/hyps.test.txt").write_text(open("data/raw/test.en").read())
    dump("data/metrics/evaluate.json", {
        "split": "test", "bleu": P["train"]["max_steps"] / 10, "chrf": 50.0,
        "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1",
        "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.5.1",
        "lineage": {"model_sha256": sha(ckpts[-1]), "averaged_checkpoints": ckpts,
                    "tokenizer_sha256": sha("data/tokenizer/tokenizer.json")}})
elif stage == "package":
    shutil.rmtree("data/package", ignore_errors=True)
    os.makedirs("data/package")
    last = sorted(pathlib.Path("data/checkpoints").glob("step_*.pt"))[-1]
    shutil.copy(last, "data/package/model.pt")
    shutil.copytree("data/tokenizer", "data/package/tokenizer")
    shutil.copy("data/metrics/evaluate.json", "data/package/lineage.json")
"""

TOY_DVC_YAML = """
stages:
  download:
    cmd: python toy.py download
    deps: [toy.py]
    params: [download]
    outs: [data/raw]
    metrics: [data/metrics/download.json]
  tokenizer:
    cmd: python toy.py tokenizer
    deps: [data/raw, toy.py]
    params: [tokenizer]
    outs: [data/tokenizer]
  stats:
    cmd: python toy.py stats
    deps: [data/raw, toy.py]
    outs: [data/stats.json]
  train:
    cmd: python toy.py train
    deps: [data/raw, data/tokenizer, toy.py]
    params: [train]
    outs: [{data/checkpoints: {persist: true}}]
    metrics: [{data/live/metrics.json: {cache: false}}]
    plots: [{data/live/plots/metrics: {x: step, cache: false}}]
  evaluate:
    cmd: python toy.py evaluate
    deps: [data/checkpoints, data/tokenizer, data/raw, toy.py]
    params: [evaluate]
    outs: [data/eval]
    metrics: [data/metrics/evaluate.json]
  package:
    cmd: python toy.py package
    deps: [data/checkpoints, data/tokenizer, data/metrics/evaluate.json, toy.py]
    outs: [data/package]
plots:
  - loss:
      title: train and valid loss
      x: step
      y:
        data/live/plots/metrics/train/loss.tsv: loss
        data/live/plots/metrics/valid/loss.tsv: loss
      y_label: loss
  - quality:
      title: valid BLEU and chrF
      x: step
      y:
        data/live/plots/metrics/valid/bleu.tsv: bleu
        data/live/plots/metrics/valid/chrf.tsv: chrf
      y_label: score
artifacts:
  transformer:
    path: data/package
    type: model
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*cmd: str, cwd: Path, env: dict | None = None, check: bool = True) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check and r.returncode:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout + r.stderr


def git_init(path: Path) -> None:
    sh("git", "init", "-q", "-b", "main", cwd=path)
    sh("git", "config", "user.email", "t@example.com", cwd=path)
    sh("git", "config", "user.name", "test", cwd=path)


_built: dict[str, Path] = {}  # this process's toy project, built once by make_toy


def make_toy(path: Path) -> Path:
    """A git + DVC project: this checkout's flows/ and config, the toy stages, the demo preset.
    Its upstream corpus is path/../corpus (TOY_CORPUS), outside the repository. Built once per
    process and copied to `path` for each caller (`dvc init` and the preset's CLI cost seconds
    of CPU each time; every caller gets a project of its own)."""
    if "toy" not in _built:
        home = Path(tempfile.mkdtemp(prefix="toy-template-"))
        atexit.register(shutil.rmtree, home, True)
        _built["toy"] = build_toy(home / "toy")
    return copy_toy(_built["toy"], path)


def build_toy(path: Path) -> Path:
    """make_toy's project, built at `path` (its corpus at path/../corpus)."""
    path.mkdir(parents=True)
    shutil.copytree(ROOT / "flows", path / "flows", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "presets", path / "presets")
    # the toy's demo recipe trains 600 "steps", BLEU 60 on toy.py's scale, whatever the real
    # demo's length: the tests compare candidates against that champion
    demo = yaml.safe_load((path / "presets/demo.yaml").read_text())
    demo["train"]["max_steps"] = 600
    # toy.py's evaluate keeps no hypotheses: its records are judged on the margin, as asked for
    demo.setdefault("retrain", {})["allow_margin_only"] = True
    (path / "presets/demo.yaml").write_text(yaml.safe_dump(demo))
    (path / "transformer").mkdir()
    for name in ("__init__.py", "config.py"):  # the params CLI and the torch-free core it reads
        shutil.copy(ROOT / "transformer" / name, path / "transformer" / name)
    shutil.copytree(
        ROOT / "transformer/core",
        path / "transformer/core",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (path / "toy.py").write_text(TOY_STAGES)
    (path / "dvc.yaml").write_text(TOY_DVC_YAML)
    (path / ".gitignore").write_text("/data/\n/dvc_plots/\n__pycache__/\n")
    corpus = path.parent / "corpus"
    corpus.mkdir()
    (corpus / "train.txt").write_text("a small corpus\nof toy sentences\n")
    (corpus / "test.txt").write_text("a toy test set\n")
    sh(sys.executable, "-m", "transformer.config", "preset", "demo", cwd=path)
    git_init(path)
    sh(sys.executable, "-m", "dvc", "init", "-q", cwd=path)
    sh("git", "add", "-A", cwd=path)
    sh("git", "commit", "-qm", "toy project", cwd=path)
    return path


def copy_toy(template: Path, dest: Path) -> Path:
    """A copy of the toy project (git history and DVC config included) and of its corpus."""
    shutil.copytree(template.parent / "corpus", dest.parent / "corpus")
    return Path(shutil.copytree(template, dest, symlinks=True))


def server_env(home: Path) -> dict[str, str]:
    """The environment of a test server whose PREFECT_HOME (database, log) is `home`."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
        "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "1",
    }
    env.pop("PREFECT_API_URL", None)
    return env


def client_env(home: Path, port: int) -> dict[str, str]:
    """The environment of the processes a test starts against the server at `home`, `port`."""
    return {
        **server_env(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_LOGGING_LEVEL": "INFO",
    }


@contextlib.contextmanager
def server_process(home: Path, port: int) -> Iterator[subprocess.Popen]:
    """`prefect server start` on 127.0.0.1:`port` with PREFECT_HOME `home`, once it answers,
    until the block ends (a second one on the same home and port is the first restarted)."""
    url = f"http://127.0.0.1:{port}/api"
    with open(home / "server.log", "a") as log:
        proc = subprocess.Popen(
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=server_env(home),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + STARTUP_S
            while time.monotonic() < deadline:
                assert proc.poll() is None, (home / "server.log").read_text()
                with contextlib.suppress(OSError):
                    if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                        break
                time.sleep(0.1)
            else:
                raise AssertionError(
                    f"the server never answered:\n{(home / 'server.log').read_text()}"
                )
            yield proc
        finally:
            stop(proc)


@pytest.fixture(scope="session", name="prefect_server")
def prefect_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A real `prefect server start` on 127.0.0.1 with a temporary PREFECT_HOME; its env."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    home, port = tmp_path_factory.mktemp("prefect-home"), free_port()
    url = f"http://127.0.0.1:{port}/api"
    with server_process(home, port):
        try:
            with temporary_settings(updates={PREFECT_API_URL: url, PREFECT_HOME: str(home)}):
                yield client_env(home, port)
        finally:
            from prefect.events.worker import EventsWorker
            from prefect.logging.handlers import APILogWorker

            # send this process's pending logs and events while the server is still up
            APILogWorker.drain_all(timeout=15)
            EventsWorker.drain_all(timeout=15)
            if url in _clients:
                _clients.pop(url).__exit__(None, None, None)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Signal the process group and wait; SIGKILL whatever is left after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def served(
    project: Path, env: dict[str, str], *args: str, **extra: str
) -> Iterator[subprocess.Popen]:
    """`python -m flows.serve ARGS` in `project` until the block ends (or the test kills it)."""
    log_path = project.parent / f"{project.name}-serve-{time.monotonic_ns()}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.serve", *args],
            cwd=project,
            env={**env, **extra},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + STARTUP_S
            while time.monotonic() < deadline:
                assert proc.poll() is None, log_path.read_text()
                if SERVED in log_path.read_text():
                    break
                time.sleep(0.1)
            else:
                raise AssertionError(f"serve never started:\n{log_path.read_text()}")
            proc.log_path = log_path  # type: ignore[attr-defined]
            yield proc
        finally:
            # as a supervisor stops it (Prefect's runner handles SIGTERM itself); after
            # test_flows' scenarios, one SIGINT left it serving until the SIGKILL 30 s later
            stop(proc, signal.SIGTERM)


def deployment_run(
    env: dict[str, str], name: str, *args: str, watch: bool = True, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """`prefect deployment run NAME [--watch] ARGS` as a user types it."""
    cmd = [str(BIN / "prefect"), "deployment", "run", name, *(["--watch"] if watch else []), *args]
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800, check=False
    )


def flows_run(
    env: dict[str, str], name: str, *args: str, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """`python -m flows.run NAME ARGS --wait`, as a script or cron job runs it."""
    cmd = [sys.executable, "-m", "flows.run", name, *args, "--wait"]
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800, check=False
    )


def run_id(cli_output: str) -> str:
    """The flow run id `prefect deployment run` printed."""
    for line in cli_output.splitlines():
        if "UUID:" in line:
            return line.split("UUID:")[1].strip()
    raise AssertionError(f"no flow run id in:\n{cli_output}")


def dvc_json(project: Path, *args: str):
    """`dvc ARGS --json`, parsed."""
    cmd = [sys.executable, "-m", "dvc", *args, "--json"]
    r = subprocess.run(cmd, cwd=project, capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout)


_clients: dict[str, Any] = {}  # API URL -> an open sync client


@contextlib.contextmanager
def client() -> Iterator[Any]:
    """The test process's client of the current server, opened once and kept open: a new
    client costs ~50 ms of CPU and a version request, which `wait_until` loops paid 5 times a
    second. prefect_server closes it."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url not in _clients:
        _clients[url] = get_client(sync_client=True).__enter__()
    yield _clients[url]


def find_artifact(run: str, key: str):
    """Flow run `run`'s one artifact `key`, as the server stores it."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    with client() as c:
        (found,) = c.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[run])
            )
        )
    return found


def artifact(run: str, key: str):
    found = find_artifact(run, key)
    return json.loads(found.data) if found.type == "table" else found.data


def run_logs(run: str) -> list[str]:
    """Every log line of flow run `run`, as Prefect stored them: all of them once it ended."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    # Logs reach the server in batches (every 2 s) after the state that ends a run: a flow run
    # in this process hands its unsent ones over here; a served run's process sends them as it
    # exits, after the engine's last line, "Finished in state ...", where the engine set the
    # state itself (Completed, Failed; not a runner's Crashed or Cancelled).
    APILogWorker.drain_all(timeout=5)
    with client() as c:
        by_engine = c.read_flow_run(run).state.type.value in ("COMPLETED", "FAILED")

        def stored() -> tuple[list[str]] | None:
            logs, offset, where = [], 0, LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run]))
            while batch := c.read_logs(where, limit=200, offset=offset):
                logs += batch
                offset += len(batch)
            last = any(x.task_run_id is None and x.message.startswith("Finished in") for x in logs)
            return ([x.message for x in logs],) if last or not by_engine else None

        return wait_until(f"the last log line of run {run}", stored, timeout=60)[0]


def wait_until(what: str, check, timeout: float = 600.0, every: float = 0.2):
    """Poll `check()` every `every` s until it returns something truthy; fail naming `what` (no
    timing asserted). A read of the server costs it ~20 ms of CPU: a wait of a minute for a run
    to end polls it once a second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(every)
    raise AssertionError(f"gave up waiting for {what}")


def fetch_champion(project: Path, tmp_path: Path, *args: str) -> Path:
    """A fresh clone of `project` and, in it, `dvc artifacts get . transformer --stage prod -o
    champion --remote store ARGS`, as the README says; the clone."""
    fresh = tmp_path / "fresh"
    tmp_path.mkdir(parents=True, exist_ok=True)
    sh("git", "clone", "-q", str(project), str(fresh), cwd=tmp_path)
    get = (*DVC, "artifacts", "get", ".", "transformer", "--stage", "prod", "-o", "champion")
    get += ("--remote", "store")
    sh(*get, *args, cwd=fresh)
    return fresh
