"""The update (§5.3): the model, its DDP wrapper, Adam and the fp16 loss scaler, and one update
of them on a rank's micro-batches, as a function of tensors only.

Whatever changes from one update to the next is a tensor changed in place: the rate (`lr`, read
by fused Adam), the token scale world / n_tokens, the loss sums, the gradients. With batches of a
bounded set of shapes (data.BatchSampler's static mode; the loss then projects every position,
the padding weighed 0), the whole update is the same sequence of kernels on the same memory for
each shape: on CUDA, graphs.py captures it once per shape and replays it, and the model can be
compiled with torch.compile(fullgraph=True).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn

from transformer.core import dist, hardware
from transformer.core.ids import PAD_ID
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.data.batches import Batch, boundaries
from transformer.model import checkpoint
from transformer.model.network import Transformer
from transformer.training.resume import load_optimizer


class WithLoss(nn.Module):
    """The model with its loss as forward(), so that DDP hooks the whole training computation."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src, tgt_in, tgt_out, eps: float, n_targets: int | None, every: bool):
        return self.model.loss(src, tgt_in, tgt_out, eps, n_targets, every)


def n_targets(b: Batch) -> int:
    """The batch's non-pad targets, counted on the host (its tensors are still there)."""
    return int(b.tgt_out.ne(PAD_ID).sum())


def to_device(b: Batch, device: torch.device) -> Batch:
    """The batch on `device`; to a GPU from pinned memory, so that the host does not wait."""
    if device.type != "cuda":
        return b
    return Batch(*(t.pin_memory() for t in b)).to(device, non_blocking=True)


# What the train stage says about its update (tests/test_cuda.py and the GPU check read these)
CAPTURED = "captured (a CUDA graph per batch shape) update"
EAGER = "eager update"
STATIC = "static-shape batches"


def update_text(graphs: bool, static: bool) -> str:
    """The update's path as the train stage's first line says it, after "training in ...: "."""
    return f"{CAPTURED if graphs else EAGER}, {STATIC if static else 'batches of any shape'}"


def compile_model(module: nn.Module, backend: str = "inductor", dynamic: bool | None = True):
    """torch.compile of the loss, in one graph (fullgraph: a break is an error, not a slowdown);
    dynamic: one compile for every batch shape (False: one per shape)."""
    return torch.compile(module, backend=backend, fullgraph=True, dynamic=dynamic)


class Learner:
    """What an update changes, and the update itself (`step`).

    static: the batches have a bounded set of shapes (the loss projects every position).
    graphs: on CUDA, each shape's update is captured as a CUDA graph and replayed (graphs.py).
    compile: the loss runs torch.compile'd (compile_backend: inductor; aot_eager in tests), once
    for every shape (compile_dynamic) or once per shape.
    """

    def __init__(
        self,
        mcfg: ModelConfig,
        tcfg: TrainConfig,
        vocab: int,
        ids: Tensor | None,
        device: torch.device,
        precision: str,
        static: bool = False,
        graphs: bool = False,
        compile: bool = False,
        compile_backend: str = "inductor",
        compile_dynamic: bool = True,
    ):
        self.cfg, self.device, self.static = tcfg, device, static
        self.precision, self.compiled = precision, compile
        self.model = Transformer(mcfg, vocab, ids).to(device)
        # fused Adam reads a tensor rate: fp64 on a CPU (read as the double a Python rate is,
        # so the update is today's exactly), fp32 on CUDA (its kernel's type)
        self.lr = torch.zeros((), dtype=torch.float64 if device.type == "cpu" else torch.float32)
        self.lr = self.lr.to(device)
        self.opt = torch.optim.Adam(
            self.model.parameters(),
            lr=self.lr if tcfg.fused_adam or graphs else 0.0,
            betas=tuple(tcfg.adam_betas),
            eps=tcfg.adam_eps,
            fused=tcfg.fused_adam or None,
            capturable=graphs,
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scale = torch.zeros((), dtype=torch.float32, device=device)  # world / n_tokens
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)  # (loss, nll) unread
        self.ddp = dist.wrap(WithLoss(self.model), device)
        self.forward = self.ddp
        if compile:
            self.forward = compile_model(self.ddp, compile_backend, compile_dynamic)
            # static batches have at most one shape per length boundary: a compile per shape
            # (or a dynamic graph a shape specialises) must not hit dynamo's limit of 8
            shapes = len(boundaries(mcfg.max_positions))
            limit = torch._dynamo.config.recompile_limit = max(
                torch._dynamo.config.recompile_limit, shapes + 1
            )
            graphs_text = "one dynamic-shape graph" if compile_dynamic else "a graph per shape"
            dist.print0(
                f"train.compile: {graphs_text} (recompile limit {limit}: at most {shapes} "
                f"batch shapes up to {mcfg.max_positions} positions)"
            )
        # a captured update keeps its gradients (graphs write them in place), and autocast's
        # cache of cast weights must not outlive a capture
        self.keep_grads, self.autocast_cache = graphs, not graphs
        self.graphs = None
        if graphs:
            from transformer.training.graphs import Graphs  # CUDA only

            self.graphs = Graphs(device)
        dist.print0(
            f"training in {precision} on {device}: {update_text(graphs, static)}"
            + (", compiled loss" if compile else "")
        )

    def load_state(self, state: dict[str, Any], path: Any = "<checkpoint>") -> None:
        """Restore what `state` holds, the one way state enters a Learner (resume, rewind, the
        EMA swap): "model", the weights, copied into the parameters in place (they keep the
        addresses a captured update reads; checked against the model where `state` is a whole
        checkpoint); "optimizer" (Adam: new state tensors) and "scaler". Graphs that read
        tensors a restore replaced are dropped, to be captured afresh (the shapes that fell back
        to eager stay eager)."""
        if "model" in state:
            if "model_config" in state:  # a checkpoint: its architecture and values checked
                checkpoint.load_weights(self.model, state, path)
            else:
                self.model.load_state_dict(state["model"])  # copy_ into each parameter
        if "optimizer" in state:
            load_optimizer(self.opt, state["optimizer"])
        if self.scaler.is_enabled() and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.graphs is not None and ("optimizer" in state or "scaler" in state):
            self.graphs.invalidate()  # Adam's state is new tensors: captured afresh

    def path(self) -> dict[str, Any]:
        """The update path actually used: eager, captured, compiled or captured+compiled, and
        how many batch shapes fell back to eager (their capture or replay failed)."""
        used = (("captured", self.graphs is not None), ("compiled", self.compiled))
        return {
            "update": "+".join(name for name, on in used if on) or "eager",
            "eager_shapes": len(self.graphs.eager) if self.graphs is not None else 0,
        }

    def metrics(self) -> dict[str, int]:
        """The log point's train/eager_shapes (with the captured update only)."""
        return {} if self.graphs is None else {"train/eager_shapes": len(self.graphs.eager)}

    def trained_on(self) -> dict[str, Any]:
        """Where and how this run trains (core/hardware.py): its checkpoints' and metrics'."""
        cuda = self.device.type == "cuda"
        return hardware.record(
            self.device.type,
            torch.cuda.get_device_name(self.device) if cuda else None,
            self.precision,
            dist.world_size(),
            **self.path(),
            torch_version=str(torch.__version__),  # (a TorchVersion: not weights_only-loadable)
        )

    def autocast(self) -> torch.autocast:  # bf16 (CPU, CUDA) / fp16 (CUDA); master weights fp32
        return torch.autocast(
            self.device.type,
            dtype=self.dtype,
            enabled=self.dtype is not None,
            cache_enabled=self.autocast_cache,
        )

    def set_rate(self, lr: float) -> None:
        """The rate of the next updates, in place (a float where Adam is not fused)."""
        tensor = isinstance(self.opt.param_groups[0]["lr"], Tensor)
        for g in self.opt.param_groups:  # Adam's load_state_dict puts in the saved rate's copy
            g["lr"] = self.lr if tensor else lr
        if tensor:
            self.lr.fill_(lr)

    def step(self, batches: list[Batch], n_tokens: float, lr: float) -> None:
        """One update on `batches`, the micro-batches of this rank (on the host), holding n_tokens
        targets on all ranks; adds this rank's (loss, nll) sums to self.sums on the device."""
        self.set_rate(lr)
        # DDP averages over ranks: x world / n_tokens gives the per-token mean gradient
        self.scale.fill_(dist.world_size() / n_tokens)
        if self.graphs is not None:
            self.graphs.step(self.update, batches)
        else:
            counts = None if self.static else [n_targets(b) for b in batches]
            self.update([to_device(b, self.device) for b in batches], counts)

    def loss(self, b: Batch, n: int | None) -> tuple[Tensor, Tensor]:
        """The micro-batch's (loss, nll). A compile that fails (inductor cannot build: dynamo
        raises before the loss runs, nothing computed) makes the loss eager from then on, logged
        once, and the micro-batch runs eagerly: the run goes on (train.compile is resume-free)."""
        try:
            return self.forward(*b, self.cfg.label_smoothing, n, self.static)
        except torch._dynamo.exc.TorchDynamoException as e:  # (inductor's errors too)
            if self.forward is self.ddp:
                raise
            self.forward, self.compiled = self.ddp, False
            dist.print0(
                f"train.compile: compiling the loss failed ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:300]}); it runs eagerly from now on "
                "(`train.compile: false` in params.yaml says so from the start)"
            )
            return self.forward(*b, self.cfg.label_smoothing, n, self.static)

    def update(self, batches: list[Batch], counts: list[int] | None) -> None:
        """The update on device batches: what graphs.py captures. counts: each batch's non-pad
        targets (None with static shapes, whose loss projects every position)."""
        if self.keep_grads:
            self.opt.zero_grad(set_to_none=False)
        for i, b in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or not dist.is_dist() else self.ddp.no_sync()
            with sync:  # DDP all-reduces gradients once, on the update's last micro-batch
                with self.autocast():
                    loss, nll = self.loss(b, None if counts is None else counts[i])
                self.scaler.scale(loss * self.scale).backward()
            self.sums += torch.stack([loss.detach(), nll.detach()]).double()
        if self.cfg.clip_norm > 0:
            self.scaler.unscale_(self.opt)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip_norm)
        self.scaler.step(self.opt)
        self.scaler.update()
        if not self.keep_grads:
            self.opt.zero_grad(set_to_none=True)
