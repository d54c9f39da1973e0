"""Decoding speed against HF MarianMTModel.generate and CTranslate2, side by side in one run.

    python -m benchmarks.cpu.decode_bench --shape small base --beam 1 4 --rounds 2 --threads 1

Uses the peers' harness (../shared/bench/peers: run_one.py, same 256 sources of length 20-30,
exactly 40 output tokens each, one batch) with a Python that has transformers + ctranslate2
(--python, default /tmp/perf/venv/bin/python; setup in the harness README). Every sample is a
fresh process; round r rotates the peer order by r, and each ratio is the median over rounds of
(peer / hf) within a round, so background load on the shared cores hits both sides alike.
--threads 1 --metric sents_per_cpu_s is steadier when other processes share the 2 cores (OpenMP
threads otherwise wait for each other's time slices). Nothing here is asserted: it prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import PEERS_DIR, ROOT

ADAPTER = Path(__file__).resolve().parent / "decode_adapter.py"
# name -> (adapter, opts)
PEERS = {
    "hf": ("hf_marian", {}),
    "hf_bf16": ("hf_marian", {"autocast": "bf16"}),
    "ct2_f32": ("ct2_marian", {"compute_type": "float32"}),
    "ct2_int8": ("ct2_marian", {"compute_type": "int8"}),
    "ours_fp32": (str(ADAPTER), {"precision": "fp32"}),
    "ours_bf16": (str(ADAPTER), {"precision": "bf16"}),
    "ours_int8": (str(ADAPTER), {"precision": "int8"}),
}


def child(harness: Path, adapter: str, opts: dict, shape: str, beam: int, n: int) -> dict:
    """One sample in this process (run by the peers' Python): run_one.py's decode measurement,
    plus the process CPU time, which other processes on the shared cores disturb far less."""
    import time

    import torch

    sys.path.insert(0, str(harness))
    import common
    from adapters import load

    shape_d = dict(common.SHAPES[shape])
    peer = load(adapter).build(shape_d, opts)
    src = common.make_decode_sources(shape_d, n=n)
    peer.decode(src[:16], beam, 4)  # warm-up: allocations, lazy init, thread pools
    w0, c0 = time.perf_counter(), time.process_time()
    out = peer.decode(src, beam, common.DECODE_LEN)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    lens = [len(o) for o in out]
    return {
        "sents_per_s": n / wall,
        "sents_per_cpu_s": n / cpu,
        "wall_s": wall,
        "cpu_s": cpu,
        "threads": torch.get_num_threads(),
        "out_len_min": min(lens),
        "out_len_max": max(lens),
    }


def sample(args, name: str, shape: str, beam: int) -> dict:
    adapter, opts = PEERS[name]
    cmd = [
        args.python,
        __file__,
        "--child",
        json.dumps([str(args.harness), adapter, opts, shape, beam, args.n_sents]),
    ]
    env = {
        "PYTHONPATH": str(ROOT),
        "PATH": str(Path(args.python).parent) + ":/usr/bin:/bin",
        "OMP_NUM_THREADS": str(args.threads),
        "MKL_NUM_THREADS": str(args.threads),
    }
    p = subprocess.run(
        cmd,
        check=False,
        cwd=args.harness,
        capture_output=True,
        text=True,
        env=env,
        timeout=args.timeout,
    )
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (p.stderr or p.stdout)[-600:]}


def bench(args, shape: str, beam: int, out) -> None:
    peers = args.peers
    sps = {n: [] for n in peers}
    ratio = {n: [] for n in peers}
    for r in range(args.rounds):
        got = {}
        for name in peers[r % len(peers) :] + peers[: r % len(peers)]:
            res = sample(args, name, shape, beam)
            res.update(peer=name, round=r)
            out.write(json.dumps(res) + "\n")
            if "error" in res:
                print(f"  [{r}] {name}: ERROR {res['error']}", file=sys.stderr)
                continue
            got[name] = res[args.metric]
            sps[name].append(res[args.metric])
            print(
                f"  [{r}] {name}: {res['sents_per_s']:.2f} sent/s wall, "
                f"{res['sents_per_cpu_s']:.2f} per CPU-s, out len "
                f"{res['out_len_min']}-{res['out_len_max']}",
                file=sys.stderr,
            )
        for n, v in got.items():
            if "hf" in got:
                ratio[n].append(v / got["hf"])
    print(
        f"\n{shape}, beam {beam}, {args.n_sents} sentences x 40 tokens, threads {args.threads}, "
        f"rounds {args.rounds}"
    )
    print(f"{'peer':10s} {args.metric:>15s} {'min':>8s} {'max':>8s} {'x hf':>7s}")
    for n in peers:
        if sps[n]:
            rt = statistics.median(ratio[n]) if ratio[n] else float("nan")
            print(
                f"{n:10s} {statistics.median(sps[n]):15.2f} {min(sps[n]):8.2f} "
                f"{max(sps[n]):8.2f} {rt:7.2f}"
            )
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", nargs="+", default=["small", "base"], choices=["small", "base"])
    parser.add_argument("--beam", nargs="+", type=int, default=[4, 1])
    parser.add_argument(
        "--peers",
        type=lambda s: s.split(","),
        default=list(PEERS),
        help="comma list from: " + ",".join(PEERS),
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-sents", type=int, default=256)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--python", default="/tmp/perf/venv/bin/python")
    parser.add_argument("--harness", type=Path, default=PEERS_DIR)
    parser.add_argument("--out", type=Path, default=Path("/tmp/perf/out/decode_bench.jsonl"))
    parser.add_argument(
        "--metric",
        choices=("sents_per_s", "sents_per_cpu_s"),
        default="sents_per_s",
        help="wall-clock rate, or per CPU-second "
        "(steadier on busy cores; equal to wall with --threads 1 on idle cores)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(*json.loads(args.child))), flush=True)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as out:
        for shape in args.shape:
            for beam in args.beam:
                bench(args, shape, beam, out)


if __name__ == "__main__":
    main()
