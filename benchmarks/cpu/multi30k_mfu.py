"""What limits a CPU training hour: the preset's training step against its own matmuls.

    python -m benchmarks.cpu.multi30k_mfu data/shards data/tokenizer --params params.yaml

In one process, with the params' model, batch size and threads:
1. times `--steps` real training steps (forward, loss, backward, Adam) on train batches;
2. counts the FLOPs those steps execute (torch's FlopCounterMode: every matmul, bmm and
   attention, padding included) and the padding of their batches;
3. records every matmul those steps run (shapes and strides) and times them alone, back to
   back on random tensors, one step's worth at a time: the time the step would take if it were
   nothing but its matmuls.
The last ratio says how much of the step is matmul at the speed this CPU's BLAS gives those
shapes: near 1, no rewrite of the rest buys many more updates an hour; only fewer FLOPs, a
faster GEMM (native bf16) or more cores can. Far below 1 (an AMX CPU's bf16 GEMMs), the rest of
the step is the limit: `--profile N` then runs the timed steps again under torch.profiler and
prints the N ops with the most self CPU time, and their share of it (`--by-shape`: each op's
input shapes apart).
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry
from tqdm import tqdm

from transformer.core import allocator, presets
from transformer.core.ids import PAD_ID
from transformer.data.batches import BatchSampler, batch_stream, load_split
from transformer.data.vocab import load_tokenizer
from transformer.model.precision import resolve_precision
from transformer.train import output_ids
from transformer.training.learner import Learner, n_targets


def step_fn(model, opt, eps, dtype):
    """Forward, loss and backward (and Adam, given opt) alone: what the FLOP and matmul counts
    replay (setup's `step` is the train stage's own update)."""

    def step(b) -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss, _ = model.loss(b.src, b.tgt_in, b.tgt_out, eps)
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)

    return step


def setup(params: Path, shards: Path, tokenizer: Path) -> SimpleNamespace:
    """The train stage's model, Adam and batches for `params`, on this CPU: mcfg, tcfg,
    precision, dtype, vocab, model, step (forward, loss, backward, Adam) and stream (of
    (position, batch), as the train stage reads them)."""
    p = presets.load_all(params)
    mcfg, tcfg = p["model"], p["train"]
    if tcfg.threads:
        torch.set_num_threads(tcfg.threads)
    precision = resolve_precision(tcfg.precision, torch.device("cpu"), "train.precision")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    vocab = load_tokenizer(tokenizer).size
    data = load_split(shards, "train")
    sampler = BatchSampler(data.src_lens, data.tgt_lens, tcfg.max_tokens, tcfg.seed)
    torch.manual_seed(tcfg.seed)
    valid = load_split(shards, "valid")  # the train stage's output set: train + valid
    cpu = torch.device("cpu")
    learner = Learner(mcfg, tcfg, vocab, output_ids(mcfg, vocab, data, valid), cpu, precision)
    learner.model.train()
    return SimpleNamespace(
        mcfg=mcfg,
        tcfg=tcfg,
        precision=precision,
        dtype=dtype,
        vocab=vocab,
        model=learner.model,
        step=lambda b: learner.step([b], float(n_targets(b)), 1e-4),  # the train stage's update
        stream=batch_stream(data, sampler),
    )


def add_run_args(ap: argparse.ArgumentParser) -> None:
    """`setup`'s inputs, as the benchmarks that train the train stage's steps take them."""
    ap.add_argument("shards", type=Path, help="a run's data/shards")
    ap.add_argument("tokenizer", type=Path, help="a run's data/tokenizer")
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))


MATMULS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
}


class RecordMatmuls(TorchDispatchMode):
    """Records every matmul a step executes: the op, and its tensors' shapes and strides."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            meta = [
                (a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args
            ]
            self.calls.append((func, meta, kwargs or {}))
        return func(*args, **(kwargs or {}))

    def cut(self) -> list[tuple]:
        """The calls recorded since the last cut (one step's, called after each step)."""
        calls, self.calls = self.calls, []
        return calls


def replay(steps: list[list[tuple]], reps: int = 3, progress: bool = False) -> tuple[float, int]:
    """The recorded matmuls alone, on random tensors of the same shapes and strides, one step's
    worth at a time (in their order, so that memory stays at one step's operands):
    (the sum over steps of the median seconds for a step's matmuls, their FLOPs). Each step's
    matmuls run 1 + `reps` times: on a 2-core fp32 host, ~4x the timed steps' own time."""

    def make(m):
        if not isinstance(m, tuple):
            return m
        shape, stride, dtype = m
        return torch.empty_strided(shape, stride, dtype=dtype).uniform_()  # 1.6x normal_'s speed

    seconds, flops = 0.0, 0
    for calls in tqdm(steps, desc="replaying the matmuls", unit="step", disable=not progress):
        prepared = [(f, [make(m) for m in meta], kw) for f, meta, kw in calls]
        for f, a, kw in prepared:  # warms caches and oneDNN's kernels
            f(*a, **kw)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            for f, a, kw in prepared:
                f(*a, **kw)
            times.append(time.perf_counter() - t)
        seconds += statistics.median(times)
        # FlopCounterMode's own formulas, on the recorded shapes: running the calls under the
        # counter costs ~2 ms of dispatch a call here
        flops += sum(
            flop_registry[f._overloadpacket](
                *[m[0] if isinstance(m, tuple) else m for m in meta], **kw
            )
            for f, meta, kw in calls
        )
    return seconds, flops


def top_ops(
    step, batches, n: int, by_shape: bool = False
) -> tuple[list[tuple[str, float, int]], float]:
    """`step` over `batches` under torch.profiler: the `n` ops with the most self CPU time as
    (name, seconds, calls), and the self CPU time of every op together. `by_shape` counts each
    op's input shapes apart (the name then ends with them): which shapes of a step's ~450
    copies cost most."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=by_shape
    ) as prof:
        for b in batches:
            step(b)
    ops = sorted(
        prof.key_averages(group_by_input_shape=by_shape),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )
    total = sum(e.self_cpu_time_total for e in ops) / 1e6
    return [
        (f"{e.key} {e.input_shapes}" if by_shape else e.key, e.self_cpu_time_total / 1e6, e.count)
        for e in ops[:n]
    ], total


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_run_args(ap)
    ap.add_argument("--steps", type=int, default=40, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps first (compile, caches)")
    ap.add_argument(
        "--reps",
        type=int,
        default=3,
        help="timed repetitions of each step's matmuls in the replay (the median)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile the timed steps and print the N ops with the most self "
        "CPU time (default: no profile)",
    )
    ap.add_argument(
        "--by-shape", action="store_true", help="with --profile: count each op's input shapes apart"
    )
    args = ap.parse_args(argv)
    if args.by_shape and not args.profile:
        ap.error("--by-shape needs --profile N")
    allocator.keep_freed_memory()  # as the train stage's process does
    run = setup(args.params, args.shards, args.tokenizer)
    mcfg, tcfg = run.mcfg, run.tcfg
    batches = [b for _, b in islice(run.stream, args.warmup + args.steps)]
    timed = batches[args.warmup :]
    for b in batches[: args.warmup]:
        run.step(b)
    t = time.perf_counter()
    for b in timed:
        run.step(b)
    seconds = time.perf_counter() - t
    tgt = sum(int(b.tgt_out.ne(PAD_ID).sum()) for b in timed)
    # printed first: the counting and the replay below take ~5x as long as the timed steps
    print(
        f"params {args.params}: d_model {mcfg.d_model}, d_ff {mcfg.d_ff}, {mcfg.n_layers}+"
        f"{mcfg.n_layers} layers, vocab {run.vocab}, max_tokens {tcfg.max_tokens}, threads "
        f"{torch.get_num_threads()}, output_vocab {mcfg.output_vocab}, {run.precision}"
    )
    print(
        f"training: {len(timed)} steps in {seconds:.1f} s = {len(timed) / seconds:.2f} steps/s,"
        f" {tgt / seconds:,.0f} target tokens/s",
        flush=True,
    )

    steps = []
    with FlopCounterMode(display=False) as fc, RecordMatmuls() as rec:  # one pass for both
        count = step_fn(run.model, None, tcfg.label_smoothing, run.dtype)
        for b in tqdm(timed, desc="counting FLOPs and matmuls", unit="step"):
            count(b)
            steps.append(rec.cut())
    run.model.zero_grad(set_to_none=True)
    flops = fc.get_total_flops()
    src = sum(int(b.src.ne(PAD_ID).sum()) for b in timed)
    src_pos = sum(b.src.numel() for b in timed)
    tgt_pos = sum(b.tgt_out.numel() for b in timed)
    achieved = flops / seconds / 1e9
    gemm_s, gemm_flops = replay(steps, args.reps, progress=True)
    print(
        f"executed: {flops / len(timed) / 1e9:.1f} GFLOP per step ({flops / tgt / 1e6:.1f} "
        f"MFLOP per target token) = {achieved:.1f} GFLOP/s"
    )
    print(
        f"padding: {100 * (1 - src / src_pos):.1f}% of source positions, "
        f"{100 * (1 - tgt / tgt_pos):.1f}% of target positions"
    )
    print(
        f"the same steps' {sum(map(len, steps))} matmuls alone ({100 * gemm_flops / flops:.0f}% of "
        f"the FLOPs): {gemm_s:.1f} s at {gemm_flops / gemm_s / 1e9:.1f} GFLOP/s"
    )
    print(f"matmuls alone / the whole step: {gemm_s / seconds:.2f} of the time")
    if args.profile:
        ops, total = top_ops(run.step, timed, args.profile, args.by_shape)
        print(
            f"profiled: {total / len(timed) * 1e3:.1f} ms of self CPU time per step; the top "
            f"{len(ops)} ops (ms per step, share, calls per step):"
        )
        for name, s, calls in ops:
            op, _, shapes = name.partition(" [") if args.by_shape else (name, "", "")
            print(
                f"  {op[:48]:<48} {s / len(timed) * 1e3:7.1f} {100 * s / total:5.1f}% "
                f"{calls / len(timed):6.0f}" + (f"  [{shapes}" if shapes else "")
            )


if __name__ == "__main__":
    main()
