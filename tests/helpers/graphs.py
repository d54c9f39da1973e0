"""The Learner's captured path on a CPU: graphs.py's bookkeeping with its CUDA parts replaced
(test_learner.py, test_ema.py)."""

from __future__ import annotations

import weakref

import torch

from helpers.static import MODEL, V
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.training import graphs
from transformer.training.learner import Learner


class CpuGraphs(graphs.Graphs):
    """graphs.Graphs with its CUDA parts on the CPU: a warm-up runs the update, a capture runs
    nothing and returns a replay that reruns the update on the buffers it was captured with (a
    graph's kernels read those addresses), holding the update weakly (a CUDA graph holds
    kernels and memory, not the Learner)."""

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []
        super().__init__(torch.device("cpu"))

    def side_stream_and_pool(self):
        return None, None

    def load(self, inputs, batches):
        for dst, src in zip(inputs, batches):
            for d, s in zip(dst, src):
                d.copy_(s)

    def warm(self, update, inputs):
        self.calls.append(("warm", inputs[0].src.shape))
        update(inputs, None)

    def capture(self, update, inputs):
        self.calls.append(("capture", inputs[0].src.shape))
        weak = weakref.WeakMethod(update)

        def replay():
            self.calls.append(("replay", inputs[0].src.shape))
            weak()(inputs, None)

        return replay


def cpu_learner(captured: bool) -> Learner:
    """fp32, no dropout, static shapes; captured: CpuGraphs in place of graphs.Graphs."""
    torch.manual_seed(0)
    le = Learner(
        ModelConfig(**MODEL), TrainConfig(), V, None, torch.device("cpu"), "fp32", static=True
    )
    if captured:  # as Learner(graphs=True) sets them on CUDA
        le.graphs, le.keep_grads, le.autocast_cache = CpuGraphs(), True, False
    return le
