"""The download stage: a corpus from any source -> clean, line-aligned train/valid/test files.

Sources (download.source): synthetic (the offline demo), local (text / TSV / JSONL / SGM files),
wmt (the WMT organisers' tarballs and SGM test sets over HTTP(S)), hf (Hugging Face `datasets`).
One streaming pass per file: read, clean, write. valid and test go first so that train pairs
overlapping them can be dropped; everything is built in a temporary folder that replaces
out_dir only when complete, and the manifest (a DVC metric) records per split and part the
lines read, kept and dropped by reason, plus the sha256 of every output file.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from transformer import config
from transformer.clean import Counts, HashSet, hashes, normalize, pair_filter
from transformer.config import ConfigError, DownloadConfig
from transformer.files import atomic_dir, sha256_file, write_json
from transformer.sources import SPLITS, Part, SourceError, parts_for

log = logging.getLogger("transformer.download")
CHUNK = 8192  # pairs per vectorised dedup / overlap step: bounds memory, amortises numpy calls
MAX_LOGGED = 20  # invalid-UTF-8 lines logged one by one per part; the rest are only counted


class DownloadError(RuntimeError):
    """A bad source, file, archive or URL; the message names it."""


class _Eval:
    """Hashes of every valid/test source and target sentence, for the train overlap filter."""

    def __init__(self) -> None:
        self.src, self.tgt = HashSet(), HashSet()


def _decode(text: str | bytes, part: Part, line_no: int, bad: list[int]) -> str | None:
    try:
        if isinstance(text, str):
            text.encode("utf-8")  # a lone surrogate ("\ud83d" is valid JSON) is not text
            return text
        return text.decode("utf-8").rstrip("\r\n")
    except (UnicodeDecodeError, UnicodeEncodeError) as e:
        if len(bad) < MAX_LOGGED:
            log.warning(
                "%s: line %d: invalid UTF-8 (%s), pair dropped", part.name, line_no, e.reason
            )
        bad.append(line_no)
        return None


def clean_part(
    part: Part, split: str, cfg: DownloadConfig, dedup: HashSet, evals: _Eval, out
) -> Counts:
    """Stream one part through the filters into the open (src, tgt) files `out`; its counts."""
    cc, is_train = cfg.clean, split == "train"
    counts, bad, chunk = Counts(), [], []
    for line_no, raw_src, raw_tgt in tqdm(
        part.open(), desc=f"{split}: {part.name}", unit=" pairs", mininterval=1.0, leave=False
    ):
        counts.read += 1
        if not all(isinstance(x, (str, bytes)) for x in (raw_src, raw_tgt)):
            if raw_src is not None or raw_tgt is not None:  # (both None: the reader said why)
                log.warning("%s: line %d: a value that is not text, pair dropped", part.name,
                            line_no)
            counts.dropped["malformed"] += 1
            continue
        src = _decode(raw_src, part, line_no, bad)  # tgt only then: a line is logged once
        tgt = _decode(raw_tgt, part, line_no, bad) if src is not None else None
        if src is None or tgt is None:
            counts.dropped["invalid_utf8"] += 1
            continue
        src, tgt = normalize(src, cc), normalize(tgt, cc)
        reason = pair_filter(src, tgt, cc, lengths=is_train or cc.filter_eval)
        if reason:
            counts.dropped[reason] += 1
            continue
        chunk.append((src, tgt))
        if len(chunk) >= CHUNK:
            _flush(chunk, split, cfg, dedup, evals, out, counts)
    _flush(chunk, split, cfg, dedup, evals, out, counts)
    if len(bad) > MAX_LOGGED:
        log.warning("%s: %d more invalid UTF-8 lines dropped", part.name, len(bad) - MAX_LOGGED)
    return counts


def _flush(
    chunk: list, split: str, cfg: DownloadConfig, dedup: HashSet, evals: _Eval, out, counts: Counts
) -> None:
    """Dedup / overlap-filter a chunk of normalised pairs (vectorised) and write the survivors."""
    if not chunk:
        return
    cc, keep = cfg.clean, np.ones(len(chunk), dtype=bool)
    src_h, tgt_h = hashes([s for s, _ in chunk]), hashes([t for _, t in chunk])
    if split == "train" and cc.drop_eval_overlap:
        overlap = evals.src.contains(src_h) | evals.tgt.contains(tgt_h)
        counts.dropped["eval_overlap"] += int(overlap.sum())
        keep &= ~overlap
    if cc.dedup and (split == "train" or cc.filter_eval):
        pair_h = hashes([f"{s}\n{t}" for s, t in chunk])  # "\n" never occurs inside a side
        fresh = np.zeros(len(chunk), dtype=bool)
        fresh[keep] = dedup.add_new(pair_h[keep])
        counts.dropped["duplicate"] += int((keep & ~fresh).sum())
        keep = fresh
    if split != "train":
        evals.src.add(src_h[keep])
        evals.tgt.add(tgt_h[keep])
    f_src, f_tgt = out
    for (s, t), k in zip(chunk, keep):
        if k:
            f_src.write(s + "\n")
            f_tgt.write(t + "\n")
    counts.kept += int(keep.sum())
    chunk.clear()


def download(cfg: DownloadConfig, out_dir: Path) -> dict:
    """Write out_dir/{train,valid,test}.{src_lang,tgt_lang}; return the manifest."""
    langs = (cfg.src_lang, cfg.tgt_lang)
    manifest: dict = {
        "source": cfg.source,
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "splits": {},
    }
    evals = _Eval()
    with atomic_dir(Path(out_dir)) as tmp:
        for split in ("valid", "test", "train"):  # eval sets first: train is filtered against them
            total, per_part, dedup = Counts(), {}, HashSet()
            paths = [tmp / f"{split}.{lang}" for lang in langs]
            with (
                open(paths[0], "w", encoding="utf-8") as fs,
                open(paths[1], "w", encoding="utf-8") as ft,
            ):
                for part in parts_for(cfg, split):
                    c = clean_part(part, split, cfg, dedup, evals, (fs, ft))
                    per_part[part.name] = c.as_dict()
                    total.add(c)
            if total.kept == 0:
                raise DownloadError(f"{split}: no pairs left after cleaning ({total.as_dict()})")
            manifest["splits"][split] = {
                **total.as_dict(),
                "parts": per_part,
                "files": {p.name: {"lines": total.kept, "sha256": sha256_file(p)} for p in paths},
            }
            log.info("%s: kept %d of %d pairs", split, total.kept, total.read)
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.download",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out_dir", type=Path, help="where {train,valid,test}.{src,tgt} go")
    parser.add_argument("--manifest", type=Path, help="write the manifest (JSON) here")
    parser.add_argument("--params", type=Path, default=config.PARAMS, help="default: params.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        manifest = download(config.load(DownloadConfig, "download", args.params), args.out_dir)
    except (ConfigError, DownloadError, SourceError, OSError) as e:
        sys.exit(f"error: {e}")
    if args.manifest:
        write_json(args.manifest, manifest)
    for split in SPLITS:
        s = manifest["splits"][split]
        print(f"{split}: {s['kept']} pairs kept of {s['read']} read")


if __name__ == "__main__":
    main()
