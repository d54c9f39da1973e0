"""A training process's memory over many updates, under each allocator setting.

    python -m benchmarks.cpu.memory_bench data/shards data/tokenizer --params params.yaml \\
        --steps 1000 --every 100

Each setting trains the same batches (the params' model, batch size, seed and threads; bf16
where `train.precision` resolves to it) in a fresh process with jemalloc preloaded, as `make
multi30k` runs the train stage:
- `keep`: `allocator.keep_freed_memory()`, what the train stage does: the huge-block arena never
  purges; in the others dirty pages decay over 10 s (and are coalesced) into lazily freed
  (MADV_FREE) ones, which are never force-purged;
- `off`: purging off in every arena (decay -1), what `keep_freed_memory()` did until
  2026-11-24: jemalloc then never coalesces freed extents either;
- `eager`: as `keep`, but the small arenas purge fully (jemalloc's muzzy decay of 0);
- `default`: jemalloc's defaults.
Prints the RSS and jemalloc's `stats.allocated` (live) and `stats.resident` every `--every`
steps, then each setting's steps/s and peak RSS against `keep`'s. `off` with
`model.attention_dropout: 0.1` in the params is the case that once filled the machine: run it
with `--steps 1000` or more, as it starts growing after several hundred updates.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import JEMALLOC
from benchmarks.cpu.multi30k_mfu import add_run_args, setup
from transformer.core import allocator

SETTINGS = ("keep", "off", "eager", "default")


def jemalloc_stat(mallctl, name: str) -> int:
    """A size_t statistic of jemalloc's, in MiB, as of a fresh `epoch`."""
    epoch = ctypes.c_uint64(1)
    mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.c_size_t(8))
    out, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
    mallctl(f"stats.{name}".encode(), ctypes.byref(out), ctypes.byref(size), None, 0)
    return out.value >> 20


def set_decay(mallctl, kinds: tuple[str, ...], ms: int, arenas: int | None = None) -> None:
    """`kinds` decay times of `ms` for the default and for the first `arenas` arenas (all)."""
    value, n = ctypes.c_ssize_t(ms), ctypes.c_uint(0)
    size = ctypes.c_size_t(ctypes.sizeof(n))
    mallctl(b"arenas.narenas", ctypes.byref(n), ctypes.byref(size), None, 0)
    for kind in kinds:
        for name in [f"arenas.{kind}_decay_ms"] + [
            f"arena.{i}.{kind}_decay_ms" for i in range(arenas or n.value)
        ]:
            mallctl(name.encode(), None, None, ctypes.byref(value), ctypes.sizeof(value))


def child(args: argparse.Namespace) -> None:
    """One setting's training loop; a JSON line per --every steps on stdout."""
    mallctl = ctypes.CDLL(None).mallctl
    if args.child == "keep":
        assert allocator.keep_freed_memory()
    elif args.child == "off":  # the old keep_freed_memory
        set_decay(mallctl, ("dirty", "muzzy"), -1)
    elif args.child == "eager":  # keep's huge arena; the small arenas purge fully
        assert allocator.keep_freed_memory()
        narenas, size = ctypes.c_uint(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_uint))
        mallctl(b"opt.narenas", ctypes.byref(narenas), ctypes.byref(size), None, 0)
        set_decay(mallctl, ("muzzy",), 0, narenas.value)
    run = setup(args.params, args.shards, args.tokenizer)
    start = time.perf_counter()
    page = os.sysconf("SC_PAGESIZE")
    for i in range(1, args.steps + 1):
        run.step(next(run.stream)[1])
        if i % args.every == 0 or i == args.steps:
            rss = int(Path("/proc/self/statm").read_text().split()[1]) * page >> 20
            print(
                json.dumps(
                    {
                        "step": i,
                        "seconds": time.perf_counter() - start,
                        "rss": rss,
                        "allocated": jemalloc_stat(mallctl, "allocated"),
                        "resident": jemalloc_stat(mallctl, "resident"),
                    }
                ),
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_run_args(ap)
    ap.add_argument("--steps", type=int, default=1000, help="training steps per setting")
    ap.add_argument("--every", type=int, default=100, help="report memory every N steps")
    ap.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if JEMALLOC is None:
        sys.exit("memory_bench: libjemalloc.so.2 not found (apt-get install libjemalloc2)")
    env = {**os.environ, "LD_PRELOAD": str(JEMALLOC)}
    rows: dict[str, list[dict]] = {}
    for setting in args.settings:  # one after another: two would share the 2 cores
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.cpu.memory_bench",  # from the same folder as this process
            str(args.shards),
            str(args.tokenizer),
            "--params",
            str(args.params),
            "--steps",
            str(args.steps),
            "--every",
            str(args.every),
            "--child",
            setting,
        ]
        rows[setting] = []
        with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
            for line in proc.stdout:
                r = json.loads(line)
                rows[setting].append(r)
                print(
                    f"{setting:>7} step {r['step']:>6}: RSS {r['rss']:>6} MiB, jemalloc "
                    f"allocated {r['allocated']:>6} / resident {r['resident']:>6} MiB, "
                    f"{r['seconds']:.0f} s",
                    flush=True,
                )
        if proc.returncode:
            sys.exit(f"memory_bench: the {setting} process failed ({proc.returncode})")
    base = "keep" if "keep" in rows else args.settings[0]
    base_peak = max(r["rss"] for r in rows[base])
    for setting, rs in rows.items():
        peak = max(r["rss"] for r in rs)
        print(
            f"{setting:>7}: {rs[-1]['step'] / rs[-1]['seconds']:.2f} steps/s, peak RSS "
            f"{peak} MiB ({peak / base_peak:.2f}x {base}'s), at the end {rs[-1]['rss']} MiB"
        )


if __name__ == "__main__":
    main()
