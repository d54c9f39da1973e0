"""What the preemption notice's per-update all-reduce costs, beside the update it follows.

    python -m transformer.launch --standalone --nproc_per_node=2 \\
        -m benchmarks.faults.preempt_flag SHARDS TOKENIZER [--params params.yaml] \\
        [--updates 5] [--blocks 7]

Blocks of real updates of the params' model (the train stage's Learner and batches, the
per-update token count's all-reduce included), alternately without and with
`preempt.Notice().agreed()` after each; rank 0 prints the median time per update of each kind.
The batches cycle through the train split (epochs roll over). docs/experiments/2026-11-27-preempt-flag.md has the figures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from transformer.core import dist, settings
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.data.batches import BatchSampler, batch_stream, load_split
from transformer.data.vocab import load_tokenizer
from transformer.training import preempt
from transformer.training.learner import Learner, n_targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("shards", type=Path)
    parser.add_argument("tokenizer", type=Path)
    parser.add_argument("--params", type=Path, default=settings.PARAMS)
    parser.add_argument("--updates", type=int, default=5, help="updates per block")
    parser.add_argument("--blocks", type=int, default=7, help="blocks of each kind, alternating")
    args = parser.parse_args()
    rank, world, device = dist.init()
    mcfg = settings.load(ModelConfig, "model", args.params)
    tcfg = settings.load(TrainConfig, "train", args.params)
    data = load_split(args.shards, "train")
    sampler = BatchSampler(data.src_lens, data.tgt_lens, tcfg.max_tokens, 1, rank, world)
    learner = Learner(mcfg, tcfg, load_tokenizer(args.tokenizer).size, None, device, "fp32")
    notice, stream = preempt.Notice(), batch_stream(data, sampler)
    times: dict[bool, list[float]] = {False: [], True: []}  # per update, without / with the flag
    for block in range(args.blocks):  # alternating, so that a drift in load hits both alike
        for flag in (False, True):
            dist.all_reduce_host(torch.zeros(1))  # the ranks start the block together
            t0 = time.perf_counter()
            for _ in range(args.updates):
                batch = next(stream)[1]
                n = dist.all_reduce_host(torch.tensor([float(n_targets(batch))])).item()
                learner.step([batch], n, 1e-4)
                if flag:
                    notice.agreed()
            if block:  # the first block warms up
                times[flag].append((time.perf_counter() - t0) / args.updates)
    without, with_flag = statistics.median(times[False]), statistics.median(times[True])
    dist.print0(
        f"{world} ranks, d_model {mcfg.d_model}, max_tokens {tcfg.max_tokens}: an update takes "
        f"{without * 1e3:.1f} ms without the flag, {with_flag * 1e3:.1f} ms with it "
        f"({with_flag / without - 1:+.1%}; medians of {args.blocks - 1} blocks of {args.updates}; "
        f"blocks without it {min(times[False]) * 1e3:.1f}-{max(times[False]) * 1e3:.1f} ms, "
        f"with it {min(times[True]) * 1e3:.1f}-{max(times[True]) * 1e3:.1f} ms)"
    )
    dist.destroy()


if __name__ == "__main__":
    dist.run(main)
