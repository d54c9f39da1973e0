"""Soak test of unattended retraining: retrain cycles back to back, with faults injected.

    python -m benchmarks.faults.soak --workdir /tmp/soak --cycles 30 [--seed 1] [--fault-rate 0.33]

Everything is real and local: a Prefect server on 127.0.0.1; `python -m flows.serve`, restarted
whenever it dies (as systemd's Restart=always would); a corpus server on 127.0.0.1 that the
`wmt` source downloads from; and a git clone of this checkout (its committed code) with a
`soak` preset: the demo's synthetic corpus served as files, the demo's model, 40 steps
(--steps) on 2 gloo ranks that torchrun restarts once, a checkpoint every quarter of them.
Before each cycle the train split changes (a new snapshot; valid and test stay), then
`retrain/retrain` runs with the deployment's own recipe, as its cron schedule would. A share of
the cycles (--fault-rate), and at least one cycle per kind of fault, gets one fault: every kind
once, the rest drawn at random, in an order and at cycles drawn from --seed:

- kill: kill -9 of the serve process while a stage runs;
- stagekill: kill -9 of the stage's own process (the newest process in the run workspace that
  is not DVC: the stage command, or a torchrun worker, whose group torchrun restarts);
- http500: the corpus server answers 500 to the next few requests;
- drop: it drops the connection half-way through the next few bodies;
- corrupt: a shard in the run workspace is overwritten with garbage once the shard stage has
  written it (the train stage then refuses it: its sha256 no longer matches);
- full: the project's file system (a tmpfs, so root only) is filled for 20 s during a stage;
- sigterm, rankkill, divergence: the train stage (2 gloo ranks) preempted, a rank of it killed,
  a divergence injected (benchmarks/faults/soak_train.py).

It prints a table of the cycles, one of the faults by kind with the updates each made the train
stage redo (soak_train.py says how they are counted), and checks what an unattended run must
leave: no run left Running, Pending or rescheduled; every cycle Completed (after its automatic
retries) or Failed with a named cause; the champion's BLEU never lower than the previous
champion's; no lock held, no DVC temporary workspace, half-written folder or stage process
left; the checkout unchanged; and each train fault's own outcome (soak_train.checks).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.faults import soak_train
from benchmarks.faults.soak_faults import (
    FAULTS,
    Corpus,
    Supervisor,
    inject,
    plan,
    snapshot,
    stage_running,
)

FINAL = ("COMPLETED", "FAILED", "CANCELLED")

PRESET = """# The soak test's recipe (benchmarks/faults/soak.py): the demo, served over HTTP, trained briefly.
download:
  source: wmt
  retries: 4
  backoff: 0.5
  timeout: 10
  splits:
    train: [{{path: "{url}/train.{{lang}}", name: snapshot}}]
    valid: [{{path: "{url}/valid.{{lang}}", name: valid}}]
    test: [{{path: "{url}/test.{{lang}}", name: test}}]
tokenizer: {{vocab_size: 1000}}
# 2 gloo ranks (rankkill kills one), restarted once; every step logged: what a fault cost
train: {{max_steps: {steps}, warmup_steps: 20, lr_scale: 0.7, save_every_steps: {save_every},
        valid_every_steps: 20, log_every_steps: 1, nproc: 2, max_restarts: 1}}
average: {{last_k: 2}}
decode: {{beam_size: 2, batch_tokens: 2048}}
"""


def wait_final(run: str, timeout: float) -> object:
    """The run once it is final: Completed/Failed/Cancelled, or Crashed and left so for 60 s."""
    from prefect.client.orchestration import get_client

    deadline, crashed_since = time.monotonic() + timeout, None
    with get_client(sync_client=True) as c:
        while time.monotonic() < deadline:
            fr = c.read_flow_run(run)
            kind = fr.state.type.value
            if kind in FINAL:
                return fr
            crashed_since = (crashed_since or time.monotonic()) if kind == "CRASHED" else None
            if crashed_since and time.monotonic() - crashed_since > 60:
                return fr
            time.sleep(2)
    raise TimeoutError(f"flow run {run} not final after {timeout:.0f} s")


def start_server(home: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "DVC_NO_ANALYTICS": "1",
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=open(home / "server.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    import urllib.request

    for _ in range(3000):  # a busy machine takes minutes
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(f"{env['PREFECT_API_URL']}/health", timeout=2).status == 200:
                return proc, env
        time.sleep(0.2)
    raise RuntimeError(f"the Prefect server did not start: {home / 'server.log'}")


def save_every(steps: int) -> int:
    return max(1, steps // 4)


def setup(workdir: Path, url: str, size_mb: int, steps: int) -> tuple[Path, Path, bool]:
    """(the project, its file system's mount point, whether that is a tmpfs of its own)."""
    fs = workdir / "fs"
    fs.mkdir(parents=True, exist_ok=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(fs)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    project = fs / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    preset = PRESET.format(url=url, steps=steps, save_every=save_every(steps))
    (project / "presets/soak.yaml").write_text(preset)
    for cmd in (
        [sys.executable, "-m", "dvc", "remote", "add", "-d", "store", str(workdir / "remote")],
        ["git", "add", "presets/soak.yaml", ".dvc/config"],
        [
            "git",
            "-c",
            "user.name=soak",
            "-c",
            "user.email=soak@localhost",
            "commit",
            "-qm",
            "the soak preset and a DVC remote",
        ],
        ["git", "config", "user.name", "soak"],
        ["git", "config", "user.email", "soak@localhost"],
    ):
        subprocess.run(cmd, cwd=project, check=True)
    return project, fs, mounted


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", type=Path, required=True, help="a new folder for everything")
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault-rate", type=float, default=1 / 3)
    ap.add_argument("--pairs", type=int, default=4000, help="train pairs per snapshot")
    ap.add_argument("--steps", type=int, default=40, help="training steps per cycle")
    ap.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"the kinds to inject (default {','.join(FAULTS)})",
    )
    ap.add_argument("--fs-mb", type=int, default=3000, help="size of the project's tmpfs")
    ap.add_argument("--cycle-timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    if args.workdir.exists():
        sys.exit(f"error: {args.workdir} exists; give a new folder")
    kinds = tuple(args.faults.split(","))
    if unknown := set(kinds) - set(FAULTS):
        sys.exit(f"error: unknown fault kinds {sorted(unknown)} (known: {', '.join(FAULTS)})")
    rng = random.Random(args.seed)
    (home := args.workdir / "prefect").mkdir(parents=True)
    server, env = start_server(home)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Corpus)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    project, fs, mounted = setup(args.workdir, url, args.fs_mb, args.steps)
    faults = kinds if mounted else tuple(f for f in kinds if f != "full")
    os.environ.update({k: v for k, v in env.items() if k.startswith(("PREFECT_", "DVC_"))})
    params_before = (project / "params.yaml").read_bytes()
    ws = project / ".dvc/tmp/flows/workspace"
    sup = Supervisor(project, env, args.workdir)
    rows, champions = [], []
    schedule = plan(args.cycles, faults, args.fault_rate, rng)
    print("faults by cycle:", json.dumps(schedule), flush=True)
    try:
        sup.ready()
        for cycle in range(1, args.cycles + 1):
            rows.append(one_cycle(cycle, args, rng, schedule[cycle - 1], sup, ws, fs, project))
            champions.append(rows[-1]["champion_bleu"])
            print(json.dumps(rows[-1]), flush=True)
    finally:
        sup.stop()
        report = checks(rows, champions, project, ws, params_before, sup, mounted)
        report["faults_planned"], report["fault_kinds"] = schedule, faults
        drawn = {r["fault"] for r in rows}
        report["checks"]["every fault kind drawn"] = set(faults) <= drawn
        report["ok"] = all(report["checks"].values())
        (args.workdir / "soak.json").write_text(json.dumps(report, indent=1, default=str))
        print_table(report)
        httpd.shutdown()
        os.killpg(server.pid, 2)
        server.wait(60)
        if mounted:
            subprocess.run(["umount", "-l", str(fs)], check=False)
    sys.exit(0 if report["ok"] else 1)


def one_cycle(cycle, args, rng, fault, sup, ws, fs, project) -> dict:
    from prefect.deployments import run_deployment

    from flows import registry

    Corpus.files = snapshot(cycle, args.pairs)
    log: list[str] = []
    struck: dict = {}  # the moment a fault hit the train stage, and the step it had reached
    params, at = {}, soak_train.draw(rng, args.steps, save_every(args.steps))
    if fault == "divergence":  # this run's recipe injects it
        params = {"overrides": [f"train.inject_divergence_at={at}"]}
        log.append(f"train.inject_divergence_at={at}: the update of step {at} turns NaN")
    t0, since = time.monotonic(), time.time()
    fr = run_deployment("retrain/retrain", parameters=params, timeout=0)
    injector = threading.Thread(
        target=inject, args=(fault, sup, ws, fs, rng, log, since, at, struck), daemon=True
    )
    if fault:
        injector.start()
    final = wait_final(str(fr.id), args.cycle_timeout)
    if fault:  # a fault outlasting its cycle (a disk still full) must not fail the next one
        injector.join(timeout=args.cycle_timeout)
    champion = registry.champion(project)
    return {
        "cycle": cycle,
        "fault": fault,
        "fault_log": log,
        "state": final.state.type.value,
        "message": (final.state.message or "")[:300],
        "attempts": final.run_count,
        "seconds": round(time.monotonic() - t0, 1),
        "champion": champion and champion.get("version"),
        "champion_bleu": champion and champion.get("bleu"),
        "run": str(fr.id),
        "train": soak_train.outcome(str(fr.id), ws, since, struck),
    }


def checks(rows, champions, project, ws, params_before, sup, mounted) -> dict:
    """What an unattended run must leave behind, each check named."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState
    from prefect.client.schemas.filters import FlowRunFilterStateType as Types

    with get_client(sync_client=True) as c:
        open_runs = [
            r
            for r in c.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=Types(any_=["RUNNING", "PENDING", "SCHEDULED"]))
                )
            )
            if not r.auto_scheduled
        ]
    bleus = [b for b in champions if b is not None]
    (project / ".dvc/tmp").mkdir(parents=True, exist_ok=True)
    with open(project / ".dvc/tmp/flows.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock_free = True
        except BlockingIOError:
            lock_free = False
    rwlock = ws / ".dvc/tmp/rwlock"
    leftovers = [
        str(p)
        for p in (
            *ws.glob("data/.*.tmp"),
            *ws.glob("data/**/.*.tmp"),
            *project.glob(".dvc/tmp/exps/tmp*"),
        )
    ]
    named = [
        r
        for r in rows
        if r["state"] != "COMPLETED"
        and "failed" not in r["message"]
        and "giving up" not in r["message"]
    ]
    results = {
        "no run left open": not open_runs,
        "every cycle Completed or Failed with a named cause": not named
        and all(r["state"] in ("COMPLETED", "FAILED") for r in rows),
        "the champion's BLEU never fell": all(a <= b for a, b in itertools.pairwise(bleus)),
        "the workspace lock is free": lock_free,
        "no DVC lock held": not rwlock.exists()
        or not any(json.loads(rwlock.read_text() or "{}").get(mode) for mode in ("read", "write")),
        "no temporary folder left": not leftovers,
        "no stage process left": not stage_running(ws),
        **soak_train.checks(rows),
        "the checkout unchanged": (project / "params.yaml").read_bytes() == params_before
        and subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=project,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        == "",
    }
    return {
        "ok": all(results.values()),
        "checks": results,
        "cycles": rows,
        "serve_starts": sup.starts,
        "corpus_requests": Corpus.served,
        "open_runs": [str(r.id) for r in open_runs],
        "leftovers": leftovers,
        "rwlock": rwlock.read_text() if rwlock.exists() else None,
        "disk_full_tested": mounted,
    }


def print_table(report: dict) -> None:
    print("\n| cycle | fault | final state | attempts | seconds | champion (BLEU) |")
    print("|---|---|---|---|---|---|")
    for r in report["cycles"]:
        print(
            f"| {r['cycle']} | {r['fault'] or ''} | {r['state']} | {r['attempts']} | "
            f"{r['seconds']:.0f} | {r['champion']} ({r['champion_bleu']}) |"
        )
    done = [r for r in report["cycles"] if r["state"] == "COMPLETED"]
    print(
        f"\n{len(done)} of {len(report['cycles'])} cycles Completed; serve started "
        f"{report['serve_starts']} times; corpus requests {report['corpus_requests']}"
    )
    print("\n| fault | cycles | Completed | Failed | other | attempts | updates redone |")
    print("|---|---|---|---|---|---|---|")
    for kind in (None, *report["fault_kinds"]):
        got = [r for r in report["cycles"] if r["fault"] == kind]
        states = [r["state"] for r in got]
        other = len(states) - states.count("COMPLETED") - states.count("FAILED")
        # per cycle, where known: a fault that hit the train stage and its resume, or a rewind
        lost = ", ".join(str(r["train"]["redone"]) for r in got if r["train"]["redone"] is not None)
        print(
            f"| {kind or 'none'} | {len(got)} | {states.count('COMPLETED')} | "
            f"{states.count('FAILED')} | {other} | {sorted({r['attempts'] for r in got})} | "
            f"{lost or '-'} |"
        )
    for name, ok in report["checks"].items():
        print(f"  [{'ok' if ok else 'FAILED'}] {name}")


if __name__ == "__main__":
    main()
