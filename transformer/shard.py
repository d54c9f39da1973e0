"""Encode each split with the trained tokenizer into length-bucketed binary shards.

    python -m transformer.shard data/raw data/tokenizer data/shards --metrics data/metrics/shard.json

Two streaming passes keep memory flat in the corpus size: (1) encode chunks of lines (Rust,
all cores) and append each pair to a temporary file of its source-length bucket; (2) read the
buckets in length order into shards of at most `shard.shard_pairs` pairs, each sorted by
(source, target) length. Pairs longer than `shard.max_len` on either side (EOS included) are
dropped and counted, never truncated. The file format is documented in transformer/data/batches.py.

With --synthetic (the backtranslate stage's folder) the train split also holds back-translated
pairs: the first backtranslate.ratio x (train pairs) of them, each source led by the
backtranslate.tag token (its id: the text of a line never becomes it) when one is set.

With --distilled (the distill stage's folder) holding pairs (a student line: its teacher's
translations of the train sources), the train split is those pairs instead of the references,
and the original pairs as well when distill.mix_originals says so. A folder without pairs (a
line without a teacher) changes nothing.

With `shard.bpe_dropout` > 0 the train split is encoded `shard.train_copies` times with
BPE-dropout, all copies in one split, so an epoch of the sampler is that many passes over the
corpus. `tokenizers` draws the skipped merges from an unseeded generator: such a train split
differs from run to run (its sha256s record which one a model saw); without it the stage is
byte-for-byte deterministic.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from transformer.core import failure, settings
from transformer.core.files import atomic_dir, sha256_file, write_json
from transformer.core.ids import EOS_ID, UNK_ID
from transformer.core.sections.backtranslate import BacktranslateConfig
from transformer.core.sections.distill import DistillConfig
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.shard import ShardConfig
from transformer.core.settings import ConfigError
from transformer.data import pairs
from transformer.data.batches import FORMAT, INDEX, DataError, shard_name
from transformer.data.vocab import Subwords, TokenizerError, load_tokenizer, tokenizer_sha256

SPLITS = ("train", "valid", "test")
N_BUCKETS = 32  # source-length buckets of pass 1; each one is three temporary files
GATHER = 1 << 16  # pairs per read / gather step of pass 2: bounds its scratch memory


def _flat(ids: list[list[int]], dtype) -> tuple[np.ndarray, np.ndarray]:
    """(lengths with EOS, all ids + EOS concatenated) of a list of id lists."""
    lens = np.fromiter(map(len, ids), np.int64, len(ids)) + 1
    flat = np.fromiter(
        itertools.chain.from_iterable(x + [EOS_ID] for x in ids), dtype, int(lens.sum())
    )
    return lens, flat


def _gather(flat: np.ndarray, lens: np.ndarray, pick: np.ndarray, starts=None) -> np.ndarray:
    """The concatenated token runs of pairs `pick`, in that order (vectorized slicing)."""
    starts = (np.cumsum(lens) - lens if starts is None else starts)[pick]
    n = lens[pick]
    # position of each output token = its run's start + its rank inside the run
    within = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    return flat[np.repeat(starts, n) + within]


class _Buckets:
    """Pass 1's temporary files: per bucket, lengths (int32 pairs) and src / tgt tokens."""

    def __init__(self, tmp: Path, max_len: int):
        self.tmp, self.width = tmp, -(-max_len // N_BUCKETS)
        tmp.mkdir(parents=True, exist_ok=True)

    def path(self, b: int, part: str) -> Path:
        return self.tmp / f"{b:02d}.{part}"

    def append(self, sl, tl, src_flat, tgt_flat, keep) -> None:
        bucket = (sl - 1) // self.width  # (n,) bucket of each pair, by source length
        for b in np.unique(bucket[keep]):
            pick = np.flatnonzero(keep & (bucket == b))
            with open(self.path(b, "len"), "ab") as f:
                np.stack([sl[pick], tl[pick]], 1).astype(np.int32).tofile(f)  # (n, 2)
            with open(self.path(b, "src"), "ab") as f:
                _gather(src_flat, sl, pick).tofile(f)
            with open(self.path(b, "tgt"), "ab") as f:
                _gather(tgt_flat, tl, pick).tofile(f)

    def read(self, dtype, block: int):
        """(sl, tl, src, tgt) blocks of at most `block` pairs, in bucket (length) order."""
        for b in range(N_BUCKETS):
            if not self.path(b, "len").exists():
                continue
            with (
                open(self.path(b, "len"), "rb") as fl,
                open(self.path(b, "src"), "rb") as fs,
                open(self.path(b, "tgt"), "rb") as ft,
            ):
                while (lens := np.fromfile(fl, np.int32, 2 * block).reshape(-1, 2)).size:
                    sl, tl = lens[:, 0].astype(np.int64), lens[:, 1].astype(np.int64)
                    yield (
                        sl,
                        tl,
                        np.fromfile(fs, dtype, int(sl.sum())),
                        np.fromfile(ft, dtype, int(tl.sum())),
                    )


def _write_shard(path: Path, sl, tl, src, tgt, dtype) -> dict[str, Any]:
    """One shard, sorted by (source, target) length; returns its index entry."""
    order = np.lexsort((tl, sl))
    with open(path, "wb") as f:  # inside the stage's atomic_dir: never seen half-written
        sl[order].astype(dtype).tofile(f)
        tl[order].astype(dtype).tofile(f)
        for flat, lens in ((src, sl), (tgt, tl)):
            starts = np.cumsum(lens) - lens
            # in pieces: the gather's int64 index arrays are 4x the uint16 tokens they fetch
            for piece in np.array_split(order, max(1, len(order) // GATHER)):
                _gather(flat, lens, piece, starts).astype(dtype, copy=False).tofile(f)
    return {
        "file": path.name,
        "n_pairs": len(sl),
        "src_tokens": int(sl.sum()),
        "tgt_tokens": int(tgt.size),
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
    }


def _encode(tok: Subwords, chunk: tuple[list[str], list[str], tuple[int, ...]], dtype):
    a, b, prefix = chunk
    src = tok.encode(a)
    if prefix:
        src = [[*prefix, *ids] for ids in src]
    return _flat(src, dtype), _flat(tok.encode(b), dtype)


def shard_split(
    tok: Subwords,
    src: Path,
    tgt: Path,
    out: Path,
    cfg: ShardConfig,
    tok_sha: str,
    chunk: int = 20_000,
    copies: int = 1,
    extras: tuple[pairs.Extra, ...] = (),
) -> dict[str, Any]:
    """Encode one split (src, tgt line files, and the `extras` pairs), `copies` times, into
    shards + index.json."""
    dtype = np.dtype(np.uint16 if tok.size <= 1 << 16 else np.uint32)
    if cfg.max_len > np.iinfo(dtype).max:
        raise ConfigError(f"shard.max_len {cfg.max_len} does not fit {dtype} lengths")
    buckets = _Buckets(out / ".buckets", cfg.max_len)
    n = dropped = unk = 0
    bar = tqdm(desc=f"encode {out.name}", unit=" pairs", disable=None)
    # Encode chunk k+1 (Rust, GIL released) while numpy files chunk k.
    with ThreadPoolExecutor(1) as pool:
        pending = None
        passes = (  # lazy: opened in turn
            itertools.chain(
                ((a, b, ()) for a, b in pairs.line_chunks(src, tgt, chunk)),
                *(e.chunks(chunk) for e in extras),
            )
            for _ in range(copies)
        )
        for piece in itertools.chain(*passes, [None]):
            nxt = pool.submit(_encode, tok, piece, dtype) if piece else None
            if pending is not None:
                (sl, sf), (tl, tf) = pending.result()
                keep = (sl <= cfg.max_len) & (tl <= cfg.max_len)
                buckets.append(sl, tl, sf, tf, keep)
                n, dropped = n + len(sl), dropped + int((~keep).sum())
                unk += int((sf == UNK_ID).sum() + (tf == UNK_ID).sum())
                bar.update(len(sl))
            pending = nxt
    bar.close()
    shards, buf, k = [], [], 0
    for block in buckets.read(dtype, min(GATHER, cfg.shard_pairs)):
        buf.append(block)
        if sum(len(b[0]) for b in buf) >= cfg.shard_pairs:
            shards.append(_flush(out, k, buf, dtype, cfg.shard_pairs))
            k += 1
    while buf:
        shards.append(_flush(out, k, buf, dtype, cfg.shard_pairs))
        k += 1
    shutil.rmtree(buckets.tmp)
    kept = sum(s["n_pairs"] for s in shards)
    index = {
        "format": FORMAT,
        "tokenizer_sha256": tok_sha,
        "vocab_size": tok.size,
        "dtype": dtype.name,
        "max_len": cfg.max_len,
        "copies": copies,
        "n_pairs": kept,
        "shards": shards,
    }
    write_json(out / INDEX, index, indent=1)
    n_tok = sum(s["src_tokens"] + s["tgt_tokens"] for s in shards)
    return {
        "pairs_in": n,
        "copies": copies,
        "pairs": kept,
        "dropped_too_long": dropped,
        "src_tokens": sum(s["src_tokens"] for s in shards),
        "tgt_tokens": sum(s["tgt_tokens"] for s in shards),
        "unk_share": unk / max(n_tok, 1),
        "shards": len(shards),
    }


def _flush(out: Path, k: int, buf: list, dtype, limit: int) -> dict[str, Any]:
    """Write the first `limit` pairs of the buffered blocks as shard k; keep the rest."""
    sl, tl, src, tgt = (np.concatenate(p) for p in zip(*buf))
    buf.clear()
    if len(sl) > limit:  # the tail goes back to the buffer for the next shard
        ns, nt = int(sl[:limit].sum()), int(tl[:limit].sum())
        buf.append((sl[limit:], tl[limit:], src[ns:], tgt[nt:]))
        sl, tl, src, tgt = sl[:limit], tl[:limit], src[:ns], tgt[:nt]
    return _write_shard(out / shard_name(k), sl, tl, src, tgt, dtype)


def shard(
    raw: Path,
    tok_dir: Path,
    out_dir: Path,
    cfg: ShardConfig,
    langs: tuple[str, str],
    synthetic: Path | None = None,
    bt: BacktranslateConfig | None = None,
    distilled: Path | None = None,
    dc: DistillConfig | None = None,
) -> dict[str, Any]:
    """The stage: every split of raw/ (train with the `synthetic` folder's back-translated
    pairs, as `bt` says, and instead of its own pairs the `distilled` folder's, as `dc` says)
    into out_dir/{split}/; returns the metrics."""
    tok = load_tokenizer(tok_dir, expect={"src_lang": langs[0], "tgt_lang": langs[1]})
    sha = tokenizer_sha256(tok_dir)
    if not (Path(raw) / f"train.{langs[0]}").exists():
        raise DataError(f"{raw}/train.{langs[0]}: missing (run the download stage first)")
    metrics: dict[str, Any] = {}
    extras: list[pairs.Extra] = []
    train = tuple(Path(raw) / f"train.{lang}" for lang in langs)
    if distilled is not None:
        train, more, metrics["distilled"] = pairs.distilled(raw, distilled, langs, dc)
        extras += more
    if synthetic is not None:
        extra, metrics["synthetic"] = pairs.synthetic(raw, synthetic, tok, tok_dir, langs, bt)
        extras += [extra] if extra else []
    t0 = time.perf_counter()
    with atomic_dir(out_dir) as tmp:
        for split in SPLITS:
            src, tgt = train if split == "train" else (Path(raw) / f"{split}.{x}" for x in langs)
            if not (src.exists() or tgt.exists()):
                continue
            use, copies = tok, 1
            if split == "train" and cfg.bpe_dropout:
                use, copies = _with_dropout(tok, tok_dir, cfg.bpe_dropout), cfg.train_copies
            more = tuple(extras) if split == "train" else ()
            metrics[split] = shard_split(
                use, src, tgt, tmp / split, cfg, sha, copies=copies, extras=more
            )
    seconds = time.perf_counter() - t0
    metrics["seconds"] = round(seconds, 2)
    metrics["pairs_per_second"] = round(
        sum(metrics[s]["pairs_in"] for s in SPLITS if s in metrics) / seconds, 1
    )
    metrics["vocabulary"] = tok.fit([Path(raw) / f"train.{lang}" for lang in langs])
    return metrics


def _with_dropout(tok: Subwords, tok_dir: Path, p: float) -> Subwords:
    """A copy of the (already checked) tokenizer that skips each merge with probability p."""
    if tok.kind != "bpe":
        raise ConfigError(
            f"shard.bpe_dropout is {p}, but {tok_dir} is a {tok.kind} tokenizer: "
            "BPE-dropout needs tokenizer.type: bpe (or set shard.bpe_dropout: 0)"
        )
    return tok.with_dropout(p)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.shard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("raw", type=Path, help="folder with {train,valid,test}.{src,tgt lang}")
    parser.add_argument("tokenizer", type=Path, help="the tokenizer stage's output folder")
    parser.add_argument("out", type=Path, help="output folder: {split}/index.json + shards")
    parser.add_argument("--metrics", type=Path, help="write the statistics here (JSON)")
    parser.add_argument(
        "--synthetic", type=Path, help="the backtranslate stage's folder: pairs mixed into train"
    )
    parser.add_argument(
        "--distilled", type=Path, help="the distill stage's folder: a student's train pairs"
    )
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    try:
        cfg = settings.load(ShardConfig, "shard", args.params)
        dl = settings.load(DownloadConfig, "download", args.params)
        bt = settings.load(BacktranslateConfig, "backtranslate", args.params)
        dc = settings.load(DistillConfig, "distill", args.params)
        langs = (dl.src_lang, dl.tgt_lang)
        metrics = shard(
            args.raw, args.tokenizer, args.out, cfg, langs, args.synthetic, bt, args.distilled, dc
        )
    except (DataError, TokenizerError, ConfigError, OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: {e}")
    if args.metrics:
        write_json(args.metrics, metrics)
    vocab = metrics.pop("vocabulary")  # one line: the full record is in the metrics file
    print(json.dumps(metrics, indent=2))
    print(f"vocabulary: {vocab['oov_rate']:.2%} of {vocab['words']} words left to single bytes")


if __name__ == "__main__":
    failure.recorded("shard", main)()
