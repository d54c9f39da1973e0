"""The shipped lines' retrains started together against one after the other, on this machine.

    python -m benchmarks.scale.lines_at_once --workdir /tmp/lines          # the shipped recipes
    python -m benchmarks.scale.lines_at_once --workdir /tmp/lines --steps 300   # a quick check

For each mode (one after the other, then together) a fresh clone of this checkout with a bare
git repository as origin and a local DVC remote, a Prefect server on 127.0.0.1 and `python -m
flows.serve` in the clone; then `python -m flows.run retrain/en-de --wait` and `retrain/de-en`,
one after the other or started at the same moment. `--steps N` appends `train.max_steps=N` to
each line's recipe (committed in the clone). Records each run's wall time, its exit status and
what it printed about waiting for the machine's train slot, and the 1-minute load average
before and after each mode (a figure taken above 2.5 is not to be trusted: run nothing else).
Prints a markdown table and writes WORKDIR/lines_at_once.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import yaml

from benchmarks.common import ROOT

BIN = Path(sys.executable).parent
LINES = ("en-de", "de-en")


def sh(*cmd: str, cwd: Path, env: dict | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if r.returncode:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout.strip()


def load() -> float:
    return os.getloadavg()[0]


def clone(workdir: Path, mode: str, steps: int | None) -> Path:
    """A fresh clone of this checkout's HEAD, origin a bare repository, a DVC remote."""
    project, bare = workdir / mode, workdir / f"{mode}.git"
    for p in (project, bare, workdir / f"{mode}-store"):
        shutil.rmtree(p, ignore_errors=True)
    sh("git", "clone", "-q", str(ROOT), str(project), cwd=workdir)
    sh("git", "init", "-q", "--bare", "-b", "main", str(bare), cwd=workdir)
    sh("git", "remote", "set-url", "origin", str(bare), cwd=project)
    sh(
        str(BIN / "dvc"),
        "remote",
        "add",
        "-d",
        "store",
        str(workdir / f"{mode}-store"),
        cwd=project,
    )
    if steps:
        dvc_yaml = project / "dvc.yaml"
        doc = yaml.safe_load(dvc_yaml.read_text())
        for name in LINES:
            recipe = doc["artifacts"][name]["meta"]["recipe"]
            recipe["overrides"] = [*(recipe.get("overrides") or []), f"train.max_steps={steps}"]
        dvc_yaml.write_text(yaml.safe_dump(doc, sort_keys=False))
    sh("git", "commit", "-qam", "benchmark: remotes (and steps)", cwd=project)
    sh("git", "push", "-q", "origin", "HEAD:main", cwd=project)
    return project


def server(workdir: Path) -> tuple[subprocess.Popen, dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = workdir / "prefect-home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    log = open(home / "server.log", "w")  # noqa: SIM115 (open while the server runs)
    proc = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_for(lambda: healthy(env["PREFECT_API_URL"]), 300)
    return proc, env


def healthy(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/health", timeout=2).status == 200
    except OSError:
        return False


def wait_for(check, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            sys.exit("timed out waiting for a process to start")
        time.sleep(1)


def start(project: Path, env: dict, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flows.run", f"retrain/{name}", "--wait"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, began: float) -> dict:
    out, _ = proc.communicate()
    return {
        "seconds": round(time.monotonic() - began, 1),
        "exit": proc.returncode,
        "waited_for_slot": "waiting for the cores" in out,
        "last_line": out.strip().splitlines()[-1] if out.strip() else "",
    }


def measure(workdir: Path, mode: str, steps: int | None) -> dict:
    project = clone(workdir, mode, steps)
    srv, env = server(workdir)
    log = open(workdir / f"{mode}-serve.log", "w")  # noqa: SIM115
    serve = subprocess.Popen(
        [sys.executable, "-m", "flows.serve"],
        cwd=project,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: "polling" in (workdir / f"{mode}-serve.log").read_text(), 600)
        before, began, runs = load(), time.monotonic(), {}
        if mode == "together":  # each followed in its own thread: its own end time
            procs = {n: start(project, env, n) for n in LINES}
            threads = [
                threading.Thread(target=lambda n=n, p=p: runs.__setitem__(n, finish(p, began)))
                for n, p in procs.items()
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for n in LINES:
                t = time.monotonic()
                runs[n] = finish(start(project, env, n), t)
        total = round(time.monotonic() - began, 1)
        return {
            "mode": mode,
            "runs": runs,
            "total_s": total,
            "load_before": before,
            "load_after": load(),
        }
    finally:
        serve.terminate()
        serve.wait(timeout=60)
        srv.terminate()
        srv.wait(timeout=60)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--steps", type=int, help="train.max_steps for both lines")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    found = [measure(args.workdir.resolve(), m, args.steps) for m in ("sequential", "together")]
    (args.workdir / "lines_at_once.json").write_text(json.dumps(found, indent=1))
    seq, tog = found
    print("| mode | en-de | de-en | both done | load before / after |")
    print("|---|---|---|---|---|")
    for r in found:
        cells = " | ".join(
            f"{r['runs'][n]['seconds']} s (exit {r['runs'][n]['exit']}"
            + (", waited for the slot" if r["runs"][n]["waited_for_slot"] else "")
            + ")"
            for n in LINES
        )
        print(
            f"| {r['mode']} | {cells} | {r['total_s']} s | "
            f"{r['load_before']:.2f} / {r['load_after']:.2f} |"
        )
    print(f"\ntogether / one after the other: {tog['total_s'] / seq['total_s']:.2f}x")


if __name__ == "__main__":
    main()
