"""What several benchmark scripts share: the checkout's paths and ../shared's beside it, jemalloc's
library, a package's version, and a stage's command run with its output appended to a log.
The standard library only: decode_bench's samples import it under the peers' Python."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout
SHARED = ROOT.parent / "shared"  # beside the checkout: the real data, the peers' harness
PEERS_DIR = SHARED / "bench" / "peers"
# preloaded for long runs (the README); None where it is not installed
JEMALLOC = next(iter(sorted(Path("/usr/lib").glob("*-linux-gnu/libjemalloc.so.2"))), None)


def version(module: str) -> str | None:
    """The module's __version__, or None where it is not installed."""
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def run_stage(cmd: list[str], log: Path, threads: int | None = None) -> None:
    """A stage's CLI, from the project root (the presets' data paths are relative to it), its
    command line and output appended to `log`; `threads`: its OMP_NUM_THREADS."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=True)
