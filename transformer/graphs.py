"""The update captured as CUDA graphs: one per batch shape, replayed (PyTorch's "whole-network
capture", docs/notes/cuda.html#cuda-graphs).

An eager update costs the host one launch per op (~2,500 in bf16 for the base model), which on a
GPU takes longer than the GPU's work at the presets' batch; a replayed graph is one launch.
With static-shape batches (data.BatchSampler), each shape's update runs eagerly WARMUP times
(as the real updates they are, on the capture's side stream: cuBLAS handles, autocast and the
compile happen there), then is captured with the batch it meets next and replayed from then on.
Every graph shares one memory pool and reads the same tensors, updated in place outside it:
the input buffers of its shape (copied into from pinned memory), the rate and the token scale
(learner.py); it writes the parameters, the gradients (never set to None: they live outside
the pool), Adam's state (capturable: its step count on the device) and the loss sums. Dropout
draws from the CUDA generator, whose offsets a replay advances as an eager update would.

Not captured (learner.py runs them eagerly): a CPU; fp16 (GradScaler's skipped steps); several
processes (DDP's hooks and NCCL under capture need its static-graph mode, NCCL's async error
handling off, 11 eager warm-up updates and DDP built on the side stream: not measured here, so
not done).
"""

from __future__ import annotations

import time

import torch

from transformer.data import Batch

WARMUP = 2  # eager updates of a shape before its capture


class Graphs:
    """The captured updates of a Learner, by the shapes of the update's micro-batches."""

    def __init__(self, learner):
        self.learner = learner
        self.stream = torch.cuda.Stream(learner.device)  # warm-up and every capture
        self.pool = torch.cuda.graph_pool_handle()
        self.seen: dict[tuple, int] = {}
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[Batch]]] = {}
        self.capture_s = 0.0  # host seconds spent capturing, for the record

    def step(self, batches: list[Batch]) -> None:
        """The update on `batches` (on the host): replayed, captured, or eager (warm-up)."""
        key = tuple(tuple(b.src.shape) + tuple(b.tgt_in.shape) for b in batches)
        if key in self.graphs:
            graph, inputs = self.graphs[key]
            self.load(inputs, batches)
            graph.replay()
            return
        self.seen[key] = self.seen.get(key, 0) + 1
        inputs = [
            Batch(*(torch.empty_like(t, device=self.learner.device) for t in b)) for b in batches
        ]
        self.load(inputs, batches)
        if self.seen[key] <= WARMUP:
            self.on_side_stream(lambda: self.learner.update(inputs, None))
            return
        graph, t0 = torch.cuda.CUDAGraph(), time.perf_counter()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            self.learner.update(inputs, None)
        self.capture_s += time.perf_counter() - t0
        self.graphs[key] = (graph, inputs)
        graph.replay()  # a capture records the update; the replay runs it

    def load(self, inputs: list[Batch], batches: list[Batch]) -> None:
        """The host batches into the graph's input buffers, from pinned memory (no host wait)."""
        for dst, src in zip(inputs, batches):
            for d, s in zip(dst, src):
                d.copy_(s.pin_memory(), non_blocking=True)

    def on_side_stream(self, fn) -> None:
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            fn()
        current.wait_stream(self.stream)
