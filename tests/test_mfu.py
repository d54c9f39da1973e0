"""benchmarks/cpu/multi30k_mfu.py: the matmul recorder misses none of a training step's matmuls."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from transformer.core.sections.model import ModelConfig
from transformer.data.batches import Batch
from transformer.model.network import Transformer


def tiny_step(mfu):
    """A tiny model's training step (no optimizer) and one batch for it."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2), 50).train()
    src = torch.randint(4, 50, (3, 7))
    tgt = torch.randint(4, 50, (3, 6))
    return mfu.step_fn(model, None, 0.1, torch.float32), Batch(src, tgt, tgt)


def test_replayed_matmuls_are_the_steps_flops(load_benchmark):
    mfu = load_benchmark("cpu.multi30k_mfu")
    step, b = tiny_step(mfu)
    with FlopCounterMode(display=False) as fc:
        step(b)
    steps = []
    with mfu.RecordMatmuls() as rec:
        for _ in range(2):  # replayed one step's worth at a time, as main() records them
            step(b)
            steps.append(rec.cut())
    seconds, flops = mfu.replay(steps, reps=1)
    assert len(steps[0]) > 10 and len(steps[0]) == len(steps[1]) and seconds > 0
    # forward and backward, every projection and attention, of both steps
    assert flops == 2 * fc.get_total_flops()


def test_top_ops_are_the_steps_ops_by_self_time(load_benchmark):
    mfu = load_benchmark("cpu.multi30k_mfu")
    step, b = tiny_step(mfu)
    ops, total = mfu.top_ops(step, [b, b], 10_000)  # every op
    seconds = [s for _, s, _ in ops]
    assert seconds == sorted(seconds, reverse=True)
    assert abs(sum(seconds) - total) < 1e-6 * total  # all of them add up to the total
    assert {"aten::mm", "aten::addmm"} & {name for name, _, _ in ops}  # the projections
    top, _ = mfu.top_ops(step, [b], 3)
    assert len(top) == 3
    shaped, _ = mfu.top_ops(step, [b, b], 10_000, by_shape=True)
    assert len(shaped) > len(ops)  # the same ops, split by their input shapes
    mm = [(name, calls) for name, _, calls in shaped if name.startswith("aten::mm [")]
    assert len(mm) > 1 and all(name.endswith("]") for name, _ in mm)
    assert sum(c for _, c in mm) == {n: c for n, _, c in ops}["aten::mm"]
