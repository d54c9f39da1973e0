"""An exponential moving average of the weights (train.ema_decay; fairseq's --ema-decay, Marian's
--exponential-smoothing): after every update, ema = decay * ema + (1 - decay) * w.

The average is kept in fp32 whatever train.precision is (the master weights are fp32 under
autocast too), on the weights' device, one tensor per parameter (tied weights once). It starts
from the weights the run starts from (fresh, or a continued retrain's parent) and is saved in
each training checkpoint as `ema` (a state dict with the model's keys), so a resume restores it
exactly. The update is one foreach lerp outside the update itself: on CUDA it runs eagerly after
a captured update's replay (graphs.py), on the same stream, so it reads the updated weights.

Validation runs on the EMA when it is on (`swapped`), and the average stage can average the
checkpoints' EMAs instead of their weights (average.weights: ema; `weights`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from transformer.model.checkpoint import CheckpointError

KEY = "ema"  # a training checkpoint's EMA weights (fp32), beside its "model"


class EMA:
    """The moving average of `model`'s parameters, in fp32."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.params = list(model.parameters())  # deduplicated: a tied weight once
        self.shadow = [p.detach().to(torch.float32, copy=True) for p in self.params]
        # each state-dict key -> its parameter's index (a tied weight has two keys, one index)
        index = {id(p): i for i, p in enumerate(self.params)}
        self.keys = {k: index[id(v)] for k, v in model.state_dict(keep_vars=True).items()}

    @torch.no_grad()
    def update(self) -> None:
        """ema += (1 - decay) * (w - ema), i.e. decay * ema + (1 - decay) * w, for every weight."""
        weights = [p.detach().float() for p in self.params]  # a no-op for fp32 weights
        torch._foreach_lerp_(self.shadow, weights, 1.0 - self.decay)

    def state_dict(self) -> dict[str, Tensor]:
        """The EMA under the model's state-dict keys (fp32), for a checkpoint."""
        return {k: self.shadow[i] for k, i in self.keys.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Tensor], path: Any = "<checkpoint>") -> None:
        """The EMA of a checkpoint, exactly; CheckpointError names a missing or odd key."""
        for k, i in self.keys.items():
            if k not in state:
                raise CheckpointError(f"{path}: {KEY}.{k} is missing")
            if tuple(state[k].shape) != tuple(self.shadow[i].shape):
                raise CheckpointError(f"{path}: {KEY}.{k} has shape {tuple(state[k].shape)}")
            self.shadow[i].copy_(state[k])

    @torch.no_grad()
    def copy_in(self, state: dict[str, Any]) -> None:
        """state["model"] into the parameters, in place (Learner.load_state's way, sans learner)."""
        for k, i in self.keys.items():
            self.params[i].copy_(state["model"][k])

    @contextlib.contextmanager
    def swapped(self, load: Callable[[dict[str, Any]], None] | None = None) -> Iterator[None]:
        """The model holds the EMA weights inside the block, its own again after, both put in
        by `load` (the train stage's: Learner.load_state, which copies in place, so a captured
        update's tensors keep their addresses; restored bit for bit)."""
        load = load or self.copy_in
        own = {k: self.params[i].detach().clone() for k, i in self.keys.items()}
        load({"model": self.state_dict()})
        try:
            yield
        finally:
            load({"model": own})


def start(model: nn.Module, decay: float, ckpt: dict | None, path: Any) -> EMA | None:
    """The run's EMA (None with decay 0): the resumed checkpoint's, else the model's weights."""
    if decay == 0:
        return None
    ema = EMA(model, decay)
    if ckpt is not None:  # a resumed training checkpoint
        if KEY not in ckpt:
            raise CheckpointError(f"{path}: no {KEY} weights to resume (train.ema_decay was 0)")
        ema.load_state_dict(ckpt[KEY], path)
    return ema


def add_to(ckpt: dict | None, ema: EMA | None) -> None:
    """The EMA into a checkpoint dict being written (rank 0's; None on the other ranks)."""
    if ckpt is not None and ema is not None:
        ckpt[KEY] = ema.state_dict()


def weights(ckpt: dict, which: str, path: Any = "<checkpoint>") -> dict[str, Tensor]:
    """A checkpoint's weights by `which`: "model" (its trained weights) or "ema" (its EMA, in
    the trained weights' dtypes: a bf16-saved model's EMA is cast as its weights were)."""
    model = ckpt["model"]
    if which == "model":
        return model
    if KEY not in ckpt:
        raise CheckpointError(
            f"{path}: no {KEY} weights (trained with train.ema_decay 0, or not a training "
            "checkpoint); use average.weights: model"
        )
    ema = ckpt[KEY]
    return {k: ema[k].to(v.dtype) if k in ema else v for k, v in model.items()}
