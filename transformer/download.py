"""The download stage: a corpus from any source -> clean, line-aligned train/valid/test files.

Sources (download.source): synthetic (the offline demo), local (text / TSV / JSONL / SGM files),
wmt (the WMT organisers' tarballs and SGM test sets over HTTP(S)), hf (Hugging Face `datasets`).
One streaming pass per file: read, clean, write. valid and test go first so that train pairs
overlapping them can be dropped; everything is built in a temporary folder that replaces
out_dir only when complete, and the manifest (a DVC metric) records per split and part the
lines read, kept and dropped by reason, the clean-up each split got, and the sha256 of every
output file. The monolingual part (download.monolingual: target-language text for the
backtranslate stage) goes to the --mono folder, cleaned as one side of a train pair.

valid and test reach data/raw as sacreBLEU reads the same release file (its SGM extraction
included), every pair kept: the clean-up (download.clean) changes train only unless
clean.normalize_eval / clean.filter_eval opt in, and a line that is not UTF-8 stops the stage.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from transformer.core import failure, settings
from transformer.core.files import atomic_dir, sha256_file, write_json
from transformer.core.sections.download import MONO_FILE, DownloadConfig, SourceSpec, part_clean
from transformer.core.settings import ConfigError
from transformer.data.clean import Counts, HashSet, hashes, normalize, pair_filter
from transformer.data.crawl import CRAWL_REASONS, CrawlFilter, CrawlRunner
from transformer.data.mono import clean_mono
from transformer.data.sources import SPLITS, BadText, Part, parts_for
from transformer.data.wmt import SourceError

log = logging.getLogger("transformer.download")
CHUNK = 8192  # pairs per vectorised dedup / overlap step: bounds memory, amortises numpy calls
MAX_LOGGED = 20  # invalid-UTF-8 lines logged one by one per part; the rest are only counted


class DownloadError(RuntimeError):
    """A bad source, file, archive or URL; the message names it."""


class _Eval:
    """Hashes of every valid/test source and target sentence, for the train overlap filter."""

    def __init__(self) -> None:
        self.src, self.tgt = HashSet(), HashSet()


def _checked(text, part: Part, line_no: int):
    """`text`, or a BadText if it is a str that UTF-8 cannot encode (a lone surrogate such as
    "\\ud83d" is valid JSON, but not text)."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            return BadText(part.name, line_no, e.reason)
    return text


def _one_line(text: str, split: str, where: str) -> str:
    """An eval sentence as it is, if a line file can hold it unchanged; else a DownloadError."""
    if "\n" in text or text.endswith("\r"):
        raise DownloadError(
            f"{where}: a {split} sentence holds a line break, which data/raw/{split}.* cannot "
            "keep without changing it (set download.clean.normalize_eval: true to make it a space)"
        )
    return text


def clean_part(
    part: Part, split: str, cfg: DownloadConfig, dedup: HashSet, evals: _Eval, out
) -> Counts:
    """Stream one part through the filters into the open (src, tgt) files `out`; its counts."""
    cc, is_train = cfg.clean, split == "train"
    counts, key = Counts(), f"download.splits.{split}[{part.name}].clean"
    crawl = CrawlFilter(part_clean(cc, SourceSpec(clean=part.clean), key), *_langs(cfg))
    flag_only = not is_train  # valid / test: counted, never dropped
    if crawl.active and flag_only:
        counts.flagged.update(dict.fromkeys(CRAWL_REASONS, 0))
    tally = counts.flagged if flag_only else counts.dropped
    with CrawlRunner(crawl, tally, flag_only) as runner:
        return _stream(part, split, cfg, dedup, evals, out, counts, runner)


def _stream(part, split, cfg, dedup, evals, out, counts: Counts, runner: CrawlRunner) -> Counts:
    """clean_part's loop: read, normalise and filter the pairs; the runner's survivors written."""
    cc, is_train = cfg.clean, split == "train"
    normalized, filtered = is_train or cc.normalize_eval, is_train or cc.filter_eval
    bad, chunk = 0, []
    for line_no, raw_src, raw_tgt in tqdm(
        part.open(), desc=f"{split}: {part.name}", unit=" pairs", mininterval=1.0, leave=False
    ):
        counts.read += 1
        src, tgt = (_checked(x, part, line_no) for x in (raw_src, raw_tgt))
        if not all(isinstance(x, (str, BadText)) for x in (src, tgt)):
            if src is not None or tgt is not None:  # (both None: the reader said why)
                log.warning(
                    "%s: line %d: a value that is not text, pair dropped", part.name, line_no
                )
            counts.dropped["malformed"] += 1
            continue
        invalid = next((x for x in (src, tgt) if isinstance(x, BadText)), None)
        if invalid is not None:
            if not is_train:
                raise DownloadError(
                    f"{invalid}: the {split} set is never shortened; "
                    "replace the file (or fix that line)"
                )
            bad += 1
            if bad <= MAX_LOGGED:
                log.warning("%s, pair dropped", invalid)
            counts.dropped["invalid_utf8"] += 1
            continue
        if normalized:
            src, tgt = normalize(src, cc), normalize(tgt, cc)
        else:
            where = f"{part.name}: line {line_no}"
            src, tgt = _one_line(src, split, where), _one_line(tgt, split, where)
        reason = pair_filter(src, tgt, cc) if filtered else None
        if reason:
            counts.dropped[reason] += 1
            continue
        chunk.append((src, tgt))
        if len(chunk) >= CHUNK:
            for done in runner.put(chunk):
                _flush(done, split, cfg, dedup, evals, out, counts)
            chunk = []
    for done in runner.put(chunk, last=True):
        _flush(done, split, cfg, dedup, evals, out, counts)
    if bad > MAX_LOGGED:
        log.warning("%s: %d more invalid UTF-8 lines dropped", part.name, bad - MAX_LOGGED)
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
    if split != "train":  # train is compared in its normalised form, whatever eval's is
        kept = [pair for pair, k in zip(chunk, keep) if k]
        evals.src.add(hashes([normalize(s, cc) for s, _ in kept]))
        evals.tgt.add(hashes([normalize(t, cc) for _, t in kept]))
    f_src, f_tgt = out
    for (s, t), k in zip(chunk, keep):
        if k:
            f_src.write(s + "\n")
            f_tgt.write(t + "\n")
    counts.kept += int(keep.sum())
    chunk.clear()


def _langs(cfg: DownloadConfig) -> tuple[str, str]:
    return cfg.src_lang, cfg.tgt_lang


def check_max_drop(split: str, total: Counts, per_part: dict, max_drop: float) -> None:
    """Stop the stage when one crawl filter removed more than `max_drop` of a part or of the
    split (a part checked alone: unfiltered parts beside it must not hide a wrong setting)."""
    for where, c in [*per_part.items(), ("all parts", total.as_dict())]:
        for reason in CRAWL_REASONS:
            n, read = c["dropped"][reason], c["read"]
            if read and n > max_drop * read:
                raise DownloadError(
                    f"{split}: {where}: the {reason} filter removed {n} of {read} pairs "
                    f"({n / read:.1%}), more than download.clean.max_drop ({max_drop}); "
                    "check download.src_lang / tgt_lang and the part's clean settings (or "
                    "raise max_drop if this corpus is really that noisy)"
                )


def download(cfg: DownloadConfig, out_dir: Path, mono_dir: Path | None = None) -> dict:
    """Write out_dir/{train,valid,test}.{src_lang,tgt_lang} (and mono_dir/mono.{tgt_lang});
    return the manifest."""
    if cfg.monolingual and mono_dir is None:
        raise DownloadError(
            f"download.monolingual lists {len(cfg.monolingual)} part(s), but no folder was "
            "given for them (--mono; dvc.yaml's download stage names data/mono)"
        )
    langs = (cfg.src_lang, cfg.tgt_lang)
    manifest: dict = {
        "source": cfg.source,
        "src_lang": cfg.src_lang,
        "tgt_lang": cfg.tgt_lang,
        "eval_cleanup": cfg.clean.eval_cleanup(),
        "splits": {},
    }
    evals = _Eval()
    with atomic_dir(Path(out_dir)) as tmp:
        for split in ("valid", "test", "train"):  # eval sets first: train is filtered against them
            total, per_part, dedup = Counts(), {}, HashSet()
            paths = [tmp / f"{split}.{lang}" for lang in langs]
            with (
                open(paths[0], "w", encoding="utf-8", newline="\n") as fs,
                open(paths[1], "w", encoding="utf-8", newline="\n") as ft,
            ):
                for part in parts_for(cfg, split):
                    c = clean_part(part, split, cfg, dedup, evals, (fs, ft))
                    per_part[part.name] = c.as_dict()
                    total.add(c)
            check_max_drop(split, total, per_part, cfg.clean.max_drop)
            if total.kept == 0:
                raise DownloadError(f"{split}: no pairs left after cleaning ({total.as_dict()})")
            manifest["splits"][split] = {
                **total.as_dict(),
                "parts": per_part,
                "files": {p.name: {"lines": total.kept, "sha256": sha256_file(p)} for p in paths},
            }
            log.info("%s: kept %d of %d pairs", split, total.kept, total.read)
        if mono_dir is not None:  # inside out_dir's atomic_dir: a failure here writes neither
            manifest["monolingual"] = monolingual(cfg, Path(mono_dir), evals)
    return manifest


def monolingual(cfg: DownloadConfig, mono_dir: Path, evals: _Eval) -> dict:
    """Write mono_dir/mono.{tgt_lang} (empty without parts); the manifest's record of it."""
    with atomic_dir(mono_dir) as tmp:
        path = tmp / MONO_FILE.format(lang=cfg.tgt_lang)
        with open(path, "w", encoding="utf-8", newline="\n") as out:
            total, per_part = clean_mono(cfg, evals.tgt, out)
        check_max_drop("monolingual", total, per_part, cfg.clean.max_drop)
        if cfg.monolingual and total.kept == 0:
            raise DownloadError(f"monolingual: no lines left after cleaning ({total.as_dict()})")
        files = {path.name: {"lines": total.kept, "sha256": sha256_file(path)}}
    return {**total.as_dict(), "parts": per_part, "files": files}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.download",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out_dir", type=Path, help="where {train,valid,test}.{src,tgt} go")
    parser.add_argument("--manifest", type=Path, help="write the manifest (JSON) here")
    parser.add_argument(
        "--mono", type=Path, help="where mono.{tgt_lang} goes (download.monolingual's text)"
    )
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="default: params.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = settings.load(DownloadConfig, "download", args.params)
        manifest = download(cfg, args.out_dir, args.mono)
    except (ConfigError, DownloadError, SourceError, OSError) as e:
        sys.exit(f"error: {e}")
    if args.manifest:
        write_json(args.manifest, manifest)
    for split in SPLITS:
        s = manifest["splits"][split]
        print(f"{split}: {s['kept']} pairs kept of {s['read']} read")
    if manifest.get("monolingual", {}).get("read"):
        s = manifest["monolingual"]
        print(f"monolingual: {s['kept']} lines kept of {s['read']} read")


if __name__ == "__main__":
    failure.recorded("download", main)()
