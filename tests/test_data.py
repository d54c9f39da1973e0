"""Token-budget batching: budget, exactly-once coverage across ranks, resumption, collate."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer.core.ids import BOS_ID, EOS_ID, PAD_ID
from transformer.data.batches import Batch, BatchSampler, DataError, _pack, collate


def _lens(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(2, 60, n)
    tgt = np.clip(src + rng.integers(-8, 9, n), 2, 70)  # correlated, as real pairs are
    return src.astype(np.int32), tgt.astype(np.int32)


def _epoch(src, tgt, max_tokens, world_size, epoch=0, seed=1):
    """Each rank's batches for one epoch."""
    out = []
    for rank in range(world_size):
        s = BatchSampler(src, tgt, max_tokens, seed, rank=rank, world_size=world_size)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_pair_once_per_epoch_and_equal_counts(world_size):
    src, tgt = _lens()
    assert len(_pack(src[:1012], tgt[:1012], 1024, 1)) == 37  # the case below is not trivial
    for n in (len(src), 1012):  # 37 batches for 1012 pairs: 2 and 3 ranks need splits
        per_rank = _epoch(src[:n], tgt[:n], 1024, world_size)
        assert len({len(b) for b in per_rank}) == 1  # no rank waits for another
        seen = np.sort(np.concatenate([i for rank in per_rank for i in rank]))
        np.testing.assert_array_equal(seen, np.arange(n))
        sampler = BatchSampler(src[:n], tgt[:n], 1024, 1, world_size=world_size)
        assert len(sampler) == len(per_rank[0])


def test_no_batch_exceeds_max_tokens_padding_counted():
    src, tgt = _lens()
    for max_tokens in (128, 1000, 4096):
        for batch in _epoch(src, tgt, max_tokens, 1)[0]:
            n = len(batch)
            assert n * src[batch].max() <= max_tokens and n * tgt[batch].max() <= max_tokens


def test_same_seed_same_order_other_seed_or_epoch_differs():
    src, tgt = _lens()
    a = _epoch(src, tgt, 1024, 2, epoch=3, seed=7)
    assert a == _epoch(src, tgt, 1024, 2, epoch=3, seed=7)
    assert a != _epoch(src, tgt, 1024, 2, epoch=4, seed=7)
    assert a != _epoch(src, tgt, 1024, 2, epoch=3, seed=8)


@pytest.mark.parametrize("stop", [0, 5, 37])
def test_resume_sees_exactly_the_remaining_batches(stop):
    src, tgt = _lens()
    full = BatchSampler(src, tgt, 1024, 3, rank=1, world_size=2)
    full.set_epoch(2)
    whole = list(full) + list(full)  # epoch 2, then epoch 3 (advances by itself)
    run = BatchSampler(src, tgt, 1024, 3, rank=1, world_size=2)
    run.set_epoch(2)
    it = iter(run)
    head = [next(it) for _ in range(stop)]
    state = run.state_dict()
    assert (state["epoch"], state["batch"]) == (2, stop)
    resumed = BatchSampler(src, tgt, 1024, 3, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert head + list(resumed) + list(resumed) == whole
    assert resumed.state_dict()["epoch"] == 4


def test_resume_with_other_world_size_is_refused():
    src, tgt = _lens()
    state = BatchSampler(src, tgt, 1024, 3, world_size=2).state_dict()
    with pytest.raises(DataError, match="world_size"):
        BatchSampler(src, tgt, 1024, 3, world_size=3).load_state_dict(state)


def test_pair_longer_than_budget_is_an_error():
    with pytest.raises(DataError, match="cannot fit max_tokens=8"):
        BatchSampler(np.array([3, 9]), np.array([3, 3]), 8, 0)


def test_unshuffled_batches_are_length_sorted():
    src, tgt = _lens()
    sampler = BatchSampler(src, tgt, 1024, 0, shuffle=False)
    longest = [int(np.maximum(src[b], tgt[b]).max()) for b in sampler]
    assert longest == sorted(longest)


def test_collate_shifts_target_and_pads():
    pairs = [
        (np.array([5, 6, 7, EOS_ID]), np.array([8, 9, EOS_ID])),
        (np.array([5, EOS_ID]), np.array([10, 11, 12, 13, EOS_ID])),
    ]
    b = collate(pairs)
    assert isinstance(b, Batch) and all(t.dtype == torch.long for t in b)
    assert b.src.tolist() == [[5, 6, 7, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 10, 11, 12, 13]]
    assert b.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [10, 11, 12, 13, EOS_ID]]
    assert b.to("cpu").src.shape == (2, 4)
