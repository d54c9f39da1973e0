"""The pairs a split is made of, read line-aligned: a split's own files, and the pairs the train
split takes besides (Extra): back-translated ones (the backtranslate stage's, tagged) and a
student's (the distill stage's teacher translations, which replace the references). The shard
stage's; torch-free."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer.core.files import count_lines
from transformer.core.sections.backtranslate import SYNTHETIC, BacktranslateConfig
from transformer.core.sections.distill import DISTILLED, DistillConfig
from transformer.data.batches import DataError
from transformer.data.vocab import Subwords


def line_chunks(src: Path, tgt: Path, size: int):
    """Line-aligned chunks ([src lines], [tgt lines]); a length mismatch is an error."""
    with (
        open(src, encoding="utf-8", newline="\n") as fs,
        open(tgt, encoding="utf-8", newline="\n") as ft,
    ):
        line = 0
        while True:
            a, b = read(fs, src, line, size), read(ft, tgt, line, size)
            if len(a) != len(b):
                short, n = (src, len(a)) if len(a) < len(b) else (tgt, len(b))
                raise DataError(
                    f"{short}: ends at line {line + n}, but its other side goes on "
                    f"({src.name} and {tgt.name} must be line-aligned)"
                )
            if not a:
                return
            line += len(a)
            yield a, b


@dataclass(frozen=True)
class Extra:
    """More pairs for a split: the first `n` lines of the files src and tgt, each source led by
    the ids `prefix` (a back-translation tag)."""

    src: Path
    tgt: Path
    n: int
    prefix: tuple[int, ...] = ()

    def chunks(self, size: int):
        """Its (src lines, tgt lines, prefix) chunks."""
        left, chunks = self.n, line_chunks(self.src, self.tgt, size)
        try:
            for a, b in chunks:
                if left <= 0:
                    return
                yield a[:left], b[:left], self.prefix
                left -= len(a)
        finally:
            chunks.close()  # its files, now rather than when collected


def read(f, path: Path, line: int, size: int) -> list[str]:
    try:
        return [x.rstrip("\n") for x in itertools.islice(f, size)]
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 after line {line} ({e.reason})") from None


def synthetic(
    raw: Path,
    folder: Path,
    tok: Subwords,
    tok_dir: Path,
    langs: tuple[str, str],
    bt: BacktranslateConfig | None,
) -> tuple[Extra | None, dict[str, Any]]:
    """The back-translated pairs the train split takes (the first ratio x train pairs of the
    folder's), and their record for the metrics."""
    bt = bt or BacktranslateConfig()
    src, tgt = (Path(folder) / SYNTHETIC.format(lang=lang) for lang in langs)
    if not src.is_file() or not tgt.is_file():
        raise DataError(f"{src}: missing (run the backtranslate stage first)")
    available, real = count_lines(src), count_lines(Path(raw) / f"train.{langs[0]}")
    n = min(available, int(bt.ratio * real))
    prefix: tuple[int, ...] = ()
    if bt.tag and n:
        tag_id = tok.special_id(bt.tag)
        if tag_id is None:
            raise DataError(
                f"{tok_dir}: no {bt.tag!r} unit (backtranslate.tag): the tokenizer stage adds "
                "it; run that stage again"
            )
        prefix = (tag_id,)
    record = {"available": available, "pairs": n, "ratio": bt.ratio, "tag": bt.tag or None}
    return (Extra(src, tgt, n, prefix) if n else None), record


def distilled(
    raw: Path, folder: Path, langs: tuple[str, str], dc: DistillConfig | None
) -> tuple[tuple[Path, Path], list[Extra], dict[str, Any]]:
    """(the train split's files, the pairs it takes besides, their record): the teacher's pairs
    with the originals (as distill.mix_originals says) where the folder holds any, else raw's."""
    dc = dc or DistillConfig()
    src, tgt = (Path(folder) / DISTILLED.format(lang=lang) for lang in langs)
    if not src.is_file() or not tgt.is_file():
        raise DataError(f"{src}: missing (run the distill stage first)")
    own = (Path(raw) / f"train.{langs[0]}", Path(raw) / f"train.{langs[1]}")
    pairs = count_lines(src)
    if not pairs:  # not a student
        return own, [], {"pairs": 0}
    originals = count_lines(own[0]) if dc.mix_originals else 0
    more = [Extra(*own, originals)] if originals else []
    return (
        (src, tgt),
        more,
        {"pairs": pairs, "mix_originals": dc.mix_originals, "originals": originals},
    )
