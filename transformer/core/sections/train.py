"""The train stage's settings (params.yaml `train`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformer.core.settings import ConfigError, at_least, choice, fraction


@dataclass
class TrainConfig:
    nproc: int = 1  # torchrun --nproc_per_node
    max_restarts: int = 0  # torchrun --max-restarts: a lost rank restarts the group (resumes)
    seed: int = 1
    max_tokens: int = 4096  # per process and micro-batch, padded positions, each side
    update_freq: int = 1  # gradient accumulation: micro-batches per update
    max_steps: int = 600
    time_budget_minutes: float = 0.0  # stop after this much training wall time; 0 = none
    warmup_steps: int = 4000  # §5.3
    lr_scale: float = 1.0  # multiplies the §5.3 rate
    label_smoothing: float = 0.1  # §5.4
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # §5.3
    adam_eps: float = 1e-9
    clip_norm: float = 0.0  # 0 = no clipping (the paper does not clip)
    precision: str = "fp32"  # fp32 | bf16 | fp16 (CUDA only) | auto (bf16 where native, else fp32)
    save_every_steps: int = 100
    save_every_minutes: float = 10.0  # §6.1: checkpoints at 10-minute intervals
    keep_last: int = 5
    valid_every_steps: int = 100
    log_every_steps: int = 10
    threads: int = 0  # torch.set_num_threads; 0 = torch's default
    lr_decay: str = "none"  # none (§5.3) | linear | cosine: x(1 - progress) to 0 at the end
    fused_adam: bool = True  # one fused kernel for Adam (CPU and CUDA); False = foreach
    static_shapes: str = "auto"  # on | off | auto (on with CUDA): a bounded set of batch shapes
    graphs: str = "auto"  # auto (CUDA, static shapes, one process, not fp16) | off: CUDA graphs
    compile: bool = False  # torch.compile the loss (fullgraph, dynamic shapes)
    # divergence (rewind.py): rewind to the last good checkpoint, skip, go on at a lowered rate
    max_rewinds: int = 3  # rewinds before the run fails naming the steps; 0 = off (stop at once)
    spike_factor: float = 3.0  # a loss per token above this x its running mean diverged; 0 = off
    rewind_lr_factor: float = 0.5  # the rate after a rewind, times this ...
    rewind_updates: int = 100  # ... for this many updates
    inject_divergence_at: int = 0  # test hook: the update of this step turns NaN once; 0 = never
    # validation BLEU/chrF (training/validation.py), best checkpoints and early stopping (selection.py)
    valid_bleu: bool = True  # decode the valid split at each validation point (needs --raw)
    valid_bleu_sentences: int = 0  # the first N valid sentences; 0 = all
    valid_bleu_beam_size: int = 0  # 0 = decode.beam_size (the evaluate stage's); 1 = greedy
    best_metric: str = "bleu"  # bleu | chrf (higher is better) | loss (lower is better)
    keep_best: int = 0  # the best k checkpoints by best_metric, kept beside the last keep_last
    patience: int = 0  # stop after this many validations without improvement; 0 = off
    min_delta: float = 0.0  # the least gain in best_metric that counts as an improvement
    ema_decay: float = 0.0  # an fp32 moving average of the weights (ema.py); 0 = off

    def __post_init__(self) -> None:
        choice("train.precision", self.precision, ("fp32", "bf16", "fp16", "auto"))
        choice("train.static_shapes", self.static_shapes, ("auto", "on", "off"))
        choice("train.graphs", self.graphs, ("auto", "off"))
        choice("train.lr_decay", self.lr_decay, ("none", "linear", "cosine"))
        choice("train.best_metric", self.best_metric, ("bleu", "chrf", "loss"))
        at_least(
            "train",
            self,
            1,
            "nproc",
            "max_tokens",
            "update_freq",
            "warmup_steps",
            "log_every_steps",
        )
        at_least(
            "train",
            self,
            0,
            "max_restarts",
            "max_steps",
            "time_budget_minutes",
            "clip_norm",
            "save_every_steps",
            "save_every_minutes",
            "keep_last",
            "valid_every_steps",
            "threads",
            "max_rewinds",
            "rewind_updates",
            "inject_divergence_at",
            "valid_bleu_sentences",
            "valid_bleu_beam_size",
            "keep_best",
            "patience",
            "min_delta",
        )
        if self.lr_scale <= 0:
            raise ConfigError(f"train.lr_scale must be > 0, got {self.lr_scale}")
        if self.max_steps < 1 and self.time_budget_minutes <= 0:
            raise ConfigError("train.max_steps must be >= 1 unless time_budget_minutes is set")
        fraction("train", self, "label_smoothing")
        if self.spike_factor != 0 and self.spike_factor <= 1:
            raise ConfigError(
                f"train.spike_factor must be > 1 (or 0: off), got {self.spike_factor}"
            )
        if not 0 < self.rewind_lr_factor <= 1:
            raise ConfigError(
                f"train.rewind_lr_factor must be in (0, 1], got {self.rewind_lr_factor}"
            )
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay must be in [0, 1), got {self.ema_decay}")
        if len(self.adam_betas) != 2:
            raise ConfigError(f"train.adam_betas must be two numbers, got {self.adam_betas}")
