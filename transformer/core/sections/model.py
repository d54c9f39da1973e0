"""The model's shape (params.yaml `model`): what a checkpoint stores to rebuild it."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.core.settings import ConfigError, at_least, choice, fraction

# The ModelConfig fields that change the function the weights compute (the dropout rates do
# not, nor max_positions: the sinusoids are not saved). Weights are loaded, resumed from or
# trained on only by a model that has the same values: the retrain flow keeps them the
# champion's for a continued run (flows/retrain.py KEPT).
WEIGHT_KEYS = (
    "d_model",
    "d_ff",
    "n_heads",
    "n_layers",
    "n_decoder_layers",
    "d_ff_decoder",
    "pre_ln",
    "tie_embeddings",
    "output_vocab",
)
# Those a checkpoint's model_config is checked on (checkpoint.check_compatible): all but
# output_vocab, which a checkpoint carries in its weights (the output_ids buffer, there exactly
# when it is target), where load_weights finds a mismatch by key and shape.
ARCH_KEYS = tuple(k for k in WEIGHT_KEYS if k != "output_vocab")
# keys added after checkpoints were made: a checkpoint without one has the value that reproduces
# what it was then (the decoder as deep and as wide as the encoder)
LATER = {"n_decoder_layers": 0, "d_ff_decoder": 0}


@dataclass
class ModelConfig:
    d_model: int = 128
    d_ff: int = 512
    n_heads: int = 4
    n_layers: int = 2  # N in the paper: the encoder's, and the decoder's unless set below
    # a distilled student's shape (issue 82; the Bergamot students keep the teacher's encoder
    # and a 1- or 2-layer decoder, where decoding spends its time): the decoder's N and FFN
    # width; 0: n_layers and d_ff, the paper's symmetric stacks
    n_decoder_layers: int = 0
    d_ff_decoder: int = 0
    dropout: float = 0.1  # §5.4 P_drop: sub-layer outputs and embeddings + positions
    attention_dropout: float = 0.0  # on attention weights (not in the paper; tensor2tensor's)
    activation_dropout: float = 0.0  # after the FFN's ReLU (not in the paper)
    pre_ln: bool = False  # post-LN is the paper's; pre-LN is offered as an option
    tie_embeddings: bool = True  # §3.4: one matrix for source, target and output (joint vocab)
    # shared: the softmax spans the whole joint vocabulary (§3.4). target: only the units that
    # occur in the training targets (5.4k of 8k on Multi30k de), fewer FLOPs, the same weights
    output_vocab: str = "shared"
    max_positions: int = 1024

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.d_model % 2:
            raise ConfigError(f"model.d_model ({self.d_model}) must be even (sin/cos pairs, §3.5)")
        at_least("model", self, 1, "d_model", "d_ff", "n_heads", "n_layers", "max_positions")
        fraction("model", self, "dropout", "attention_dropout", "activation_dropout")
        choice("model.output_vocab", self.output_vocab, ("shared", "target"))
        at_least("model", self, 0, "n_decoder_layers", "d_ff_decoder")

    @property
    def decoder_layers(self) -> int:
        """The decoder's N: n_decoder_layers, or n_layers where it is 0."""
        return self.n_decoder_layers or self.n_layers

    @property
    def decoder_d_ff(self) -> int:
        """The decoder's FFN width: d_ff_decoder, or d_ff where it is 0."""
        return self.d_ff_decoder or self.d_ff
