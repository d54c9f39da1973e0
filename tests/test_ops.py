"""transformer/ops.py: the fast dropout and the fused loss agree with torch's own."""

import pytest
import torch
import torch.nn.functional as F

from transformer import dist
from transformer.ops import compiled_loss, dropout, keep_mask, label_smoothed_loss


@pytest.mark.parametrize("p", [0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_rate_scale_and_gradient(p, dtype):
    torch.manual_seed(0)
    x = torch.ones(400, 1000, dtype=dtype, requires_grad=True)
    y = dropout(x, p, training=True)
    kept = y.ne(0)
    assert abs(1 - kept.float().mean().item() - p) < 0.005  # 400k draws: 5 sigma is ~0.003
    torch.testing.assert_close(y[kept].float().mean().item(), 1 / (1 - p), rtol=1e-2, atol=0)
    assert abs(y.float().mean().item() - 1.0) < 0.01  # unbiased, as F.dropout
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach())  # d y / d x is the same mask and scale


def test_dropout_lanes_are_independent_and_reproducible():
    """All four 16-bit lanes of each 64-bit draw drop at rate p (random_() alone would not)."""
    torch.manual_seed(1)
    m = keep_mask(torch.empty(4 * 100_000), 0.5).view(-1, 4)
    rates = 1 - m.float().mean(0)
    assert ((rates - 0.5).abs() < 0.01).all(), rates
    torch.manual_seed(1)
    assert torch.equal(keep_mask(torch.empty(4 * 100_000), 0.5).view(-1, 4), m)


def test_dropout_relu_and_eval():
    x = torch.randn(64, 64)
    torch.testing.assert_close(dropout(x, 0.2, training=False, relu=True), F.relu(x))
    assert dropout(x, 0.2, training=False) is x
    y = dropout(x, 0.2, training=True, relu=True)
    assert (y >= 0).all() and y[x <= 0].eq(0).all()


def test_compiled_loss_matches_eager_loss_and_grad():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 50, generator=g).bfloat16()
    y = torch.randint(1, 50, (37,), generator=g)
    grads = []
    for fn in (label_smoothed_loss, compiled_loss):
        xi = x.clone().requires_grad_()
        loss, nll = fn(xi, y, 0.1)
        (loss + 0.5 * nll).backward()
        grads.append((loss.detach(), nll.detach(), xi.grad.float()))
    (l1, n1, g1), (l2, n2, g2) = grads
    torch.testing.assert_close(l2, l1, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(n2, n1, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(g2, g1, rtol=1e-2, atol=1e-3)  # bf16 gradients


def test_keep_freed_memory_on_linux():
    import sys

    assert dist.keep_freed_memory() is sys.platform.startswith("linux")
