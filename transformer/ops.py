"""The model's element-wise hot spots: dropout and the label-smoothed loss (§5.4).

On a CPU, the non-GEMM work dominates a training step at small shapes (RESULTS.md of
../shared/bench/peers: 22-36% bf16 MFU for every peer). Two ops cost most of it:

- `F.dropout` draws one Bernoulli sample per element (about 200M/s on this CPU). `dropout` here
  cuts 16-bit lanes out of full-range int64 draws, four keep/drop decisions per random number
  (p is rounded to a multiple of 1/65536), and multiplies by a 0/1 mask in the input's dtype.
- The label-smoothed cross-entropy over a V-sized vocabulary makes about a dozen passes over
  (N, V). `label_smoothed_loss` hand-writes its backward (two (N, V) passes fewer than autograd);
  `compiled_loss` lets inductor fuse forward and backward into about one pass each.

Both draw from torch's default generator, so `torch.manual_seed` and the RNG state saved in a
checkpoint still make a run exactly reproducible.
"""

from __future__ import annotations

import torch
from torch import Tensor

PAD_ID = 0  # architecture.md; tokenizer.py holds the same constant


def keep_mask(x: Tensor, p: float) -> Tensor:
    """A tensor like x of 1s (probability 1 - p, quantised to 1/65536) and 0s, in x's dtype.

    A 0/1 mask in x's dtype, not bool: bf16 x bf16 multiplies vectorise on CPU, bool ones do not
    (about 10x slower on this CPU, as is `torch.where`).
    """
    n = x.numel()
    draws = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device)
    draws.random_(-(2**63), 2**63 - 1)  # the full 64 bits: random_() alone leaves the top bit 0
    lanes = draws.view(torch.int16)[:n].view(x.shape)  # uniform on [-32768, 32767]
    return torch.ge(lanes, -32768 + round(p * 65536), out=torch.empty_like(x))


def dropout(x: Tensor, p: float, training: bool, relu: bool = False) -> Tensor:
    """Inverted dropout, optionally of relu(x); the same distribution as F.dropout."""
    if relu:
        x = torch.relu(x)
    if not training or p == 0.0:
        return x
    # scaled apart from the mask: 1/(1-p) in bf16 would bias every kept value the same way
    return (x * keep_mask(x, p)).mul_(1.0 / (1.0 - p))


def label_smoothed_loss(logits: Tensor, target: Tensor, eps: float,
                        pad_id: int = PAD_ID) -> tuple[Tensor, Tensor]:
    """§5.4 label smoothing: (loss_sum, nll_sum) over targets != pad_id.

    loss = (1-eps)·nll + eps·mean_v(-log p_v), i.e. cross-entropy against (1-eps)·onehot + eps/V,
    as F.cross_entropy(label_smoothing=eps). Computed from logsumexp without a (N, V) log-prob
    tensor.
    """
    logits = logits.reshape(-1, logits.size(-1))  # (N, V)
    target = target.reshape(-1)
    keep = target.ne(pad_id)
    if not bool(keep.all()):
        logits, target = logits[keep], target[keep]
    return _SmoothedCE.apply(logits, target, eps)


class _SmoothedCE(torch.autograd.Function):
    """Label-smoothed cross-entropy with a hand-written backward: softmax - smoothed one-hot.

    Autograd of the plain formula keeps several (N, V) fp32 temporaries; this keeps the logits
    and the (N,) logsumexp only, and computes in fp32 chunk by chunk (bf16 logits stay bf16).
    """

    CHUNK = 2048  # rows at a time: bounds the fp32 working set on a 32k vocabulary

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float):
        lse = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
        mean = torch.empty_like(lse)
        for i in range(0, logits.size(0), _SmoothedCE.CHUNK):
            x = logits[i:i + _SmoothedCE.CHUNK].float()  # (n, V)
            lse[i:i + x.size(0)] = torch.logsumexp(x, dim=-1)
            mean[i:i + x.size(0)] = x.mean(dim=-1)
        nll = lse - logits.gather(1, target[:, None]).squeeze(1).float()
        loss = (1.0 - eps) * nll + eps * (lse - mean)  # -mean_v log p_v = lse - mean_v logit_v
        ctx.save_for_backward(logits, target, lse)
        ctx.eps = eps
        return loss.sum(), nll.sum()

    @staticmethod
    def backward(ctx, g_loss: Tensor, g_nll: Tensor):
        logits, target, lse = ctx.saved_tensors
        eps, V = ctx.eps, logits.size(1)
        grad = torch.empty_like(logits)
        rows = torch.arange(logits.size(0), device=logits.device)
        # d/dlogit: g_loss·(softmax - (1-eps)·onehot - eps/V) + g_nll·(softmax - onehot)
        for i in range(0, logits.size(0), _SmoothedCE.CHUNK):
            j = i + _SmoothedCE.CHUNK
            p = torch.exp(logits[i:j].float() - lse[i:j, None])  # (n, V) softmax
            p.mul_(g_loss + g_nll).sub_(g_loss * eps / V)
            r, t = rows[i:j] - i, target[i:j]
            p[r, t] -= g_loss * (1.0 - eps) + g_nll
            grad[i:j] = p
        return grad, None, None


def _smoothed_ce_formula(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The same (loss_sum, nll_sum) as the plain formula, for inductor to fuse (no pad rows)."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
    nll = -logp.gather(1, target[:, None]).squeeze(1)
    return ((1.0 - eps) * nll - eps * logp.mean(dim=-1)).sum(), nll.sum()


_compiled = None


def compiled_loss(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """`label_smoothed_loss` through torch.compile: ~2.5x faster on CPU, ~20 s to compile once.

    `target` must hold no padding (Transformer.loss drops pad rows before the V-sized GEMM).
    """
    global _compiled
    if _compiled is None:  # dynamic: one graph for every batch size N
        _compiled = torch.compile(_smoothed_ce_formula, dynamic=True)
    return _compiled(logits, target, eps)
