"""A command measured as benchmarks/scale/wmt14_rehearsal.py measures each stage: wall time, peak
RSS (the stage's largest process and the whole tree, sampled), DVC's own time before and after
the stage's command, and the disk DVC adds beside the workspace; one markdown row per command."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent
GiB = 2**30


class Run:
    """One command, measured: wall time, peak RSS (sampled), its output lines with times."""

    def __init__(self, cmd: list[str], cwd: Path, log: Path):
        env = {
            **os.environ,
            "PATH": f"{BIN}:{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1",
            "DVC_NO_ANALYTICS": "1",
        }
        self.cmd, self.lines, self.tree_peak, self.stage_rss = cmd, [], 0, 0
        self.load = os.getloadavg()[0]
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        done = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(proc.pid, done), daemon=True)
        sampler.start()
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n")
            for line in proc.stdout:
                self.lines.append((time.monotonic() - t0, line.rstrip("\n")))
                f.write(line)
        # (not wait4's ru_maxrss: a forked child starts with this process's resident pages)
        proc.wait()
        done.set()
        sampler.join()
        self.wall, self.rc = time.monotonic() - t0, proc.returncode
        if self.rc:
            tail = "\n".join(t for _, t in self.lines[-30:])
            raise SystemExit(
                f"error: `{' '.join(cmd)}` exited with {self.rc} (log: {log}):\n{tail}"
            )

    def _sample(self, pid: int, done: threading.Event) -> None:
        """Every 0.25 s: the tree's total RSS, and each process's own; `stage_rss` is the
        largest of the processes below the command (the stage's, not DVC's own)."""
        try:
            root = psutil.Process(pid)
            while not done.wait(0.25):
                total = 0
                for p in [root, *root.children(recursive=True)]:
                    try:
                        rss = p.memory_info().rss
                    except psutil.Error:
                        continue
                    total += rss
                    if p.pid != pid:
                        self.stage_rss = max(self.stage_rss, rss)
                self.tree_peak = max(self.tree_peak, total)
        except psutil.Error:
            pass

    def at(self, text: str) -> float | None:
        """Seconds from the start to the first output line containing `text`."""
        return next((t for t, line in self.lines if text in line), None)

    def dvc_overhead(self) -> tuple[float | None, float | None]:
        """(DVC's seconds before the stage's command starts, after its last output line)."""
        start, lock = self.at("Running stage '"), self.at("Updating lock file")
        if start is None:
            return None, None
        before_lock = [
            t
            for t, line in self.lines
            if lock is not None and t < lock and "Updating lock file" not in line
        ]
        return start, (self.wall - before_lock[-1]) if before_lock else None


def inodes(root: Path) -> dict[tuple[int, int], int]:
    """{(device, inode): bytes on disk} of the files under root."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            out[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return out


def disk(project: Path) -> dict[str, int]:
    """Bytes on disk: the workspace's artifacts (data/), what .dvc holds that they do not (its
    copies and state), and the download stage's own cache (archives and extracted members)."""
    work, dvc = inodes(project / "data"), inodes(project / ".dvc")
    return {
        "workspace": sum(work.values()),
        "dvc_extra": sum(b for k, b in dvc.items() if k not in work),
        "dvc_cache": sum(inodes(project / ".dvc" / "cache").values()),
        "download_cache": sum(inodes(project / ".cache").values()),
    }


def dvc(project: Path, log: Path, *args: str) -> Run:
    return Run([str(BIN / "dvc"), *args], project, log)


def row(what: str, project: Path, log: Path, *args: str) -> dict:
    """`dvc ARGS` in the project, measured: one row of the table."""
    r = dvc(project, log, *args)
    before, after = r.dvc_overhead()
    return {
        "what": what,
        "wall_s": r.wall,
        "dvc_before_s": before,
        "dvc_after_s": after,
        "stage_rss": r.stage_rss,
        "tree_rss": r.tree_peak,
        "load": r.load,
        **disk(project),
    }


def _gib(x) -> str:
    return "" if x is None else f"{x / GiB:.2f}"


def _s(x) -> str:
    return "" if x is None else f"{x:.1f}"


def table(rows: list[dict]) -> str:
    head = (
        "| step | wall s | DVC before / after s | peak RSS GiB: stage / process tree | "
        "workspace GiB | DVC cache GiB | DVC adds GiB | download cache GiB | load |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    out = [head]
    for r in rows:
        dvc_s = f"{_s(r.get('dvc_before_s'))} / {_s(r.get('dvc_after_s'))}".strip(" /")
        rss = " / ".join(_gib(r[k]) for k in ("stage_rss", "tree_rss") if k in r)
        out.append(
            f"| {r['what']} | {_s(r['wall_s'])} | {dvc_s} | {rss} | "
            f"{_gib(r.get('workspace'))} | {_gib(r.get('dvc_cache'))} | "
            f"{_gib(r.get('dvc_extra'))} | "
            f"{_gib(r.get('download_cache'))} | {r['load']:.1f} |"
        )
    return "\n".join(out)
