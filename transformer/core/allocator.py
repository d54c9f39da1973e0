"""The CPU allocator setting every training and decoding process makes first.

`keep_freed_memory()` keeps freed blocks for reuse (glibc malloc, or a preloaded jemalloc)
instead of returning them to the OS, where each would be page-faulted in afresh at its next use.
"""

from __future__ import annotations

import ctypes
import sys


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
    instead cost ~6% of the preset's steps in page faults (benchmarks/cpu/memory_bench.py).
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
        return (
            mallctl(
                name.encode(),
                None,
                None,
                ctypes.byref(never),
                ctypes.c_size_t(ctypes.sizeof(never)),
            )
            == 0
        )

    ok = set_never("arenas.muzzy_decay_ms")  # the default for arenas created from now on
    for i in range(narenas.value):  # an arena not yet initialized refuses: it takes the default
        set_never(f"arena.{i}.muzzy_decay_ms")
    if threshold.value == 0:
        return ok  # no huge arena: big blocks decay like the rest
    libc.free(libc.malloc(threshold.value))  # the huge arena (index opt.narenas) now exists
    return (
        ok
        and set_never(f"arena.{narenas.value}.dirty_decay_ms")
        and set_never(f"arena.{narenas.value}.muzzy_decay_ms")
    )
