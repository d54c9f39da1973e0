"""The soak's world (benchmarks/faults/soak.py): the corpus server it downloads from, the supervisor
that restarts `flows.serve`, and the faults, planned from a seed and carried out during a cycle."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

from benchmarks.faults.soak_train import TRAIN_FAULTS, hit, strike

FAULTS = ("kill", "stagekill", "http500", "drop", "corrupt", "full", *TRAIN_FAULTS)


class Corpus(BaseHTTPRequestHandler):
    """GET /NAME: the corpus files; `faults` holds how many requests still fail, and how."""

    files: ClassVar[dict[str, bytes]] = {}
    faults: ClassVar[dict[str, int]] = {"http500": 0, "drop": 0}
    served: ClassVar[dict[str, int]] = {"ok": 0, "http500": 0, "drop": 0}
    lock = threading.Lock()

    def do_GET(self) -> None:
        data = self.files.get(self.path.lstrip("/"))
        if data is None:
            self.send_error(404)
            return
        with self.lock:
            fault = next((k for k, n in self.faults.items() if n > 0), None)
            if fault:
                self.faults[fault] -= 1
            self.served[fault or "ok"] += 1
        if fault == "http500":
            self.send_error(500, "simulated outage")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hash(data) & 0xFFFFFFFF:x}"')
        self.end_headers()
        if fault == "drop":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def snapshot(cycle: int, pairs: int) -> dict[str, bytes]:
    """The corpus of cycle `cycle`: fixed valid/test, a train split that changes every cycle."""
    from transformer.core.sections.download import SyntheticConfig
    from transformer.data.synthetic import generate

    fixed = generate(SyntheticConfig(train=1, valid=200, test=200, seed=0))
    train = generate(SyntheticConfig(train=pairs, valid=1, test=1, seed=1000 + cycle))["train"]
    out = {}
    for split, rows in (("train", train), ("valid", fixed["valid"]), ("test", fixed["test"])):
        for i, lang in enumerate(("en", "de")):
            out[f"{split}.{lang}"] = "".join(r[i] + "\n" for r in rows).encode()
    return out


class Supervisor:
    """`python -m flows.serve` in the project, restarted within a second whenever it dies."""

    def __init__(self, project: Path, env: dict[str, str], logs: Path):
        self.project, self.env, self.logs = project, env, logs
        self.proc: subprocess.Popen | None = None
        self.starts, self.stopping = 0, False
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stopping:
            if self.proc is None or self.proc.poll() is not None:
                self.starts += 1
                log = open(self.logs / f"serve-{self.starts}.log", "w")  # noqa: SIM115
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "flows.serve",
                        "--retrain-preset",
                        "soak",
                        "--cron",
                        "0 0 1 1 *",
                    ],
                    cwd=self.project,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            time.sleep(1.0)

    def ready(self, timeout: float = 300.0) -> None:
        """Wait until the retrain deployment exists on the server."""
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        deadline = time.monotonic() + timeout
        with get_client(sync_client=True) as c:
            while time.monotonic() < deadline:
                with contextlib.suppress(ObjectNotFound):
                    c.read_deployment_by_name("retrain/retrain")
                    return
                time.sleep(1)
        raise TimeoutError(f"serve did not create its deployments: {self.logs}")

    def kill(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, 9)

    def stop(self) -> None:
        self.stopping = True
        self.thread.join()
        if self.proc is not None:
            from flows.shell import stop_group

            stop_group(self.proc, grace_s=60)  # SIGTERM, as systemd stops it; then SIGKILL


def plan(cycles: int, faults: tuple[str, ...], rate: float, rng: random.Random) -> list:
    """The fault of each cycle (None: none): every kind once (as many kinds as there are
    cycles), the rest of round(rate * cycles) drawn at random; kinds and cycles shuffled."""
    n = min(cycles, max(len(faults), round(rate * cycles)))
    drawn = list(faults) + [rng.choice(faults) for _ in range(n - len(faults))]
    rng.shuffle(drawn)
    out: list = [None] * cycles
    for cycle, fault in zip(sorted(rng.sample(range(cycles), n)), drawn[:n]):
        out[cycle] = fault
    return out


def stage_pids(ws: Path) -> list[tuple[float, int]]:
    """(start time, pid) of each process in the run workspace that is not DVC itself."""
    root, found = str(ws.resolve()), []
    for pid in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if not os.readlink(pid / "cwd").startswith(root):
                continue
            if b"dvc" in (pid / "cmdline").read_bytes().split(b"\0")[:3]:
                continue
            start = float((pid / "stat").read_text().rsplit(")", 1)[1].split()[19])
            found.append((start, int(pid.name)))
    return sorted(found)


def stage_name(pid: int) -> str:
    """`transformer.train` for a stage process `python -m transformer.train ...` ("" if gone)."""
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        return next((a for a in argv if a.startswith("transformer.")), argv[0].rsplit("/")[-1])
    return ""


def stage_running(ws: Path) -> bool:
    """Whether a stage process (its working directory is the run workspace) is running."""
    root = str(ws.resolve())
    for pid in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if os.readlink(pid / "cwd").startswith(root):
                return True
    return False


def inject(
    fault: str,
    sup: Supervisor,
    ws: Path,
    fs: Path,
    rng: random.Random,
    log: list[str],
    since: float,
    at: int,
    struck: dict,
) -> None:
    """Carry out `fault` during the cycle that started at time.time() `since` (a thread), a
    train fault at step `at`; into `struck`, when it hit the train stage, the moment and the
    step it had reached (hit())."""
    if fault == "divergence":  # the run's own override does it (soak.one_cycle)
        return
    if fault in ("sigterm", "rankkill"):
        struck.update(strike(fault, at, ws, rng, log))
        return
    if fault in ("http500", "drop"):
        Corpus.faults[fault] = 3
        log.append(f"{fault}: the next 3 requests")
        return
    deadline = time.monotonic() + 600
    if fault == "corrupt":
        index = ws / "data/shards/train/index.json"
        while time.monotonic() < deadline and not (
            index.exists() and index.stat().st_mtime > since
        ):
            time.sleep(0.05)
        corrupt(ws, log)
        return
    while not stage_running(ws) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(rng.uniform(1.0, 15.0))
    if fault == "kill":
        struck.update(hit(ws))
        sup.kill()
        log.append("kill -9 of the serve process")
    elif fault == "stagekill":  # at a moment a stage's own process runs (not between stages)
        while not (pids := stage_pids(ws)) and time.monotonic() < deadline:
            time.sleep(0.2)
        struck.update(hit(ws))
        with contextlib.suppress(IndexError, ProcessLookupError):
            cmd = Path(f"/proc/{pids[-1][1]}/cmdline").read_bytes().replace(b"\0", b" ")
            os.kill(pids[-1][1], 9)
            log.append(f"kill -9 of the stage process {pids[-1][1]}: {cmd.decode()[:80]}")
        if not log:
            log.append("stagekill: no stage process found")
    elif fault == "full":
        free = shutil.disk_usage(fs).free
        filler = fs / "filler"
        with open(filler, "wb") as f, contextlib.suppress(OSError):  # ENOSPC: full, as wanted
            while chunk := min(free, 1 << 24):
                f.write(b"\0" * chunk)
                free -= chunk
        struck.update(hit(ws))
        log.append(f"disk full for 20 s ({shutil.disk_usage(fs).free} bytes left) during: ")
        running = set()
        for _ in range(20):  # which stages ran while it was full: the fault's evidence
            running |= {stage_name(pid) for _, pid in stage_pids(ws)}
            time.sleep(1.0)
        filler.unlink()
        log[-1] += ", ".join(sorted(running - {""})) or "no stage process"


def corrupt(ws: Path, log: list[str]) -> None:
    shards = sorted((ws / "data/shards/train").glob("*.bin"))
    if not shards:
        log.append("corrupt: no shard yet")
        return
    victim = shards[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = os.urandom(64)
    victim.unlink()  # a new file: a link into DVC's cache must not be written through
    victim.write_bytes(bytes(data))
    log.append(f"corrupt: {victim.relative_to(ws)} overwritten")
