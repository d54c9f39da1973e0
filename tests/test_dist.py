"""transformer/core/dist.py: how a rank's process ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Two gloo ranks end with collectives still in flight, so that gloo's threads release their
# tensors while the process ends; rank 1 ends as a CLI's error does, with sys.exit("message").
RANKS = """
import sys
import time
from pathlib import Path
import torch
import torch.distributed as dist
from transformer.core import dist as tdist

PRINTED = Path(__file__).with_name("rank0.printed")

def main():
    dist.init_process_group("gloo")
    works = [dist.all_reduce(torch.ones(200_000), async_op=True) for _ in range(30)]
    if dist.get_rank() == 1:
        # after rank 0 has printed: else torchrun may stop rank 0 first (a loaded machine)
        while not PRINTED.exists():
            time.sleep(0.01)
        sys.exit("error: rank 1's own")
    print("rank 0 done", flush=True)
    PRINTED.touch()

tdist.run(main)
"""


@pytest.mark.slow  # torchrun with two gloo ranks
def test_a_rank_ends_with_its_own_status_while_gloo_threads_finish(tmp_path):
    """Ended by the interpreter's finalization, each such rank aborts ("terminate called
    without an active exception", SIGABRT: a gloo thread takes the GIL too late; 13 of 13
    runs); through dist.run, rank 0 exits 0 and rank 1 prints its message and exits 1."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    r = subprocess.run(
        [*cmd, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    out = r.stdout + r.stderr
    assert "terminate called" not in out and "SIGABRT" not in out, out
    assert "rank 0 done" in out and "error: rank 1's own" in out, out
    assert r.returncode == 1 and "exitcode  : 1 " in out, out  # rank 1's status, not a signal
