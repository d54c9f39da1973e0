"""Sequence-level knowledge distillation (Kim & Rush 2016): the train sources translated by the
teacher (the champion of the line a student declares as its teacher), so that the student
learns the teacher's translations instead of the references.

    python -m transformer.distill data/corpus data/helpers/teacher data/distill \\
        --chunks data/distill.chunks --metrics data/metrics/distill.json

The search is distill.search: the teacher's beam search, or its n-best list with the hypothesis
closest to the reference kept (distill.metric, sentence-level chrF or BLEU), as
mozilla/translations selects. The text is translated chunk_lines lines at a time, each finished
chunk kept under --chunks (transformer/model/chunked.py, shared with back-translation): a killed
run resumes after its last whole chunk, and DVC caches the output, so a second `dvc repro`
translates nothing; it translates again only when the teacher, the train data or these settings
change. The output, distilled.{src,tgt}, holds each source and its translation (empty ones left
out); the shard stage trains on it instead of the references (with them, distill.mix_originals).
A line with no teacher (params.yaml helpers.teacher empty: not a student) gets no pairs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer.core import allocator, failure, settings
from transformer.core.files import atomic_dir, count_lines, sha256_file, write_json
from transformer.core.layout import MODEL, TOKENIZER
from transformer.core.sections.distill import DISTILLED, STAGE_KEYS, DistillConfig
from transformer.core.sections.download import DownloadConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import TokenizerError, read_meta, tokenizer_sha256
from transformer.model import chunked

if TYPE_CHECKING:
    from transformer.model.translator import Translator

log = logging.getLogger("transformer.distill")
NONE = "NONE"  # the file of a helper's folder that holds no model, saying why (the helpers stage)


class DistillError(RuntimeError):
    """A missing or mismatched input (corpus, teacher, direction); the message names it."""


def fingerprint(
    files: list[Path], teacher: Path, cfg: DistillConfig, langs: tuple[str, str], model_sha: str
) -> str:
    """A hash of everything the translations depend on: the chunk folder's name."""
    return chunked.key(
        {
            "text": [sha256_file(f) for f in files],
            "model": model_sha,
            "tokenizer": tokenizer_sha256(teacher / TOKENIZER),
            "settings": {k: asdict(cfg)[k] for k in STAGE_KEYS},
            "langs": list(langs),
        }
    )


def check_direction(teacher: Path, langs: tuple[str, str]) -> dict[str, Any]:
    """The teacher's tokenizer meta, refused unless it translates src_lang -> tgt_lang."""
    try:
        meta = read_meta(teacher / TOKENIZER)
    except TokenizerError as e:
        raise DistillError(str(e)) from None
    have = (meta.get("src_lang"), meta.get("tgt_lang"))
    if have != langs:
        raise DistillError(
            f"{teacher / TOKENIZER}/meta.json: a {have[0]}->{have[1]} model; a teacher of a "
            f"{langs[0]}->{langs[1]} student translates {langs[0]}->{langs[1]}"
        )
    return meta


def closest(hyps: list[str], ref: str, metric: Any) -> str:
    """The hypothesis with the best sentence-level score against `ref`; of equals, the first
    (the teacher's own order)."""
    scores = [metric.sentence_score(h, [ref]).score for h in hyps]
    return hyps[max(range(len(hyps)), key=scores.__getitem__)]


def translator(tr: Translator, cfg: DistillConfig, tgt_lang: str):
    """fn(i, [sources, references]) -> the chunk's kept translations, as cfg.search says."""
    if cfg.search == "beam":
        return lambda i, parts: tr.translate(parts[0])
    from sacrebleu.metrics import BLEU, CHRF

    metric = CHRF() if cfg.metric == "chrf" else BLEU(trg_lang=tgt_lang, effective_order=True)

    def one(i: int, parts: list[list[str]]) -> list[str]:
        lists = tr.translate_nbest(parts[0], cfg.nbest)
        return [closest(hyps, ref, metric) for hyps, ref in zip(lists, parts[1])]

    return one


def assemble(
    src: Path, folder: Path, out_dir: Path, cfg: DistillConfig, langs: tuple[str, str]
) -> dict[str, int]:
    """out_dir/distilled.{src,tgt}: each source and its translation, empty translations left out."""
    kept = empty = 0
    with atomic_dir(out_dir) as tmp:
        paths = [tmp / DISTILLED.format(lang=lang) for lang in langs]
        with (
            open(paths[0], "w", encoding="utf-8", newline="\n") as fs,
            open(paths[1], "w", encoding="utf-8", newline="\n") as ft,
        ):
            for i, lines in enumerate(chunked.read_chunks(src, cfg.chunk_lines)):
                for line, tgt in zip(lines, chunked.translations(folder, i, langs[1])):
                    if not tgt.strip():
                        empty += 1
                        continue
                    fs.write(line + "\n")
                    ft.write(tgt + "\n")
                    kept += 1
    return {"pairs": kept, "empty_dropped": empty}


def empty_output(out_dir: Path, langs: tuple[str, str]) -> None:
    with atomic_dir(out_dir) as tmp:
        for lang in langs:
            (tmp / DISTILLED.format(lang=lang)).write_text("")


def distill(
    corpus: Path,
    teacher: Path,
    out_dir: Path,
    chunks: Path,
    cfg: DistillConfig,
    langs: tuple[str, str],
) -> dict[str, Any]:
    """The stage: translate corpus/train.{src} with the package `teacher` into out_dir; metrics."""
    files = [Path(corpus) / f"train.{lang}" for lang in langs]  # sources, references
    teacher = Path(teacher)
    for f in files:
        if not f.is_file():
            raise DistillError(f"{f}: missing (run the score stage first)")
    n_lines = count_lines(files[0])
    if count_lines(files[1]) != n_lines:
        raise DistillError(f"{files[0]} and {files[1]}: not line-aligned")
    record: dict[str, Any] = {"lines": n_lines, **{k: asdict(cfg)[k] for k in STAGE_KEYS}}
    if not teacher.is_dir():
        raise DistillError(f"{teacher}: no such folder (the teacher's package)")
    why = None
    if not (teacher / MODEL).is_file():  # the helpers stage's NONE says why
        none = teacher / NONE
        why = none.read_text().strip() if none.is_file() else f"no {MODEL} in {teacher}"
    elif n_lines == 0:
        why = "no train pairs"
    if why:
        log.info("nothing to distill: %s", why)
        empty_output(out_dir, langs)
        return {**record, "pairs": 0, "teacher": None, "skipped": why}
    meta = check_direction(teacher, langs)
    model_sha = sha256_file(teacher / MODEL)
    folder = chunked.folder(chunks, fingerprint(files, teacher, cfg, langs, model_sha))
    tr = chunked.load(teacher, cfg, DistillError)
    fn = translator(tr, cfg, langs[1])
    # n-best: the references ride along (line-aligned), for the sentence-level choice
    read = files if cfg.search == "nbest" else files[:1]
    stats = chunked.translate(read, n_lines, folder, cfg.chunk_lines, langs[1], fn, "distill")
    pairs = assemble(files[0], folder, out_dir, cfg, langs)
    chunked.finish(chunks, folder)
    return {
        **record,
        **pairs,
        **stats,
        "device": tr.dec.device.type,
        "teacher": chunked.used(teacher, model_sha, meta),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.distill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("corpus", type=Path, help="the score stage's folder (train.{src,tgt})")
    parser.add_argument("teacher", type=Path, help="the teacher's package folder")
    parser.add_argument("out", type=Path, help="output folder: distilled.{src,tgt lang}")
    parser.add_argument("--chunks", type=Path, required=True, help="finished chunks, for resuming")
    parser.add_argument("--metrics", type=Path, help="write the counts here (JSON)")
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    allocator.keep_freed_memory()  # see there: 2x decoding speed on glibc
    try:
        cfg = settings.load(DistillConfig, "distill", args.params)
        dl = settings.load(DownloadConfig, "download", args.params)
        langs = (dl.src_lang, dl.tgt_lang)
        metrics = distill(args.corpus, args.teacher, args.out, args.chunks, cfg, langs)
    except (DistillError, ConfigError, TokenizerError, OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: {e}")
    if args.metrics:
        write_json(args.metrics, metrics)
    print(f"distill: {metrics['pairs']} pairs of the teacher's of {metrics['lines']} train lines")


if __name__ == "__main__":
    failure.recorded("distill", main)()
