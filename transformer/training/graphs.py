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

Graphs holds no reference to its Learner (the update comes with each step): a dropped Learner
is freed at once with its graphs and their pool, without waiting for a garbage collection.

Not captured (learner.py runs them eagerly): a CPU; fp16 (GradScaler's skipped steps); several
processes (DDP's hooks and NCCL under capture need its static-graph mode, NCCL's async error
handling off, 11 eager warm-up updates and DDP built on the side stream: not measured here, so
not done).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from transformer.data.batches import Batch

WARMUP = 2  # eager updates of a shape before its capture
# After a failed replay the train stage exits REPLAY_FAILED, saving nothing (the CUDA context may
# be unusable); launch.py starts it afresh with --resume, from the newest checkpoint, and the
# shapes in EAGER_FILE (beside the checkpoints: moved aside with them) run eagerly: the failed
# one, or every shape ("all") once a second replay has failed.
REPLAY_FAILED = 76
EAGER_FILE = "eager_shapes.json"
ALL = "all"
Update = Callable[[list[Batch], None], None]  # Learner.update on device batches


class ReplayFailed(RuntimeError):
    """A replay raised: on CUDA such an error is sticky (the context is unusable), so the
    process ends; its run resumes from its newest checkpoint (train.graphs/compile are
    resume-free: `train.graphs: off` continues the same run eagerly)."""

    def __init__(self, key: tuple, error: BaseException):
        super().__init__(
            f"train.graphs: the replay of batch shape {list(key)} failed "
            f"({type(error).__name__}: {error}); the run resumes from its newest checkpoint "
            "(python -m transformer.launch restarts it: --resume), that shape eagerly; "
            "`train.graphs: off` runs every shape eagerly"
        )
        self.key = key


def _shape(key: list) -> tuple:
    return tuple(tuple(k) for k in key)


def _kept(ckpt_dir: Path) -> list | str:
    try:
        return json.loads((Path(ckpt_dir) / EAGER_FILE).read_text())
    except FileNotFoundError:
        return []


def failed_before(ckpt_dir: Path) -> set[tuple] | None:
    """The batch shapes whose replay failed in this run's earlier processes (EAGER_FILE), to run
    eagerly; None: every shape (train.graphs off for the rest of the run)."""
    kept = _kept(ckpt_dir)
    if kept == ALL:
        print(f"train.graphs: eager update, as replays failed twice ({ckpt_dir}/{EAGER_FILE})")
        return None
    if kept:
        print(f"train.graphs: batch shape(s) {kept} run eagerly, as their replay failed before")
    return {_shape(k) for k in kept}


def record_failure(ckpt_dir: Path, key: tuple) -> str:
    """Add the shape whose replay failed to EAGER_FILE (every shape if one had failed before);
    what the resumed run will run eagerly, in words."""
    path = Path(ckpt_dir) / EAGER_FILE
    kept = ALL if _kept(ckpt_dir) else [list(map(list, key))]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept) + "\n")
    tmp.replace(path)
    return "every batch shape" if kept == ALL else f"batch shape {list(key)}"


class Graphs:
    """The captured updates of a Learner, by the shapes of the update's micro-batches.

    step() is the bookkeeping; the methods after it are the CUDA parts (a seam:
    tests/test_learner.py runs the bookkeeping on a CPU with them replaced)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seen: dict[tuple, int] = {}
        self.graphs: dict[tuple, tuple[Callable[[], None], list[Batch]]] = {}
        self.capture_s = 0.0  # host seconds spent capturing, for the record
        # shapes whose capture failed: eager from then on (train/eager_shapes in the metrics)
        self.eager: set[tuple] = set()
        self.stream, self.pool = self.side_stream_and_pool()

    def step(self, update: Update, batches: list[Batch]) -> None:
        """The update on `batches` (on the host): replayed, captured, or eager (warm-up)."""
        key = tuple(tuple(b.src.shape) + tuple(b.tgt_in.shape) for b in batches)
        if key in self.graphs:
            replay, inputs = self.graphs[key]
            self.load(inputs, batches)  # into the buffers the graph reads: never rebound
            try:
                replay()
            except RuntimeError as e:
                raise ReplayFailed(key, e) from e
            return
        self.seen[key] = self.seen.get(key, 0) + 1
        inputs = self.buffers(batches)
        self.load(inputs, batches)
        if self.seen[key] <= WARMUP or key in self.eager:
            self.warm(update, inputs)
            return
        t0 = time.perf_counter()
        try:
            replay = self.capture(update, inputs)
        except RuntimeError as e:  # a capture records without running: nothing was updated
            self.eager.add(key)
            print(
                f"train.graphs: capturing the update of batch shape {list(key)} failed "
                f"({type(e).__name__}: {e}); that shape runs eagerly from now on "
                "(`train.graphs: off` runs every shape eagerly, resuming from the checkpoints)",
                flush=True,
            )
            self.warm(update, inputs)  # the same update, eagerly, on the same batches
            return
        self.capture_s += time.perf_counter() - t0
        self.graphs[key] = (replay, inputs)
        try:
            replay()  # a capture records the update; the replay runs it
        except RuntimeError as e:
            raise ReplayFailed(key, e) from e

    def invalidate(self) -> None:
        """Every graph dropped (a restore replaced tensors they read: Learner.load_state), with
        its pool; each shape is captured afresh after its warm-ups. Shapes in `eager` stay so."""
        self.graphs.clear()
        self.seen.clear()
        self.stream, self.pool = self.side_stream_and_pool()

    def side_stream_and_pool(self):
        """The stream of warm-ups and captures, and the graphs' shared memory pool."""
        return torch.cuda.Stream(self.device), torch.cuda.graph_pool_handle()

    def buffers(self, batches: list[Batch]) -> list[Batch]:
        """Device tensors of the batches' shapes: a graph's inputs, kept for its replays."""
        return [Batch(*(torch.empty_like(t, device=self.device) for t in b)) for b in batches]

    def load(self, inputs: list[Batch], batches: list[Batch]) -> None:
        """The host batches into the graph's input buffers, from pinned memory (no host wait)."""
        for dst, src in zip(inputs, batches):
            for d, s in zip(dst, src):
                d.copy_(s.pin_memory(), non_blocking=True)

    def warm(self, update: Update, inputs: list[Batch]) -> None:
        """The update eagerly, on the capture's side stream."""
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            update(inputs, None)
        current.wait_stream(self.stream)

    def capture(self, update: Update, inputs: list[Batch]) -> Callable[[], None]:
        """The update captured (not run) into a graph of the shared pool; its replay (which
        holds the graph's kernels and memory, not the update's Learner)."""
        graph = torch.cuda.CUDAGraph()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            update(inputs, None)
        return graph.replay
