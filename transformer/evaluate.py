"""Translate a split and score it: sacreBLEU and chrF (with signatures), plus the paper's BLEU.

    python -m transformer.evaluate MODEL TOKENIZER RAW_DIR OUT_DIR --metrics METRICS.json
    python -m transformer.evaluate data/model.pt data/tokenizer data/raw data/eval
    python -m transformer.evaluate data/model.pt data/tokenizer data/raw /tmp/eval
        --split valid test --beam-size 1 4 --metrics /tmp/eval/metrics.json
    python -m transformer.evaluate data/model.pt data/tokenizer data/raw /tmp/eval
        --ensemble ../seed2/data/model.pt    # two runs' models decoding as one ensemble

`bleu` is detokenized sacreBLEU, the number to compare across papers today. The paper's
27.3/28.4 (Table 2) are tensor2tensor's get_ende_bleu.sh: Moses-tokenized, compounds split
as "a ##AT##-##AT## b", multi-bleu.perl; that is `bleu_tok_compound_split`, comparable only to
numbers computed the same way. `bleu_moses_lc` is the Multi30k literature's: lowercased,
Moses-tokenized, fairseq's BLEU4 on those tokens (its reference length in tokens beside it).
Hypotheses go to OUT_DIR/hyps.{split}.txt; `evaluate.extra_splits` scores more sets the same
way, under `sets` in the metrics (the promotion gate checks each).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from transformer.core import allocator, failure, settings
from transformer.core.files import atomic_write, sha256_file
from transformer.core.metrics import KEYS, put
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.evaluate import EvaluateConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import TokenizerError, tokenizer_sha256
from transformer.decode import add_decode_args, decode_config, write_lines
from transformer.model.checkpoint import CheckpointError
from transformer.model.checkpoint import load as load_checkpoint
from transformer.model.scoring import MOSES_BLEU, TOK_BLEU, read_split, score
from transformer.model.translator import (
    DecodeError,
    Translator,
    load_translator,
    pick_device,
    timed,
)


def lineage(model_path: Path, tokenizer_dir: Path, ensemble: Sequence[Path] = ()) -> dict:
    """Which model (the checkpoints it averages; the models it was ensembled with, each the
    same way) and which tokenizer produced the numbers."""
    out = _model_lineage(model_path)
    out["tokenizer_sha256"] = tokenizer_sha256(tokenizer_dir)
    if ensemble:
        out["ensemble"] = [_model_lineage(p) for p in ensemble]
    return out


def _model_lineage(path: Path) -> dict:
    ckpt = load_checkpoint(path, mmap=True)
    averaged = ckpt.get("averaged") or []
    return {
        "model": str(path),
        "model_sha256": sha256_file(path),
        "step": int(ckpt["step"]),
        "averaged_checkpoints": [a["path"] for a in averaged],
        "averaged_steps": [a["step"] for a in averaged],
    }


def set_sha256(files: list[Path]) -> str:
    """The scored set's identity: one hash over its source and reference files (a score is only
    comparable with one of the same set; the promotion gate checks it)."""
    lines = "".join(f"{f.name}={sha256_file(f)}\n" for f in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def evaluate_split(
    tr: Translator,
    raw_dir: Path,
    out_dir: Path,
    split: str,
    langs: tuple,
    ev: EvaluateConfig,
    hyps_name: str,
    progress: bool = True,
    cleanup: str = "none",
) -> dict:
    """Translate raw_dir/{split}.{src}, save the hypotheses, score them against {split}.{tgt}."""
    src, refs = (read_split(raw_dir, split, lang) for lang in langs)
    if len(src) != len(refs):
        raise DecodeError(
            f"{raw_dir}: {split}.{langs[0]} has {len(src)} lines, "
            f"{split}.{langs[1]} has {len(refs)}"
        )
    hyps, seconds = timed(tr, src, progress)
    write_lines(out_dir / hyps_name, hyps)
    cfg = tr.cfg
    files = [Path(raw_dir) / f"{split}.{lang}" for lang in langs]
    scores = score(hyps, refs, langs[1], ev.tokenized_bleu, moses_bleu=True)
    contract = {f: scores.pop(f) for f in ("bleu", "chrf", "bleu_signature", "chrf_signature")}
    out = put({}, KEYS, split=split, test_sha256=set_sha256(files), **contract)
    return {
        **out,
        "n_sentences": len(src),
        **scores,
        "reference_cleanup": cleanup,  # "none": the references as released
        "beam_size": cfg.beam_size,
        "length_penalty": cfg.length_penalty,
        "precision": cfg.precision,
        "hyps": hyps_name,
        "device": tr.dec.device.type,  # what decode_seconds were measured on
        "decode_seconds": round(seconds, 2),
        "sentences_per_second": round(len(src) / max(seconds, 1e-9), 2),
    }


def run(args: argparse.Namespace) -> dict:
    params = args.params or settings.PARAMS
    ev = settings.load(EvaluateConfig, "evaluate", params)
    dl = settings.load(DownloadConfig, "download", params)
    base: DecodeConfig = decode_config(args)
    splits, beams = args.split or [ev.split], args.beam_size or [base.beam_size]
    langs = (dl.src_lang, dl.tgt_lang)
    runs = {}
    tr = load_translator(
        args.model, args.tokenizer, base, base.precision, args.ensemble, pick_device(args.device)
    )
    for k in beams:
        tr = replace(tr, cfg=replace(base, beam_size=k))
        for split in splits:
            tag = split if len(beams) == 1 else f"{split}.beam{k}"
            runs[tag] = evaluate_split(
                tr,
                args.raw_dir,
                args.out_dir,
                split,
                langs,
                ev,
                f"hyps.{tag}.txt",
                not args.no_progress,
                dl.clean.eval_cleanup(),
            )
            r = runs[tag]
            tok = f" tokenized compound-split BLEU {r[TOK_BLEU]:.2f}" if TOK_BLEU in r else ""
            tok += f" lowercased Moses-tokenized BLEU {r[MOSES_BLEU]:.2f}"
            print(f"{tag}: BLEU {r['bleu']:.2f} chrF {r['chrf']:.2f}{tok}", file=sys.stderr)
    # one run: a flat record (what dvc metrics show lists); several: one record per tag
    out = next(iter(runs.values())) if len(runs) == 1 else runs
    if len(runs) == 1 and not args.split and ev.extra_splits:  # the stage's further test sets
        out["sets"] = {
            s: evaluate_split(
                tr,
                args.raw_dir,
                args.out_dir,
                s,
                langs,
                ev,
                f"hyps.{s}.txt",
                not args.no_progress,
                dl.clean.eval_cleanup(),
            )
            for s in ev.extra_splits
        }
        for s, r in out["sets"].items():
            print(f"{s}: BLEU {r['bleu']:.2f} chrF {r['chrf']:.2f}", file=sys.stderr)
    lin = lineage(args.model, args.tokenizer, args.ensemble)
    provenance = {
        "model_sha256": lin.pop("model_sha256"),
        "tokenizer_sha256": lin.pop("tokenizer_sha256"),
        "checkpoints_averaged": lin.pop("averaged_checkpoints"),
    }
    return put({**out, "lineage": lin}, KEYS, **provenance)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", type=Path, help="checkpoint (trained or averaged)")
    parser.add_argument("tokenizer", type=Path, help="tokenizer directory")
    parser.add_argument("raw_dir", type=Path, help="folder with {split}.{src_lang,tgt_lang}")
    parser.add_argument("out_dir", type=Path, help="where hyps.{split}.txt are written")
    parser.add_argument("--metrics", type=Path, help="metrics JSON to write")
    parser.add_argument("--split", nargs="+", help="split(s) to score; default: evaluate.split")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_decode_args(parser, multi=True)
    args = parser.parse_args(argv)
    allocator.keep_freed_memory()  # see there: 2x decoding speed on glibc
    try:
        metrics = run(args)
    except (DecodeError, CheckpointError, ConfigError, TokenizerError) as e:
        sys.exit(f"error: {e}")
    text = json.dumps(metrics, indent=2, ensure_ascii=False) + "\n"
    if args.metrics:
        with atomic_write(args.metrics, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    failure.recorded("evaluate", main)()
