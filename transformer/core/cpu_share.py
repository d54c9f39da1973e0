"""The host's CPU: the cores other processes, and the hypervisor, take from a training run."""

from __future__ import annotations

import os
import time


class CpuShare:
    """Cores that other processes, and the hypervisor (steal), took while this process ran.

    Two processes with a BLAS thread per core each do not share a 2-core machine evenly: their
    threads spin against one another, and the multi30k-en-de step ran 8x slower (1.9 -> 0.23
    steps/s) beside one decoding process. Linux (/proc/stat) only; elsewhere `sample()` is {}.
    Counts other ranks as "others" too: meant for one training process per machine.
    """

    WARN_CORES, WARN_EVERY_S = 0.5, 300.0

    def __init__(self) -> None:
        self.last, self.warned = self.read(), -float("inf")

    @staticmethod
    def read() -> tuple[float, float, float, float] | None:
        """(monotonic s, machine busy CPU s, steal CPU s, this process's CPU s)."""
        try:
            with open("/proc/stat") as f:
                ticks = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
        hz, own = os.sysconf("SC_CLK_TCK"), os.times()
        return (
            time.monotonic(),
            (user + nice + system + irq + softirq) / hz,
            steal / hz,
            own.user + own.system,
        )

    def sample(self) -> dict[str, float]:
        """{"others": cores, "steal": cores}, averaged since the last sample."""
        now, last = self.read(), self.last
        self.last = now
        if now is None or last is None or now[0] <= last[0]:
            return {}
        dt = now[0] - last[0]
        others = (now[1] - last[1]) - (now[3] - last[3])
        return {"others": max(others, 0.0) / dt, "steal": (now[2] - last[2]) / dt}

    def warning(self, share: dict[str, float]) -> str | None:
        """A line to print when others took half a core or more (at most every 5 minutes)."""
        if share.get("others", 0.0) < self.WARN_CORES or (
            time.monotonic() - self.warned < self.WARN_EVERY_S
        ):
            return None
        self.warned = time.monotonic()
        return (
            f"warning: other processes used {share['others']:.1f} of {os.cpu_count()} cores "
            "since the last log line; training that shares its cores runs several times "
            "slower (README, 'The host's speed')"
        )
