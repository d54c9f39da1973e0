"""transformer/model/ops.py: the fast dropout and the fused loss agree with torch's own."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from transformer.model.ops import dropout, keep_mask, output_loss

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("lanes", [True, False])  # ops' own mask, or F.dropout (LANE_DROPOUT)
@pytest.mark.parametrize("p", [0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_rate_scale_and_gradient(p, dtype, lanes, monkeypatch):
    from transformer.model import ops

    monkeypatch.setattr(ops, "LANE_DROPOUT", {"cpu"} if lanes else set())
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


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("n", [1, 16, 37])  # one chunk, exactly one, several and a remainder
def test_output_loss_matches_cross_entropy_and_grad(n, fused, monkeypatch):
    from transformer.model import ops

    monkeypatch.setattr(ops, "CHUNK_ELEMENTS_CPU", 50 * 16)  # 16 rows: many chunks
    g = torch.Generator().manual_seed(0)
    h = torch.randn(n, 8, generator=g, requires_grad=True)
    w = torch.randn(50, 8, generator=g, requires_grad=True)
    y = torch.randint(0, 50, (n,), generator=g)
    loss, nll = output_loss(h, w, y, 0.1, fused)
    ref = F.cross_entropy(h @ w.T, y, label_smoothing=0.1, reduction="sum")
    ref_nll = F.cross_entropy(h @ w.T, y, reduction="sum")
    torch.testing.assert_close((loss, nll), (ref, ref_nll))
    assert not nll.requires_grad  # logged only
    grads = torch.autograd.grad(3.0 * loss, (h, w))
    ref_grads = torch.autograd.grad(3.0 * ref, (h, w))
    torch.testing.assert_close(grads, ref_grads, rtol=1e-4, atol=1e-5)


def test_output_loss_under_no_grad_does_only_the_forward_gemm():
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)  # parameters: requires_grad
    y = torch.randint(0, 50, (37,), generator=g)
    flops = {}
    for grad in (True, False):
        with torch.set_grad_enabled(grad), FlopCounterMode(display=False) as fc:
            loss, _ = output_loss(h, w, y, 0.1)
        flops[grad] = fc.get_total_flops()
        torch.testing.assert_close(loss.detach(), output_loss(h.detach(), w.detach(), y, 0.1)[0])
    assert flops[False] == 2 * 37 * 16 * 50 and flops[True] == 3 * flops[False]  # (validation)


@pytest.mark.parametrize("fused", [True, False])
def test_output_loss_under_bf16_autocast_keeps_fp32_grads(fused):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 50, (37,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = output_loss(h, w, y, 0.1, fused)
    loss.backward()
    ref = F.cross_entropy(h @ w.T, y, label_smoothing=0.1, reduction="sum")
    assert loss.dtype == w.grad.dtype == h.grad.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=0.0)  # bf16 GEMMs


def test_the_compiled_output_loss_is_one_graph_for_every_shape(monkeypatch):
    """torch.compile(dynamic=True, fullgraph=True) of the chunked loss: one graph for 12 row
    counts (the batch shapes' rows x length) over 2 epochs, no recompile, eager's figures. Its
    chunk loop, traced, would guard on the row count: one graph per shape, an error at the
    recompile limit (8)."""
    import torch._dynamo
    from torch._dynamo.backends.debugging import aot_eager
    from torch._dynamo.utils import counters

    from transformer.model import ops

    monkeypatch.setattr(ops, "CHUNK_ELEMENTS_CPU", 50 * 16)  # 16 rows: several chunks a shape
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    def loss_fn(h, w, y, keep):
        return output_loss(torch.tanh(h), w, y, 0.1, keep=keep)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(loss_fn, backend=backend, fullgraph=True, dynamic=True)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(50, 8, generator=g, requires_grad=True)
    try:
        for _ in range(2):
            for n in range(20, 80, 5):  # 12 row counts, each several chunks
                h = torch.randn(n, 8, generator=g, requires_grad=True)
                y, keep = torch.randint(0, 50, (n,), generator=g), torch.rand(n, generator=g) > 0.2
                got = compiled(h, w, y, keep)
                ref = loss_fn(h, w, y, keep)
                torch.testing.assert_close(got, ref)
                grads = torch.autograd.grad(got[0], (h, w))
                torch.testing.assert_close(grads, torch.autograd.grad(ref[0], (h, w)))
        assert counters["stats"]["unique_graphs"] == 1 and not counters["recompiles"]
        assert not counters["graph_break"]
    finally:
        torch._dynamo.reset()
    assert len({id(gm) for gm in graphs}) <= 2  # one graph (a restart may trace it twice)


JEMALLOC = sorted(Path("/usr/lib").glob("*-linux-gnu/libjemalloc.so.2"))
HOLD = """
import os, sys, torch
from transformer.core import allocator
if sys.argv[1] == "keep":
    assert allocator.keep_freed_memory()
page = os.sysconf("SC_PAGESIZE")
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * page >> 20  # MiB
before = rss()
x = torch.ones(64 << 18)  # 64 MiB, touched
del x
print(rss() - before)
"""


def python(code: str, env: dict[str, str], *args: str) -> str:
    """`python -c CODE ARGS` in a fresh process with `env` (an allocator preloaded): its stdout."""
    cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=ROOT).stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux allocators, /proc")
@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_keep_freed_memory_keeps_freed_blocks(allocator):
    """By default both allocators give a freed 64 MiB block back to the OS at once (glibc
    unmaps it; jemalloc purges blocks of 8 MiB and more eagerly), so every step would page-fault
    it in again. After keep_freed_memory the freed pages stay resident for reuse."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if allocator == "jemalloc":
        if not JEMALLOC:
            pytest.skip("libjemalloc.so.2 not installed (apt-get install libjemalloc2)")
        env["LD_PRELOAD"] = str(JEMALLOC[0])
    held = {mode: int(python(HOLD, env, mode)) for mode in ("default", "keep")}
    assert held["default"] < 16, held  # the 64 MiB went back to the OS
    assert held["keep"] >= 60, held


DECAYS = """
import ctypes
from transformer.core import allocator
assert allocator.keep_freed_memory()
mallctl = ctypes.CDLL(None).mallctl
def read(name, out):
    size = ctypes.c_size_t(ctypes.sizeof(out))
    assert mallctl(name.encode(), ctypes.byref(out), ctypes.byref(size), None, 0) == 0, name
    return out.value
huge = read("opt.narenas", ctypes.c_uint())
print(read("arena.0.dirty_decay_ms", ctypes.c_ssize_t()),
      read("arena.0.muzzy_decay_ms", ctypes.c_ssize_t()),
      read(f"arena.{huge}.dirty_decay_ms", ctypes.c_ssize_t()))
"""


@pytest.mark.skipif(
    not JEMALLOC, reason="libjemalloc.so.2 not installed (apt-get install libjemalloc2)"
)
def test_keep_freed_memory_still_lets_jemalloc_purge_small_blocks():
    """Only the huge-block arena stops purging; the others still purge lazily (dirty -> muzzy,
    never forced). jemalloc coalesces freed neighbours only when it purges them: with purging
    off everywhere, attention dropout's many tensor sizes fragmented the heap until a training
    run filled the machine (allocator.jemalloc_keep)."""
    env = {**os.environ, "LD_PRELOAD": str(JEMALLOC[0])}
    out = python(DECAYS, env)
    small_dirty, small_muzzy, huge = map(int, out.split())
    assert small_dirty > 0 and small_muzzy == -1 and huge == -1, out
