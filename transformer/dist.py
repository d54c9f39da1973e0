"""Process setup: the only module importing torch.distributed (process group, the few
collectives), the CPU allocator setting every training and decoding process uses, and a watch
on the cores other processes take from a training run.

Launched by `torchrun`, each process reads RANK / WORLD_SIZE / LOCAL_RANK from the environment
(single node: `--standalone --nproc_per_node=N`; multi-node: `--nnodes --rdzv_endpoint ...`).
Without torchrun it is one process with no process group, and every helper is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from transformer.config import ConfigError


def keep_freed_memory() -> bool:
    """Make malloc keep freed memory for reuse instead of returning it to the OS.

    A step allocates and frees the same multi-MB activations, KV caches and (N, V) logits again
    and again. Returned to the OS on free, every such block is page-faulted in afresh at its
    next use. glibc by default serves them with mmap and unmaps them on free: measured here, that
    halved decoding speed and cost ~20% of training speed. jemalloc (preloaded for long runs)
    purges blocks of 8 MiB and more at once: an 8 MiB ReLU took 5.0 ms instead of 0.19, and the
    multi30k-en-de step ran 1.15-1.35x slower (1.25 against 1.68 steps/s). `jemalloc_keep` says
    what else it keeps, and why not everything. True when set (glibc or a preloaded jemalloc on
    Linux; elsewhere a no-op).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallctl = ctypes.CDLL(None).mallctl  # exported only when jemalloc is the allocator
    except (OSError, AttributeError):
        mallctl = None
    if mallctl is not None:
        return jemalloc_keep(mallctl)
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**30))
    except (OSError, AttributeError):  # musl or another libc: keep its defaults
        return False


def jemalloc_keep(mallctl) -> bool:
    """Never purge jemalloc's huge-block arena (blocks of `opt.oversize_threshold`, 8 MiB, and
    more; by default it purges them at once), and never force-purge the lazily purged pages of
    the others: their dirty pages still decay over 10 s into muzzy ones (MADV_FREE), which the
    kernel takes back only under memory pressure and which, until it does, cost no page fault
    to reuse.

    Not purging at all (decay -1 everywhere, as this once did) also stops jemalloc coalescing
    freed neighbours: it merges dirty extents only when it purges them. With attention dropout's
    (B, h, T, S) tensors in thousands of sizes, the heap then grew without end: a 20-minute
    multi30k run went from 1.5 to 24 GB in 1,640 updates and stalled in swap, with
    `stats.allocated` flat at 0.76 GB. Purging the small arenas fully (their muzzy decay of 0)
    instead cost ~6% of the preset's steps in page faults (benchmarks/memory_bench.py).
    """
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    threshold, narenas = ctypes.c_size_t(0), ctypes.c_uint(0)
    for name, out in ((b"opt.oversize_threshold", threshold), (b"opt.narenas", narenas)):
        size = ctypes.c_size_t(ctypes.sizeof(out))
        if mallctl(name, ctypes.byref(out), ctypes.byref(size), None, ctypes.c_size_t(0)):
            return False  # a jemalloc without a huge arena (< 5.2): keep its defaults
    never = ctypes.c_ssize_t(-1)

    def set_never(name: str) -> bool:
        return mallctl(name.encode(), None, None, ctypes.byref(never),
                       ctypes.c_size_t(ctypes.sizeof(never))) == 0

    ok = set_never("arenas.muzzy_decay_ms")  # the default for arenas created from now on
    for i in range(narenas.value):  # an arena not yet initialized refuses: it takes the default
        set_never(f"arena.{i}.muzzy_decay_ms")
    if threshold.value == 0:
        return ok  # no huge arena: big blocks decay like the rest
    libc.free(libc.malloc(threshold.value))  # the huge arena (index opt.narenas) now exists
    return ok and set_never(f"arena.{narenas.value}.dirty_decay_ms") and set_never(
        f"arena.{narenas.value}.muzzy_decay_ms")


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
        return (time.monotonic(), (user + nice + system + irq + softirq) / hz, steal / hz,
                own.user + own.system)

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
                time.monotonic() - self.warned < self.WARN_EVERY_S):
            return None
        self.warned = time.monotonic()
        return (f"warning: other processes used {share['others']:.1f} of {os.cpu_count()} cores "
                "since the last log line; training that shares its cores runs several times "
                "slower (README, 'The host's speed')")


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 matrices in hardware.

    CPUs without AVX-512 BF16 or AMX (e.g. AMD Zen 3, AVX2 only) emulate bf16 GEMMs: measured
    here 0.5 GFLOP/s against 97 in fp32, so bf16 there is never worth it.
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(precision: str, device: torch.device, key: str) -> str:
    """`auto` -> bf16 where native, else fp32; an explicit bf16 without it is an error."""
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "bf16" and not native_bf16(device):
        cap = torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else device.type
        raise ConfigError(
            f"{key}: bf16 needs native bf16 matmuls (AVX-512 BF16 or AMX on a CPU); this "
            f"{device.type} has {cap}, where bf16 runs ~100x slower than fp32. Use fp32 (or int8 "
            "to decode), or auto to train (bf16 where native)")
    return precision


def init() -> tuple[int, int, torch.device]:
    """(rank, world_size, device); NCCL with one GPU per process when CUDA exists, gloo on CPU."""
    keep_freed_memory()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(minutes=30))
    return rank, world, device


def is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_dist() else 0


def world_size() -> int:
    return dist.get_world_size() if is_dist() else 1


def is_main() -> bool:
    return rank() == 0


def print0(*args: Any, **kwargs: Any) -> None:
    if is_main():
        print(*args, **kwargs, flush=True)


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """DDP when there are several processes, else the model itself."""
    if not is_dist():
        return model
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """In-place sum over processes (a no-op alone)."""
    if is_dist():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_object(obj: Any) -> list[Any]:
    """[obj of rank 0, obj of rank 1, ...]; [obj] alone."""
    if not is_dist():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if is_dist():
        dist.barrier()


def destroy() -> None:
    if is_dist():
        dist.destroy_process_group()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s obj on every rank; obj itself alone."""
    if not is_dist():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
