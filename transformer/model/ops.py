"""The model's element-wise hot spots: dropout and the label-smoothed loss (§5.4).

On a CPU, the non-GEMM work dominates a training step at small shapes (RESULTS.md of
../shared/bench/peers: 22-36% bf16 MFU for every peer). Two ops cost most of it:

- `F.dropout` draws one Bernoulli sample per element (about 200M/s on this CPU). `dropout` here
  cuts 16-bit lanes out of full-range int64 draws, four keep/drop decisions per random number
  (p is rounded to a multiple of 1/65536), and multiplies by a 0/1 mask in the input's dtype.
- The output projection and label-smoothed cross-entropy over a V-sized vocabulary: unfused,
  three (N, V) GEMMs and a dozen passes over an (N, V) tensor too big for any cache.
  `output_loss` does both a chunk of rows at a time, gradients included.

Both draw from torch's default generator, so `torch.manual_seed` and the RNG state saved in a
checkpoint still make a run exactly reproducible.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


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


# Device types whose dropout cuts its mask from random 16-bit lanes; elsewhere F.dropout. On a
# GPU, F.dropout is one fused kernel (and torch.compile traces it; random_ breaks its graph):
# benchmarks/gpu/check.py measures CUDA both ways and decides by the rule written there.
LANE_DROPOUT = {"cpu", "cuda"}


def dropout(x: Tensor, p: float, training: bool, relu: bool = False) -> Tensor:
    """Inverted dropout, optionally of relu(x); the same distribution as F.dropout."""
    if relu:
        x = torch.relu(x)
    if not training or p == 0.0:
        return x
    # compiled: F.dropout, whose mask inductor draws inside its fused kernel (random_ and the
    # int16 view of the lanes would break the graph)
    if x.device.type not in LANE_DROPOUT or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    # scaled apart from the mask: 1/(1-p) in bf16 would bias every kept value the same way
    return (x * keep_mask(x, p)).mul_(1.0 / (1.0 - p))


# _OutputCE's rows per chunk x V. CPU: 16 MB of fp32 logits (best of 64-2048 rows). GPU: 1 GiB,
# the fastest of 2^22-2^28 in benchmarks/gpu/check.py's loss section (H100: 3.1x 2^22's time at
# d_model 1024, whose ~110-row chunks are a dozen small launches each). Module constants, not
# class attributes: torch.compile reads these, and breaks its graph on the Function's own.
CHUNK_ELEMENTS_CPU = 1 << 22
CHUNK_ELEMENTS_GPU = 1 << 28


def _chunks(h, weight, target, keep, eps: float, grads: bool, chunk: int, dtype, row_nll=None):
    """(loss, nll_sum, dL/dh, dL/dW) of _OutputCE's forward, dh and dW None without grads;
    each row's NLL written into `row_nll` (N,) too, where given (a pad row's 0)."""
    with torch.autocast(h.device.type, enabled=False):
        x_in, w = h.to(dtype), weight.to(dtype)
        dh = torch.empty_like(h) if grads else None  # (N, D)
        dw = torch.zeros_like(weight, dtype=torch.float32) if grads else None  # (V, D)
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        nll_sum = torch.zeros_like(loss)
        V = w.size(0)
        rows = max(1, chunk // V)
        for i in range(0, h.size(0), rows):
            hc, t = x_in[i : i + rows], target[i : i + rows, None]  # (n, D), (n, 1)
            x = (hc @ w.t()).float()  # (n, V)
            # -mean_v log p_v = lse - mean_v logit_v; eps 0 (scoring): one pass over x fewer
            mean = x.mean(dim=-1) if eps else None
            nll = -x.gather(1, t).squeeze(1)
            m = x.amax(dim=-1, keepdim=True)
            s = x.sub_(m).exp_().sum(dim=-1, keepdim=True)  # x: exp(logit - max)
            lse = (m + s.log()).squeeze(1)
            nll += lse
            row_loss = (1.0 - eps) * nll + eps * (lse - mean) if eps else nll
            if keep is not None:  # rows of padding: weight 0 (every_position)
                k = keep[i : i + rows].to(torch.float32)
                row_loss, nll = row_loss * k, nll * k
            loss += row_loss.sum()
            nll_sum += nll.sum()
            if row_nll is not None:
                row_nll[i : i + rows] = nll
            if grads:  # d loss / d logit = softmax - (1-eps)·onehot - eps/V
                g = x.div_(s).sub_(eps / V).scatter_add_(1, t, torch.full_like(x[:, :1], eps - 1.0))
                if keep is not None:
                    g = g.mul_(k[:, None])
                g = g.to(dtype)
                dh[i : i + rows] = g @ w
                dw += g.t() @ hc  # (V, n) @ (n, D); addmm_ is no faster, and uncounted
    return loss, nll_sum, dh, dw


class _OutputCE(torch.autograd.Function):
    """The output projection and the label-smoothed cross-entropy as one op, row chunk by chunk.

    Each chunk's (n, V) logits are turned into their gradient (softmax - smoothed one-hot) while
    they are still in cache, and multiplied back into dL/dh and dL/dW at once, so no (N, V)
    tensor is ever materialised: on the 2-core CPU, 1.45x faster than F.linear + F.cross_entropy
    and 1.6x than F.linear + the inductor-compiled loss it replaced (fwd + bwd, N 1930, V 8000,
    d 256; benchmarks/cpu/loss_bench.py). The gradients are computed in forward (when asked for) and
    scaled by the incoming gradient in backward; the loss is a sum.
    """

    @staticmethod
    def forward(ctx, h, weight, target, keep, eps: float, grad_mode: bool, chunk: int, dtype):
        # needs_input_grad holds under torch.no_grad() too (validation): ask grad_mode
        grads = grad_mode and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        loss, nll_sum, dh, dw = _chunks(h, weight, target, keep, eps, grads, chunk, dtype)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(dh, dw)
        ctx.mark_non_differentiable(nll_sum)  # for logging only
        return loss, nll_sum

    @staticmethod
    def backward(ctx, g_loss: Tensor, g_nll: Tensor):
        dh, dw = ctx.saved_tensors
        out = dh * g_loss, (dw * g_loss).to(ctx.weight_dtype)
        return *out, None, None, None, None, None, None


# Under torch.compile, the same computation as an opaque custom op: dynamo would unroll the
# chunk loop, guard on the row count (rows x length of the batch) and so compile once per batch
# shape even with dynamic=True, failing at the recompile limit; opaque, the loss is one node of
# one dynamic-shape graph (tests/test_static.py counts them).
@torch.library.custom_op("transformer::output_ce", mutates_args=())
def _output_ce(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    keep: Tensor | None,
    eps: float,
    grads: bool,
    chunk: int,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    loss, nll_sum, dh, dw = _chunks(h, weight, target, keep, eps, grads, chunk, dtype)
    if not grads:  # a custom op returns tensors: empty ones stand for "none computed"
        dh, dw = h.new_empty(0), weight.new_empty(0, dtype=torch.float32)
    return loss, nll_sum, dh, dw


@_output_ce.register_fake
def _(h, weight, target, keep, eps, grads, chunk, dtype):
    loss = h.new_empty((), dtype=torch.float32)
    if not grads:
        return loss, torch.empty_like(loss), h.new_empty(0), weight.new_empty(0).float()
    return loss, torch.empty_like(loss), torch.empty_like(h), torch.empty_like(weight).float()


def _output_ce_context(ctx, inputs, output):
    ctx.weight_dtype = inputs[1].dtype
    ctx.save_for_backward(output[2], output[3])
    ctx.mark_non_differentiable(*output[1:])


def _output_ce_backward(ctx, g_loss, g_nll, g_dh, g_dw):
    dh, dw = ctx.saved_tensors
    return dh * g_loss, (dw * g_loss).to(ctx.weight_dtype), None, None, None, None, None, None


_output_ce.register_autograd(_output_ce_backward, setup_context=_output_ce_context)


def output_loss(
    h: Tensor,
    weight: Tensor,
    target: Tensor,
    eps: float,
    fused: bool = True,
    keep=None,
    row_nll: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """§5.4 label smoothing on the output projection: (loss_sum, nll_sum) of logits h @ weight.T.

    h (N, D) and target (N,) hold no padding, or keep (N,) bool says which rows count (the rest
    weigh 0); loss = (1-eps)·nll + eps·mean_v(-log p_v), i.e. F.cross_entropy(h @ weight.T,
    target, label_smoothing=eps, reduction="sum"). fused: the chunked op above; else exactly
    that F.linear + F.cross_entropy, the (N, V) logits whole. row_nll (N,): also each row's
    NLL, written there (scoring a corpus, transformer/model/crossent.py: no gradients; the
    chunked forward whatever `fused` says).
    """
    if row_nll is not None:
        if torch.is_grad_enabled():
            raise ValueError("output_loss(row_nll=...) scores: call it without gradients")
        dev = h.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        chunk = CHUNK_ELEMENTS_CPU if dev == "cpu" else CHUNK_ELEMENTS_GPU
        return _chunks(h, weight, target, keep, eps, False, chunk, dtype, row_nll)[:2]
    if fused:
        dev = h.device.type  # autocast (bf16/fp16) sets the GEMMs' dtype; reductions stay fp32
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        chunk = CHUNK_ELEMENTS_CPU if dev == "cpu" else CHUNK_ELEMENTS_GPU
        if torch.compiler.is_compiling():
            grads = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
            return _output_ce(h, weight, target, keep, eps, grads, chunk, dtype)[:2]
        return _OutputCE.apply(h, weight, target, keep, eps, torch.is_grad_enabled(), chunk, dtype)
    logits = F.linear(h, weight).float()  # (N, V); fp32 statistics under autocast, as fused
    if keep is not None:
        target = target.masked_fill(~keep, -100)  # F.cross_entropy's ignore_index
    loss = F.cross_entropy(logits, target, label_smoothing=eps, reduction="sum")
    with torch.no_grad():  # for logging only
        nll_sum = F.cross_entropy(logits, target, reduction="sum")
    return loss, nll_sum
