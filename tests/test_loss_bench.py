"""benchmarks/cpu/loss_bench.py --step: its two training losses are the same loss, so that the
timing compares equal work."""

import torch

from transformer.core.sections.model import ModelConfig
from transformer.data.batches import Batch
from transformer.model.network import Transformer


def test_step_losses_agree_in_value_and_gradients(load_benchmark):
    bench = load_benchmark("cpu.loss_bench")
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2, dropout=0.0), 50)
    src = torch.randint(4, 50, (3, 7))
    tgt = torch.randint(4, 50, (3, 6))
    tgt[0, 4:] = 0  # padding, which both must skip
    b = Batch(src, tgt, tgt)
    results = {}
    for name, fn in bench.step_losses(model, 0.1).items():
        model.zero_grad(set_to_none=True)
        loss = fn(b)
        loss.backward()
        results[name] = (loss.detach(), [p.grad.clone() for p in model.parameters()])
    (l1, g1), (l2, g2) = results["torch"], results["ours"]
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-4)
    for a, c in zip(g1, g2):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)
