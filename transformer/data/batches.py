"""Training data: memory-mapped shards, token-budget batches (§5.1), padded tensors.

A split folder (written by transformer.shard) holds `index.json` and shard files
`shard_XXXXX.bin`; one shard is four arrays of the index's `dtype`, back to back:

    src_lens (n) | tgt_lens (n) | src tokens (sum src_lens) | tgt tokens (sum tgt_lens)

Each side's ids end with EOS (lengths include it). Nothing is read until a pair is used.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from transformer.core.files import sha256_file
from transformer.core.ids import BOS_ID, PAD_ID

if TYPE_CHECKING:
    import torch

FORMAT = 1
INDEX = "index.json"


class DataError(ValueError):
    """A shard / index problem, naming the file."""


def shard_name(k: int) -> str:
    return f"shard_{k:05d}.bin"


class PairDataset:
    """Sentence pairs of one split, memory-mapped from its shards: ds[i] -> (src, tgt) ids."""

    def __init__(self, shards: list[np.ndarray], index: dict[str, Any]):
        self.index = index
        self._src, self._tgt, self._src_off, self._tgt_off = [], [], [], []
        src_lens, tgt_lens, starts = [], [], [0]
        for mm, meta in zip(shards, index["shards"]):
            n, ns = meta["n_pairs"], meta["src_tokens"]
            sl, tl = mm[:n], mm[n : 2 * n]  # views into the map: nothing is read yet
            self._src.append(mm[2 * n : 2 * n + ns])
            self._tgt.append(mm[2 * n + ns :])
            # Offsets are the one O(pairs) thing built at start-up (the sampler needs lengths)
            self._src_off.append(np.concatenate([[0], np.cumsum(sl, dtype=np.int64)]))
            self._tgt_off.append(np.concatenate([[0], np.cumsum(tl, dtype=np.int64)]))
            src_lens.append(sl.astype(np.int32))
            tgt_lens.append(tl.astype(np.int32))
            starts.append(starts[-1] + n)
        empty = np.zeros(0, np.int32)
        self.src_lens = np.concatenate(src_lens) if src_lens else empty  # (N,) EOS included
        self.tgt_lens = np.concatenate(tgt_lens) if tgt_lens else empty  # (N,) EOS included
        self._starts = starts

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= i < len(self):
            raise IndexError(f"pair {i} out of range (split has {len(self)})")
        s = bisect.bisect_right(self._starts, i) - 1
        j = i - self._starts[s]
        so, to = self._src_off[s], self._tgt_off[s]
        return self._src[s][so[j] : so[j + 1]], self._tgt[s][to[j] : to[j + 1]]

    def target_counts(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) int64: how often each unit occurs on the target side (EOS included)."""
        counts = np.zeros(vocab_size, np.int64)
        for tgt in self._tgt:
            counts += np.bincount(tgt, minlength=vocab_size)[:vocab_size]
        return counts


def read_index(split_dir: Path) -> dict[str, Any]:
    """index.json of a split folder, with a clear error when missing or not ours."""
    path = Path(split_dir) / INDEX
    if not path.exists():
        raise DataError(f"{path}: missing (run the shard stage first)")
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataError(f"{path}: not a format-{FORMAT} shard index")
    return index


def load_split(
    shards_dir: Path, split: str, tokenizer_sha256: str | None = None, verify: bool = True
) -> PairDataset:
    """Open shards_dir/split; check the tokenizer hash and (verify) every shard's sha256."""
    split_dir = Path(shards_dir) / split
    index = read_index(split_dir)
    made_with = index.get("tokenizer_sha256")
    if tokenizer_sha256 is not None and made_with != tokenizer_sha256:
        raise DataError(
            f"{split_dir / INDEX}: shards were made with tokenizer {str(made_with)[:12]}..., "
            f"not the given {tokenizer_sha256[:12]}... (rerun the shard stage)"
        )
    dtype = np.dtype(index["dtype"])
    maps = []
    for meta in index["shards"]:
        path = split_dir / meta["file"]
        if not path.exists():
            raise DataError(f"{path}: missing (listed in {INDEX})")
        if (size := path.stat().st_size) != meta["bytes"]:
            raise DataError(f"{path}: {size} bytes, {INDEX} says {meta['bytes']} (truncated?)")
        # A full hash costs ~1 s per GB: cheap next to training, and a corrupt shard would
        # otherwise surface as garbage ids hours in.
        if verify and sha256_file(path) != meta["sha256"]:
            raise DataError(f"{path}: sha256 does not match {INDEX} (corrupt or replaced shard)")
        maps.append(np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype))
    return PairDataset(maps, index)


class BatchSampler:
    """Token-budget batches of similar-length pairs, shuffled per epoch, split across ranks.

    A batch of n pairs costs n * max(len) on each side (padding counted), kept <= max_tokens.
    Batches are formed once (length-sorted, ties broken by the seed) and their order is
    reshuffled every epoch. With world_size W the batch count is made divisible by W by
    halving the largest batches, so every pair is seen exactly once per epoch, on one rank,
    and every rank gets len(self) batches. The position (epoch, batch) is resumable.

    static: batches of a bounded set of shapes, for a captured or compiled update (a CUDA graph
    per shape): each pair goes to the shortest of length boundaries growing x1.1 (tensor2tensor)
    that holds both its sides, and every batch of a boundary L is padded to (max_tokens // L, L)
    on both sides; `self.shape` is the padded shape of the batch last handed out (None when not
    static). The batches of a boundary come in runs of group x world_size (group: the update's
    micro-batches), and runs are what each epoch shuffles, so every rank's micro-batches of one
    update share one shape. A boundary with fewer pairs than a run has batches of filler rows
    only (all padding), which the model takes without NaN.
    """

    def __init__(
        self,
        src_lens,
        tgt_lens,
        max_tokens: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        static: bool = False,
        group: int = 1,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.max_tokens, self.seed, self.shuffle = max_tokens, seed, shuffle
        self.rank, self.world_size = rank, world_size
        if len(src_lens) == 0:
            raise DataError("no pairs to batch (is the split empty?)")
        src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
        # the run of batches an epoch keeps together: one update of every rank (static)
        self.run = group * world_size if static else 1
        if static:
            self.batches, self.shapes = _pack_static(src_lens, tgt_lens, max_tokens, seed, self.run)
        else:
            self.batches = _pack(src_lens, tgt_lens, max_tokens, seed)
            self.batches = _split_to_multiple(self.batches, world_size)
            self.shapes = None
        self.stats = batch_stats(self.batches, self.shapes, src_lens, tgt_lens)
        self.epoch, self.batch, self.shape = 0, 0, None

    def __len__(self) -> int:
        return len(self.batches) // self.world_size

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` from its first batch."""
        self.epoch, self.batch = epoch, 0

    def _mine(self, epoch: int) -> np.ndarray:
        """Batch numbers of this rank in `epoch`, in order: a strided slice of one permutation."""
        runs = len(self.batches) // self.run
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(runs)
        else:
            order = np.arange(runs)
        order = (order[:, None] * self.run + np.arange(self.run)).ravel()  # runs stay whole
        return order[self.rank :: self.world_size]

    def __iter__(self):
        """The rest of the current epoch; when exhausted, the position moves to the next."""
        mine = self._mine(self.epoch)
        while self.batch < len(mine):
            self.batch += 1  # counted when handed out: a checkpoint taken now resumes after it
            k = mine[self.batch - 1]
            self.shape = None if self.shapes is None else self.shapes[k]
            yield self.batches[k].tolist()
        self.epoch, self.batch = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "world_size": self.world_size,
            "n_batches": len(self.batches),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at `state`; the data, max_tokens and world_size must be as when it was saved."""
        if not {"epoch", "batch"} <= set(state):
            raise DataError(f"sampler state {state!r} lacks 'epoch' / 'batch'")
        for key, now in (("world_size", self.world_size), ("n_batches", len(self.batches))):
            if key in state and state[key] != now:
                raise DataError(
                    f"sampler state has {key}={state[key]}, but now it is {now} "
                    "(different data, max_tokens or world size: cannot resume)"
                )
        if not 0 <= state["batch"] <= len(self):
            raise DataError(f"sampler state batch={state['batch']} not in [0, {len(self)}]")
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


def _pack(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int, early: float = 0.8
) -> list:
    """Pack length-sorted pairs into batches of <= max_tokens padded positions per side."""
    src_lens, tgt_lens = src_lens.astype(np.int64), tgt_lens.astype(np.int64)
    longest = np.maximum(src_lens, tgt_lens)  # (N,) the side that binds the budget
    if len(longest) and (worst := int(longest.max())) > max_tokens:
        raise DataError(f"a pair of {worst} tokens cannot fit max_tokens={max_tokens}")
    # Sort by the longer side, then by src-tgt difference (so both sides are near-constant
    # within a batch), snaking direction at each level so neighbouring levels meet at similar
    # pairs; a seeded random key breaks ties (fairseq), so seeds group equal pairs differently.
    diff = np.where(longest % 2 == 0, src_lens - tgt_lens, tgt_lens - src_lens)
    tie = np.random.default_rng(seed).permutation(len(longest))
    order = np.lexsort((tie, diff, longest))
    batches, start, ms, mt = [], 0, 0, 0
    for k, (s, t) in enumerate(zip(src_lens[order].tolist(), tgt_lens[order].tolist())):
        n, ms2, mt2 = k - start, max(ms, s), max(mt, t)
        full = (n + 1) * max(ms2, mt2) > max_tokens
        # Once `early` of the budget is used, close rather than admit a pair that would pad
        # every row (Multi30k, 4096: 93% -> 97% padding efficiency for ~4% more batches).
        grows = (ms2 > ms or mt2 > mt) and n * max(ms, mt) >= early * max_tokens
        if full or grows:
            batches.append(order[start:k])
            start, ms, mt = k, s, t
        else:
            ms, mt = ms2, mt2
    if start < len(order):
        batches.append(order[start:])
    return batches


# tensor2tensor's length boundaries: from 8, each x1.1 the one before (at least +1)
MIN_BOUNDARY, BOUNDARY_GROWTH = 8, 1.1


def boundaries(longest: int) -> list[int]:
    """The padded lengths of static batches up to `longest`, which is the last one."""
    out, x = [], MIN_BOUNDARY
    while x < longest:
        out.append(x)
        x = max(x + 1, int(x * BOUNDARY_GROWTH))
    return out + [longest]


def _pack_static(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int, run: int
) -> tuple[list, list[tuple[int, int]]]:
    """Batches of pairs per length boundary L, max_tokens // L rows each, in whole runs of `run`
    batches (pairs spread evenly over a boundary's batches); and each batch's (rows, L)."""
    longest = np.maximum(src_lens, tgt_lens).astype(np.int64)
    if (worst := int(longest.max())) > max_tokens:
        raise DataError(f"a pair of {worst} tokens cannot fit max_tokens={max_tokens}")
    bounds = np.array(boundaries(worst))
    bucket = np.searchsorted(bounds, longest)  # the shortest boundary >= the pair's longest side
    order = np.random.default_rng(seed).permutation(len(longest))  # the seed groups the pairs
    order = order[np.argsort(bucket[order], kind="stable")]  # by boundary, shuffled within
    ks, counts = np.unique(bucket, return_counts=True)
    batches, shapes = [], []
    for k, pairs in zip(ks, np.split(order, np.cumsum(counts)[:-1])):
        L = int(bounds[k])
        rows = max_tokens // L
        n = run * -(-len(pairs) // (rows * run))  # batches: whole runs, rows each at most
        batches += np.array_split(pairs, n)
        shapes += [(rows, L)] * n
    return batches, shapes


def batch_stats(batches: list, shapes, src_lens: np.ndarray, tgt_lens: np.ndarray) -> dict:
    """How many distinct padded batch shapes an epoch has, and the share of its padded positions
    (both sides) that hold tokens."""
    real = int(src_lens.sum()) + int(tgt_lens.sum())
    if shapes is None:
        shapes = [(len(b), int(src_lens[b].max()), int(tgt_lens[b].max())) for b in batches]
        padded = sum(r * (s + t) for r, s, t in shapes)
    else:
        padded = sum(2 * r * L for r, L in shapes)
    return {"batch_shapes": len(set(shapes)), "pad_efficiency": round(real / padded, 4)}


def _split_to_multiple(batches: list, world_size: int) -> list:
    """Halve the largest batches until the count divides world_size (pairs stay unique)."""
    while len(batches) % world_size:
        need = world_size - len(batches) % world_size
        sizes = np.array([len(b) for b in batches])
        big = [i for i in np.argsort(-sizes, kind="stable")[:need] if sizes[i] > 1]
        if not big:
            raise DataError(
                f"{sizes.sum()} pairs cannot make equal batch counts for {world_size} ranks"
            )
        for i in sorted(big, reverse=True):  # highest first, so earlier indices stay valid
            b = batches[i]
            batches[i : i + 1] = [b[: len(b) // 2], b[len(b) // 2 :]]
    return batches


class Batch(NamedTuple):
    src: torch.Tensor  # (B, S) source ids + EOS, PAD_ID padded
    tgt_in: torch.Tensor  # (B, T) BOS + target ids: the decoder input
    tgt_out: torch.Tensor  # (B, T) target ids + EOS: what the decoder predicts

    def to(self, device, non_blocking: bool = False) -> Batch:
        return Batch(*(t.to(device, non_blocking=non_blocking) for t in self))


def collate(
    pairs: list[tuple[np.ndarray, np.ndarray]], shape: tuple[int, int] | None = None
) -> Batch:
    """Pad a list of (src, tgt) id arrays (each ending with EOS) into a Batch of long tensors:
    to the longest of each side, or, given shape (rows, L), to L on both sides with rows beyond
    the pairs all padding (filler rows)."""
    import torch  # here, not at the top: the shard stage uses this module without torch

    if shape is None:
        B, S, T = len(pairs), max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs)
    else:
        B, S, T = shape[0], shape[1], shape[1]
    src = np.full((B, S), PAD_ID, np.int64)  # (B, S)
    tgt_in = np.full((B, T), PAD_ID, np.int64)  # (B, T)
    tgt_out = np.full((B, T), PAD_ID, np.int64)  # (B, T)
    for i, (s, t) in enumerate(pairs):
        src[i, : len(s)] = s
        tgt_in[i, 0] = BOS_ID  # teacher forcing: the decoder sees the target shifted right
        tgt_in[i, 1 : len(t)] = t[:-1]
        tgt_out[i, : len(t)] = t
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out))


def batch_stream(
    dataset: PairDataset, sampler: BatchSampler
) -> Iterator[tuple[dict[str, int], Any]]:
    """(sampler position after this batch, collated batch) forever, epoch after epoch."""
    while True:  # the sampler continues from its position and rolls over into the next epoch
        for idx in sampler:
            yield sampler.state_dict(), collate([dataset[j] for j in idx], sampler.shape)
