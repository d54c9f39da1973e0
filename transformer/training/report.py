"""What a training run reports: its progress bar, its dvclive metrics and plots (rank 0), and,
training alone on a CPU, the cores other processes take from it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tqdm import tqdm

from transformer.core import dist


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


def drop_rows_after(live_dir: Path, step: int) -> None:
    """The metrics' rows of steps after `step` removed (to be logged again)."""
    for tsv in Path(live_dir, "plots", "metrics").rglob("*.tsv"):
        lines = tsv.read_text().splitlines(keepends=True)
        col = lines[0].rstrip("\n").split("\t").index("step") if lines else 0
        keep = lines[:1] + [ln for ln in lines[1:] if int(ln.split("\t")[col]) <= step]
        tsv.write_text("".join(keep))


def open_live(live_dir: Path | None, resumed_step: int):
    """dvclive on rank 0; on resume, rows logged after the checkpoint are dropped (redone)."""
    if live_dir is None or not dist.is_main():
        return None
    from dvclive import Live

    if resumed_step:
        drop_rows_after(live_dir, resumed_step)
    return Live(str(live_dir), resume=bool(resumed_step), save_dvc_exp=False, dvcyaml=None)


class Report:
    """A run's numbers: the progress bar and dvclive (rank 0), and, alone on a CPU, a watch on the
    cores other processes take (a shared CPU explains a slow run: logged, and warned of)."""

    def __init__(
        self,
        live_dir: Path | None,
        step: int,
        total: int,
        show: bool,
        cpu: bool,
        origin: dict | None = None,
    ):
        self.bar = tqdm(
            total=total or None,
            initial=step,
            disable=not (show and dist.is_main()),
            unit="step",
            dynamic_ncols=True,
        )
        self.live, self.cpu = open_live(live_dir, step), CpuShare() if cpu else None
        if self.live is not None:  # another run's checkpoints this one went on from, if any
            self.live.summary.pop("origin", None)
            if origin:
                self.live.summary["origin"] = origin
        self.since = time.monotonic()  # training time since the last log, for tokens/s
        self.metrics: dict[str, float] = {}

    def train_metrics(self, taken: dict[str, float], lr: float, seconds: float) -> dict[str, float]:
        """The log point's train/* metrics from LossSums.take()."""
        dt, self.since = time.monotonic() - self.since, time.monotonic()
        out = {
            "train/loss": taken["train/loss"],
            "train/nll": taken["train/nll"],
            "train/lr": lr,
            "train/tokens_per_s": taken["tokens"] / dt,
            "train/seconds": seconds,
        }
        if self.cpu is not None:
            share = self.cpu.sample()
            out.update({f"train/cpu_{k}": x for k, x in share.items()})
            if (warning := self.cpu.warning(share)) is not None:
                self.bar.write(warning)
        self.bar.set_postfix(
            loss=f"{out['train/loss']:.3f}",
            lr=f"{lr:.2e}",
            tok_s=f"{out['train/tokens_per_s']:.0f}",
        )
        return out

    def pause(self) -> None:
        """Time spent since (validating) is not training throughput."""
        self.since = time.monotonic()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)
        if self.live is not None and metrics:
            self.live.step = step
            for k, x in metrics.items():
                self.live.log_metric(k, x)
            self.live.next_step()

    def rewound(self, step: int) -> None:
        """Back at `step` (rewind.py): the rows logged after it dropped, as on a resume."""
        self.bar.n = step
        self.bar.refresh()
        if self.live is not None:
            drop_rows_after(Path(self.live.dir), step)

    def close(self) -> None:
        self.bar.close()
        if self.live is not None:
            self.live.end()
