"""benchmarks/multi30k_mfu.py: the matmul recorder misses none of a training step's matmuls."""

import torch
from torch.utils.flop_counter import FlopCounterMode

from transformer.config import ModelConfig
from transformer.data import Batch
from transformer.model import Transformer


def test_replayed_matmuls_are_the_steps_flops(load_benchmark):
    mfu = load_benchmark("multi30k_mfu")
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2), 50).train()
    src = torch.randint(4, 50, (3, 7))
    tgt = torch.randint(4, 50, (3, 6))
    step = mfu.step_fn(model, None, 0.1, torch.float32)
    b = Batch(src, tgt, tgt)
    with FlopCounterMode(display=False) as fc:
        step(b)
    with mfu.RecordMatmuls() as rec:
        step(b)
    seconds, flops = mfu.replay(rec.calls, reps=1)
    assert len(rec.calls) > 10 and seconds > 0
    assert flops == fc.get_total_flops()  # forward and backward, every projection and attention
