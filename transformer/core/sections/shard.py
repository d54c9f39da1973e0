"""The shard stage's settings (params.yaml `shard`)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.core.settings import ConfigError, at_least, fraction


@dataclass
class ShardConfig:
    max_len: int = 256  # tokens per side, EOS included; longer pairs are dropped and counted
    shard_pairs: int = 1_000_000  # pairs per shard file at most (bounds the stage's memory)
    # BPE-dropout (Provilkov et al. 2020; not in the paper): the train split is encoded
    # `train_copies` times, each time skipping every merge with probability `bpe_dropout`, so
    # the model sees the same sentence cut into different units. Valid / test are never dropped.
    bpe_dropout: float = 0.0
    train_copies: int = 1

    def __post_init__(self) -> None:
        at_least("shard", self, 2, "max_len")
        at_least("shard", self, 1, "shard_pairs", "train_copies")
        fraction("shard", self, "bpe_dropout")
        if self.train_copies > 1 and not self.bpe_dropout:
            raise ConfigError(
                f"shard.train_copies is {self.train_copies} but shard.bpe_dropout is 0: the "
                "copies would be identical (set bpe_dropout, e.g. 0.1, or train_copies: 1)"
            )
