"""Static-shape batches and the update as a function of tensors (data/batches.py, training/learner.py): every pair
once per epoch, exact resume, one shape per update on every rank, padded loss = unpadded loss,
filler rows finite, the tensor update = the float one, an in-place rate, and the compiled loss
(aot_eager on a CPU) = eager with no graph break and one graph per batch shape."""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import numpy as np
import pytest
import torch
from helpers.static import MODEL, V, lengths, pairs
from helpers.train import corpus, kill_and_resume, run, write_params  # noqa: F401
from torch import nn

from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import ConfigError
from transformer.data.batches import BatchSampler, boundaries, collate
from transformer.model.network import Transformer
from transformer.train import update_path
from transformer.training.learner import Learner, WithLoss, compile_model, n_targets


@pytest.mark.parametrize("world, group", [(1, 1), (2, 1), (3, 2)])
def test_static_batches_hold_every_pair_once_in_few_shapes_one_per_update(world, group):
    s, t = lengths(500)
    samplers = [
        BatchSampler(s, t, 64, 7, rank=r, world_size=world, static=True, group=group)
        for r in range(world)
    ]
    bounds = boundaries(int(np.maximum(s, t).max()))
    assert bounds[:3] == [8, 9, 10] and bounds[-1] == 29  # x1.1, at least +1, up to the longest
    every = set()
    for epoch in range(2):
        seen, shapes = Counter(), []
        for sm in samplers:
            mine = []
            for idx in sm:
                rows, L = sm.shape
                assert len(idx) <= rows and rows == 64 // L
                assert all(max(s[i], t[i]) <= L for i in idx)  # the shortest boundary that fits
                assert all(max(s[i], t[i]) > ([0] + bounds)[bounds.index(L)] for i in idx)
                seen.update(idx)
                mine.append(sm.shape)
            shapes.append(mine)
            every.update(mine)
        assert seen == Counter(range(500)), epoch  # every pair once per epoch, on one rank
        for u in range(len(shapes[0]) // group):  # an update: `group` micro-batches per rank
            assert len({sh for mine in shapes for sh in mine[u * group : (u + 1) * group]}) == 1
    stats = samplers[0].stats
    assert stats["batch_shapes"] == len(every) <= len(bounds)  # the shapes an epoch has
    assert 0.5 < stats["pad_efficiency"] <= 1.0
    dynamic = BatchSampler(s, t, 64, 7).stats
    assert dynamic["batch_shapes"] > stats["batch_shapes"]  # the point of it


def test_static_sampler_resumes_where_it_stopped():
    s, t = lengths(300, seed=1)
    a = BatchSampler(s, t, 64, 3, static=True, group=2)
    it = iter(a)
    for _ in range(5):
        next(it)
    state = a.state_dict()
    rest = [(idx, a.shape) for idx in it] + [(idx, a.shape) for idx in a]  # and the next epoch
    b = BatchSampler(s, t, 64, 3, static=True, group=2)
    b.load_state_dict(state)
    assert [(idx, b.shape) for idx in b] + [(idx, b.shape) for idx in b] == rest


def model(seed: int = 0, **over) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**MODEL, **over}), V)


@pytest.mark.parametrize("output_vocab", ["shared", "target"])
def test_padded_loss_and_gradients_equal_the_unpadded(output_vocab):
    s, t = lengths(5, seed=2, longest=12)
    data = pairs(s, t)
    if output_vocab == "target":  # the softmax over the units the targets use (and EOS)
        ids = torch.tensor(sorted({int(x) for _, tgt in data for x in tgt}))
        torch.manual_seed(0)
        m = Transformer(ModelConfig(**MODEL, output_vocab="target"), V, ids)
    else:
        m = model()
    tight, padded = collate(data), collate(data, (8, int(max(s.max(), t.max())) + 3))
    assert padded.src.shape[0] == 8  # three filler rows and three pad columns more

    def run(b, every):
        m.zero_grad()
        loss, nll = m.loss(*b, 0.1, None if every else n_targets(b), every_position=every)
        loss.backward()
        return loss, nll, [p.grad.clone() for p in m.parameters()]

    a, b = run(tight, False), run(padded, True)
    torch.testing.assert_close(a[:2], b[:2])
    torch.testing.assert_close(a[2], b[2], rtol=1e-4, atol=1e-5)  # fp32 sums in other orders
    m.fused_loss = False  # F.cross_entropy's ignore_index takes the padding out the same way
    torch.testing.assert_close(run(padded, True)[:2], a[:2])


def test_filler_rows_and_an_all_filler_batch_stay_finite():
    """A row of padding only attends to its first position: SDPA's math path (a CPU) would give
    NaN for a row with no key at all."""
    m = model(attention_dropout=0.1, dropout=0.1)  # the spelled-out attention path too
    data = pairs(*lengths(2, seed=3, longest=9))
    for batch in (collate(data, (4, 9)), collate([], (3, 9))):
        m.zero_grad()
        loss, nll = m.loss(*batch, 0.1, every_position=True)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(nll)
        assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    assert loss == 0.0  # the all-filler batch: nothing to learn


class FloatRateLearner:
    """The update as it was before tensors: a Python rate, fresh sums, grads set to None."""

    def __init__(self, tcfg: TrainConfig):
        self.model, self.cfg = model(), tcfg
        self.opt = torch.optim.Adam(
            self.model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True
        )

    def step(self, batches, n_tokens: float, lr: float):
        for g in self.opt.param_groups:
            g["lr"] = lr
        sums = torch.zeros(2, dtype=torch.float64)
        for b in batches:
            loss, nll = self.model.loss(*b, self.cfg.label_smoothing, n_targets(b))
            (loss * (1 / n_tokens)).backward()
            sums += torch.stack([loss.detach().double(), nll.detach().double()])
        nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return sums


def learner(tcfg: TrainConfig, n_layers: int = MODEL["n_layers"], **kw) -> Learner:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**MODEL, "n_layers": n_layers})
    return Learner(cfg, tcfg, V, None, torch.device("cpu"), "fp32", **kw)


def test_the_tensor_update_is_the_float_update_exactly_in_fp32():
    tcfg = TrainConfig(clip_norm=1.0, update_freq=2)
    new, old = learner(tcfg), FloatRateLearner(tcfg)
    assert isinstance(new.opt.param_groups[0]["lr"], torch.Tensor)
    s, t = lengths(12, seed=4, longest=10)
    data = pairs(s, t)
    total = torch.zeros(2, dtype=torch.float64)
    for k in range(3):
        batches = [collate(data[4 * k : 4 * k + 2]), collate(data[4 * k + 2 : 4 * k + 4])]
        n = float(sum(n_targets(b) for b in batches))
        lr = 1e-3 * (k + 1) / 3.0  # not a round number in binary
        new.step(batches, n, lr)
        total += old.step(batches, n, lr)
    for (name, a), b in zip(new.model.named_parameters(), old.model.parameters()):
        assert torch.equal(a, b), name
    torch.testing.assert_close(new.sums, total, rtol=1e-12, atol=0.0)


def test_a_rate_changed_in_place_takes_effect():
    le = learner(TrainConfig(), static=True)
    b = collate(pairs(*lengths(4, seed=5, longest=9)), (7, 9))
    before = [p.detach().clone() for p in le.model.parameters()]
    le.step([b], float(n_targets(b)), 0.0)
    assert all(torch.equal(a, p) for a, p in zip(before, le.model.parameters()))
    lr = le.opt.param_groups[0]["lr"]
    le.step([b], float(n_targets(b)), 1e-2)
    assert lr is le.lr and float(le.lr) == 1e-2  # the same tensor, a new value
    assert not all(torch.equal(a, p) for a, p in zip(before, le.model.parameters()))


@contextlib.contextmanager
def dynamo_counters():
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    try:
        yield counters
    finally:
        torch._dynamo.reset()


def test_the_compiled_update_equals_eager_with_no_graph_break():
    s, t = lengths(24, seed=6, longest=14)
    sampler = BatchSampler(s, t, 48, 1, static=True)
    data = pairs(s, t)
    batches = [collate([data[i] for i in idx], sampler.shape) for idx in sampler]
    batches = [b for b in batches if b.src.shape == batches[0].src.shape][:2]  # one compile
    tcfg = TrainConfig(clip_norm=1.0)
    with dynamo_counters() as counters:
        eager = learner(tcfg, static=True)
        compiled = learner(
            tcfg, static=True, compile=True, compile_backend="aot_eager", compile_dynamic=False
        )
        for b in batches:
            for le in (eager, compiled):
                le.step([b], float(n_targets(b)), 1e-3)
        assert not counters["graph_break"]  # and fullgraph=True makes one an error
        assert counters["stats"]["unique_graphs"] >= 1
    for a, b in zip(eager.model.parameters(), compiled.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eager.sums, compiled.sums)


@pytest.mark.slow  # torch.compile on a CPU
def test_one_compiled_graph_per_batch_shape_over_epochs():
    """Compiled per shape (dynamic=False), the loss is traced once per static shape and never
    again: nothing else in it (the batch's target count, a rate) is guarded on."""
    s, t = lengths(60, seed=7, longest=12)
    sampler = BatchSampler(s, t, 48, 1, static=True)
    data = pairs(s, t)
    # one layer: what the shapes and the loss's guards are is the same at any depth, and each
    # layer costs each trace (the compile, not the steps, is these tests' time)
    m = model(n_layers=1)
    loss_fn = compile_model(WithLoss(m), "aot_eager", dynamic=False)
    shapes = set()
    with dynamo_counters() as counters:
        for epoch in range(2):
            for idx in sampler:
                b = collate([data[i] for i in idx], sampler.shape)
                loss, _ = loss_fn(*b, 0.1, None, True)
                loss.backward()
                shapes.add(sampler.shape)
            if epoch == 0:
                first = counters["stats"]["unique_graphs"]
        assert len(shapes) == sampler.stats["batch_shapes"] > 1
        assert first == len(shapes)  # one graph per shape ...
        assert counters["stats"]["unique_graphs"] == first  # ... and none in the next epoch
        assert not counters["graph_break"]


@pytest.mark.slow
def test_the_dynamic_compiled_update_is_one_graph_over_a_dozen_shapes():
    """train.compile's default (dynamic): one graph for every static batch shape, a batch of
    each of 12+ shapes twice, where the traced chunk loop of the loss gave one per shape and an
    error at the ninth (the recompile limit, 8, under fullgraph)."""
    s, t = lengths(400, seed=8, longest=40)
    sampler = BatchSampler(s, t, 120, 1, static=True)
    data = pairs(s, t)
    one = {}  # a batch of each shape
    for idx in sampler:
        one.setdefault(sampler.shape, collate([data[i] for i in idx], sampler.shape))
    assert len(one) == sampler.stats["batch_shapes"] >= 12
    with dynamo_counters() as counters:
        le = learner(
            TrainConfig(), n_layers=1, static=True, compile=True, compile_backend="aot_eager"
        )
        for b in [*one.values()] * 2:
            le.step([b], float(n_targets(b)), 1e-3)
        assert counters["stats"]["unique_graphs"] == 1 and not counters["recompiles"]
    assert torch.isfinite(le.sums).all()


@pytest.mark.slow
def test_static_shapes_resume_exactly_and_are_reported(corpus, tmp_path):  # noqa: F811
    out = kill_and_resume(corpus, tmp_path, static_shapes="on", update_freq=2)
    assert "eager update, static-shape batches" in out
    params = write_params(tmp_path / "p.yaml", static_shapes="on", max_steps=4, log_every_steps=2)
    run(corpus, tmp_path / "ckpt", params, "--live", str(tmp_path / "live"))
    train = json.loads((tmp_path / "live" / "metrics.json").read_text())["train"]
    assert train["batch_shapes"] >= 1 and 0.3 < train["pad_efficiency"] <= 1.0


def test_the_update_path_settings():
    """auto: static shapes and graphs on CUDA (not fp16), eager on a CPU; bad values named."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # (only its type is read)
    off = {"static": False, "graphs": False, "compile": False}
    assert update_path(TrainConfig(), cpu, "fp32") == off
    assert update_path(TrainConfig(), cuda, "bf16") == {**off, "static": True, "graphs": True}
    assert update_path(TrainConfig(), cuda, "fp16") == {**off, "static": True}
    assert update_path(TrainConfig(graphs="off"), cuda, "bf16") == {**off, "static": True}
    assert update_path(TrainConfig(static_shapes="off"), cuda, "bf16") == off
    on = TrainConfig(static_shapes="on", compile=True)
    assert update_path(on, cpu, "fp32") == {**off, "static": True, "compile": True}
    for key, bad in (("static_shapes", "yes"), ("graphs", "on")):
        with pytest.raises(ConfigError, match=f"train.{key}"):
            TrainConfig(**{key: bad})


@pytest.mark.slow
def test_two_gloo_processes_train_on_static_shapes(corpus, tmp_path):  # noqa: F811
    """DDP on static shapes: runs of 2 ranks x 2 micro-batches, batches of filler rows only
    where a boundary holds fewer pairs than a run; both ranks finish with finite losses."""
    params = write_params(
        tmp_path / "p.yaml", static_shapes="on", update_freq=2, max_steps=4, log_every_steps=2
    )
    out = run(corpus, tmp_path / "ckpt", params, "--live", str(tmp_path / "live"), nproc=2)
    assert "eager update, static-shape batches" in out
    train = json.loads((tmp_path / "live" / "metrics.json").read_text())["train"]
    assert np.isfinite(train["loss"]) and train["batch_shapes"] >= 1
