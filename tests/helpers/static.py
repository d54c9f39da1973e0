"""Random token pairs of given lengths and a tiny model: the static-shape and learner tests' data."""

from __future__ import annotations

import numpy as np

from transformer.core.ids import EOS_ID

MODEL = {"d_model": 16, "d_ff": 32, "n_heads": 2, "n_layers": 2, "dropout": 0.0}
V = 40


def lengths(n: int, seed: int = 0, longest: int = 30) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, longest, n), rng.integers(1, longest, n)


def pairs(src_lens, tgt_lens, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        (np.append(rng.integers(4, V, s - 1), EOS_ID), np.append(rng.integers(4, V, t - 1), EOS_ID))
        for s, t in zip(src_lens, tgt_lens)
    ]
