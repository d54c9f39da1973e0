"""The Learner's captured path on a CPU (graphs.py's bookkeeping with its CUDA parts replaced),
a dropped Learner freed without a garbage collection, the line it prints about its update (the
one tests/test_cuda.py looks for), and a resumed Adam that steps as this run built it."""

from __future__ import annotations

import copy
import gc
import weakref
from collections import Counter

import pytest
import torch
from helpers.graphs import CpuGraphs, cpu_learner
from helpers.static import MODEL, V, lengths, pairs
from torch import Tensor

from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.data.batches import BatchSampler, collate
from transformer.training import graphs, learner, resume
from transformer.training.learner import Learner, n_targets


def static_batches(n: int, seed: int = 3) -> list:
    s, t = lengths(n, seed=seed, longest=14)
    sampler = BatchSampler(s, t, 48, 1, static=True)
    data = pairs(s, t)
    return [collate([data[i] for i in idx], sampler.shape) for idx in sampler]


def test_graphs_warm_up_capture_on_the_third_sight_then_replay_into_the_same_buffers():
    eager, captured = cpu_learner(False), cpu_learner(True)
    batches = static_batches(40) * 4  # 4 epochs: every shape met at least 4 times
    for k, b in enumerate(batches):
        for le in (eager, captured):
            le.step([b], float(n_targets(b)), 1e-3 * (1 + k % 3))
    g = captured.graphs
    shapes = Counter(b.src.shape for b in batches)
    assert len(shapes) > 2 and len(g.graphs) == len(shapes)  # one entry per shape
    for shape, met in shapes.items():
        calls = [kind for kind, s in g.calls if s == shape]
        assert calls == ["warm"] * graphs.WARMUP + ["capture"] + ["replay"] * (met - graphs.WARMUP)
    # a replay reads the buffers it was captured with, each batch copied into them: what it
    # computes is the eager update's, batch after batch
    for (name, a), b in zip(eager.model.named_parameters(), captured.model.parameters()):
        torch.testing.assert_close(a, b, msg=name)
    torch.testing.assert_close(eager.sums, captured.sums)
    _, inputs = next(iter(g.graphs.values()))
    last = next(b for b in reversed(batches) if b.src.shape == inputs[0].src.shape)
    assert all(torch.equal(x, y) for x, y in zip(inputs[0], last))


def test_a_dropped_learner_is_freed_without_a_garbage_collection():
    # a process's first Adam imports torch modules lazily, and torch.fx.wrap, run by one of
    # them, keeps the frames that imported it (Learner.__init__'s too) in a reference cycle
    cpu_learner(True)
    gc.collect()
    gc.disable()
    try:
        le = cpu_learner(True)
        for b in static_batches(12) * 3:  # warm-ups, captures and replays
            le.step([b], float(n_targets(b)), 1e-3)
        assert le.graphs.graphs
        ref, model = weakref.ref(le), weakref.ref(le.model)
        del le
        assert ref() is None and model() is None  # no reference cycle kept them
    finally:
        gc.enable()


def test_the_update_line_is_the_one_the_gpu_tests_look_for(capsys):
    cpu_learner(False)
    out = capsys.readouterr().out
    assert f"training in fp32 on cpu: {learner.update_text(False, True)}" in out
    # tests/test_cuda.py asserts update_text(True, True) in the bf16 train stage's output
    assert learner.update_text(True, True) == (
        "captured (a CUDA graph per batch shape) update, static-shape batches"
    )


def adam(params: list[Tensor], **how) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=torch.tensor(1e-3, dtype=torch.float64), **how)


@pytest.mark.parametrize("how", [{"capturable": True}, {"fused": True}])
def test_a_resumed_adam_keeps_how_this_run_built_it(how):
    """A checkpoint of an eager run's Adam, loaded into a captured run's (capturable) or a
    fused one: the saved moments and steps, this run's flags."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    saved = adam([w])
    w.grad = torch.randn(4, 3)
    saved.step()
    state = saved.state_dict()
    now = adam([torch.nn.Parameter(w.detach().clone())], **how)
    resume.load_optimizer(now, state)
    group = now.param_groups[0]
    assert all(group[k] == v for k, v in how.items())
    got = now.state[group["params"][0]]
    torch.testing.assert_close(got["exp_avg"], saved.state[w]["exp_avg"])
    assert float(got["step"]) == 1.0
    assert state["param_groups"][0].get("capturable") is False  # the saved dict is not changed


def test_a_compiled_learner_allows_a_graph_for_every_static_shape(capsys):
    """Compiled per shape (or a dynamic graph specialised), static batches' shapes (one per
    length boundary) must not hit dynamo's recompile limit (8), which fullgraph makes an error."""
    import torch._dynamo

    from transformer.data.batches import boundaries

    mcfg = ModelConfig(**MODEL)
    shapes = len(boundaries(mcfg.max_positions))
    # torch's own patch restores the limit after (pytest's monkeypatch leaves the config broken)
    with torch._dynamo.config.patch(recompile_limit=8):
        Learner(
            mcfg, TrainConfig(), V, None, torch.device("cpu"), "fp32", static=True, compile=True,
            compile_backend="aot_eager", compile_dynamic=False,
        )  # fmt: skip
        assert torch._dynamo.config.recompile_limit == shapes + 1 > 8
    assert f"a graph per shape (recompile limit {shapes + 1}" in capsys.readouterr().out


class FailingCapture(CpuGraphs):
    """CpuGraphs whose capture of the shapes in `fail` raises, as a CUDA capture can."""

    def __init__(self, fail):
        super().__init__()
        self.fail = fail

    def capture(self, update, inputs):
        if inputs[0].src.shape in self.fail:
            self.calls.append(("capture failed", inputs[0].src.shape))
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return super().capture(update, inputs)


def test_a_failed_capture_runs_that_shape_eagerly_with_the_same_result(capsys):
    """A capture records without running: after its error the same batches run eagerly, that
    shape stays eager, the others are captured; the weights are the eager learner's."""
    eager, captured = cpu_learner(False), cpu_learner(True)
    batches = static_batches(40) * 4
    bad = batches[0].src.shape
    captured.graphs = FailingCapture({bad})
    for k, b in enumerate(batches):
        for le in (eager, captured):
            le.step([b], float(n_targets(b)), 1e-3 * (1 + k % 3))
    g = captured.graphs
    calls = [kind for kind, s in g.calls if s == bad]
    assert calls[: graphs.WARMUP + 2] == ["warm"] * graphs.WARMUP + ["capture failed", "warm"]
    key = (tuple(batches[0].src.shape) + tuple(batches[0].tgt_in.shape),)
    assert "capture" not in calls and "replay" not in calls and g.eager == {key}
    assert len(g.graphs) == len(g.seen) - 1  # every other shape captured
    for (name, a), b in zip(eager.model.named_parameters(), captured.model.parameters()):
        torch.testing.assert_close(a, b, msg=name)
    out = capsys.readouterr().out
    assert out.count("capturing the update of batch shape") == 1 and "train.graphs: off" in out


def test_a_failed_replay_ends_the_update_naming_the_shape_and_the_switch():
    le = cpu_learner(True)
    batches = static_batches(12) * 4
    for b in batches[: len(batches) // 2]:
        le.step([b], float(n_targets(b)), 1e-3)
    key, (_, inputs) = next(iter(le.graphs.graphs.items()))

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    le.graphs.graphs[key] = (broken, inputs)
    b = next(b for b in batches if b.src.shape == inputs[0].src.shape)
    with pytest.raises(graphs.ReplayFailed, match=r"replay of batch shape .* illegal memory"):
        le.step([b], float(n_targets(b)), 1e-3)


def test_load_state_restores_in_place_and_drops_the_graphs_that_read_replaced_tensors():
    """Learner.load_state, the one way state enters a learner: the weights alone (the EMA swap)
    are copied into the same parameters and every graph is kept; Adam's state (resume, rewind)
    drops the graphs, which are captured afresh after their warm-ups; a shape that fell back
    stays eager. Restored, the captured learner goes on exactly as an eager one restored alike."""
    batches = static_batches(40) * 3
    captured = cpu_learner(True)
    for b in batches:
        captured.step([b], float(n_targets(b)), 1e-3)
    g = captured.graphs
    g.eager.add(("a shape that fell back",))
    state = {
        "model": {k: v.clone() for k, v in captured.model.state_dict().items()},
        "optimizer": captured.opt.state_dict(),
    }
    state = copy.deepcopy(state)  # a checkpoint's: Adam's load_state_dict keeps its tensors
    addresses = [p.data_ptr() for p in captured.model.parameters()]
    n_graphs = len(g.graphs)
    with torch.no_grad():
        for p in captured.model.parameters():
            p.add_(1.0)
    captured.load_state({"model": state["model"]})  # weights only: in place, graphs kept
    assert len(g.graphs) == n_graphs and [p.data_ptr() for p in captured.model.parameters()] == (
        addresses
    )
    assert all(torch.equal(p, state["model"][k]) for k, p in captured.model.named_parameters())
    captured.load_state(copy.deepcopy(state))  # with Adam's: every graph dropped, recaptured
    assert g.graphs == {} and g.seen == {} and g.eager == {("a shape that fell back",)}
    assert [p.data_ptr() for p in captured.model.parameters()] == addresses
    eager = cpu_learner(False)
    eager.load_state(state)
    g.calls.clear()
    for k, b in enumerate(batches):
        for le in (eager, captured):
            le.step([b], float(n_targets(b)), 1e-3 * (1 + k % 3))
    assert [kind for kind, _ in g.calls].count("capture") == len(g.graphs) > 2
    for (name, a), b in zip(eager.model.named_parameters(), captured.model.parameters()):
        torch.testing.assert_close(a, b, msg=name)


def test_a_compile_that_cannot_build_runs_the_loss_eagerly_with_the_same_result(capsys):
    """train.compile when inductor cannot build (a backend that raises, through torch.compile's
    own backend seam): the update runs eagerly from the first micro-batch on, logged once,
    recorded as the path used, and the weights are the eager learner's."""
    import torch._dynamo

    def cannot_build(gm, example_inputs):
        raise RuntimeError("C++ compile error: cannot find cl.exe")

    torch._dynamo.reset()
    eager = cpu_learner(False)
    torch.manual_seed(0)
    compiled = Learner(
        ModelConfig(**MODEL), TrainConfig(), V, None, torch.device("cpu"), "fp32", static=True,
        compile=True, compile_backend=cannot_build,
    )  # fmt: skip
    assert compiled.path()["update"] == "compiled"
    for k, b in enumerate(static_batches(12) * 2):
        for le in (eager, compiled):
            le.step([b], float(n_targets(b)), 1e-3 * (1 + k % 3))
    for (name, a), b in zip(eager.model.named_parameters(), compiled.model.parameters()):
        torch.testing.assert_close(a, b, msg=name)
    out = capsys.readouterr().out
    assert out.count("train.compile: compiling the loss failed") == 1 and "cl.exe" in out
    assert "train.compile: false" in out and compiled.path() == {
        "update": "eager",
        "eager_shapes": 0,
    }
