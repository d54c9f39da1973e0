"""Train the subword vocabulary: joint BPE (paper en-de, §5.1), WordPiece (paper en-fr) or
Unigram (SentencePiece's algorithm, Kudo 2018).

One vocabulary is shared by source and target (§3.4 shares the embedding matrices too). Every
type works on bytes (GPT-2's byte-level alphabet), so every line encodes without `<unk>` and
decodes back exactly: `decode(encode(x)) == x`. Special tokens have fixed ids (transformer/core/ids.py);
a back-translation tag (backtranslate.tag, e.g. "<BT>") is one more, after the trained units:
the shard stage puts it before each synthetic source by id, as text never becomes it.

    python -m transformer.tokenizer data/raw data/tokenizer --metrics data/metrics/tokenizer.json
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from transformer.core import failure, settings
from transformer.core.files import atomic_dir, atomic_write, read_lines, sha256_file, write_json
from transformer.core.ids import SPECIALS, UNK_ID
from transformer.core.layout import TOKENIZER
from transformer.core.sections.backtranslate import BacktranslateConfig
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.retrain import RetrainConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import (
    CONT,
    FORMAT,
    Subwords,
    TokenizerError,
    check_specials,
    load_tokenizer,
)

TYPES = ("bpe", "wordpiece", "unigram")
BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 byte symbols, sorted: deterministic
MARK = "\x01"  # never in a byte-level word (byte 1 is "ā" there): _train_unigram's marker
SEED_SIZE = 1_000_000  # UnigramTrainer's seed_size (not settable from Python): its most pieces


def min_vocab_size(kind: str) -> int:
    """Specials + the byte alphabet (WordPiece needs each byte word-initial and continuing)."""
    return len(SPECIALS) + len(BYTES) * (2 if kind == "wordpiece" else 1)


def _skeleton(model: models.Model, kind: str) -> Tokenizer:
    tok = Tokenizer(model)
    # A space before every line, so a sentence-initial word is the same unit as a medial one
    # (SentencePiece's dummy prefix); the decoder strips exactly this one space again.
    tok.normalizer = normalizers.Prepend(" ")
    # GPT-2 byte-level split: spaces attach to the next word ("Ġword"), punctuation and digits
    # are their own pre-tokens (much like the Moses tokenization the paper's BPE ran on).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    steps = [decoders.ByteLevel(), decoders.Strip(" ", 1, 0)]
    if kind == "wordpiece":  # pieces concatenate once the continuation marker is gone
        steps.insert(0, decoders.Replace(CONT, ""))
    tok.decoder = decoders.Sequence(steps)
    tok.encode_special_tokens = True  # "</s>" in the text is text, not EOS
    return tok


def train_tokenizer(files: list[Path], cfg: TokenizerConfig) -> Tokenizer:
    """Train a `cfg.type` vocabulary of (at most) `cfg.vocab_size` units on `files`, streamed."""
    if cfg.type not in TYPES:
        raise TokenizerError(f"tokenizer.type must be one of {TYPES}, got {cfg.type!r}")
    if cfg.vocab_size < min_vocab_size(cfg.type):
        raise TokenizerError(
            f"tokenizer.vocab_size {cfg.vocab_size} is smaller than the alphabet: {cfg.type} "
            f"needs at least {min_vocab_size(cfg.type)} (4 specials + 256 bytes"
            + (" x 2 forms)" if cfg.type == "wordpiece" else ")")
        )
    for f in files:
        if not f.exists():
            raise TokenizerError(f"{f}: no such training file")
        if f.stat().st_size == 0:
            raise TokenizerError(f"{f}: the training split is empty")
    common = {
        "vocab_size": cfg.vocab_size,
        "min_frequency": cfg.min_frequency,
        "special_tokens": SPECIALS,  # added first, in order: ids 0..3
        "initial_alphabet": BYTES,  # every byte is a unit, so nothing is ever <unk>
        "show_progress": sys.stderr.isatty(),
    }
    if cfg.type == "bpe":
        tok = _skeleton(models.BPE(unk_token=SPECIALS[UNK_ID]), "bpe")
        trainer = trainers.BpeTrainer(**common)
    elif cfg.type == "unigram":  # prunes a large seed vocabulary by EM: no min_frequency
        del common["min_frequency"], common["vocab_size"]
        tok = _train_unigram(files, cfg.vocab_size, common)
    else:
        tok = _skeleton(models.WordPiece(unk_token=SPECIALS[UNK_ID]), "wordpiece")
        # The trainer numbers new continuation units in hash-map order, and merge ties are
        # broken by id: fixing their ids up front (as extra specials) makes training
        # deterministic. They become ordinary units again in _complete_wordpiece.
        common["special_tokens"] = SPECIALS + [CONT + b for b in BYTES]
        trainer = trainers.WordPieceTrainer(**common, continuing_subword_prefix=CONT)
    if cfg.type != "unigram":  # Rust reads the files line by line: word counts, never the corpus
        try:
            tok.train([str(f) for f in files], trainer)
        except Exception as e:  # noqa: BLE001 (tokenizers raises a bare Exception naming no file)
            raise TokenizerError(f"{', '.join(map(str, files))}: {e}") from None
    if cfg.type == "wordpiece":
        tok = _skeleton(_complete_wordpiece(tok, cfg.vocab_size), "wordpiece")
        tok.add_special_tokens(SPECIALS)  # already ids 0..3 of the vocabulary
    elif cfg.type == "unigram":
        tok = _skeleton(_canonical_unigram(tok, cfg.vocab_size), "unigram")
        tok.add_special_tokens(SPECIALS)
    check_specials(tok, "trained tokenizer")
    return tok


def _train_unigram(files: list[Path], vocab_size: int, common: dict[str, Any]) -> Tokenizer:
    """The trainer on the corpus's byte-level words, cut to `vocab_size` by score afterwards.

    The trainer prunes by EM only while it holds more than 1.1 x its vocab_size pieces, then
    keeps the first vocab_size in *list* order (SentencePiece keeps the most likely). When no
    prune ran, that order is the seed's (type frequency x length from a suffix array), so a
    small corpus loses its most frequent short words: on the demo "at", "on", "PM", "um" went
    to "Ġ" + letters while numbers seen 12 times ("992") stayed (issue 59). So it is first
    asked for every piece (no prune, no cut: EM on the whole seed) and, unless its loop would
    prune, that is cut by score in _canonical_unigram; only a corpus whose seed outgrows the
    loop's stop is trained again with vocab_size, where the order is the prune's (by loss)."""
    counts = _words(files)
    # Seed candidates come from a suffix array over the *distinct* words: only substrings that
    # recur there followed by different characters, so a frequent word that starts no other
    # word ("Ich") is never one (sentencepiece#967); given once more with MARK after it, it is.
    counts.update({w + MARK: 1 for w, n in counts.items() if n > 1})
    tok = _fit_unigram(counts, SEED_SIZE + len(BYTES) + len(SPECIALS) + 1, common)
    size = vocab_size + 1  # MARK's unit, dropped afterwards
    # The trainer's loop stops at 1.1 x its size: more pieces than that (<unk> one), it prunes.
    if sum(len(p) > 1 for p in tok.get_vocab() if p not in SPECIALS) + 1 > size * 11 // 10:
        tok = _fit_unigram(counts, size, common)
    return tok


def _words(files: list[Path]) -> Counter[str]:
    """The files' byte-level words (the skeleton's normalizer and pre-tokenizer), counted.
    Python splits them (~0.1 ms a line), once for both of _train_unigram's trainer runs."""
    words, counts = _skeleton(models.Unigram(), "unigram"), Counter()
    for f in files:
        try:
            with open(f, encoding="utf-8", newline="\n") as lines:  # \n alone ends a line
                for line in lines:
                    text = words.normalizer.normalize_str(line.removesuffix("\n"))
                    counts.update(w for w, _ in words.pre_tokenizer.pre_tokenize_str(text))
        except UnicodeDecodeError:
            raise TokenizerError(f"{f}: not UTF-8") from None
    return counts


def _fit_unigram(counts: Counter[str], size: int, common: dict[str, Any]) -> Tokenizer:
    """UnigramTrainer(vocab_size=size) on the counted words. It takes text only: each word is
    given n times, space-separated (byte-level words hold no whitespace), in chunks."""

    def text():
        for w, n in counts.items():
            for k in range(0, n, 10_000):
                yield " ".join(itertools.repeat(w, min(n - k, 10_000)))

    trainer = trainers.UnigramTrainer(**common, vocab_size=size, unk_token=SPECIALS[UNK_ID])
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(text(), trainer)
    return tok


def _complete_wordpiece(tok: Tokenizer, vocab_size: int) -> models.WordPiece:
    """Every byte in both forms (so greedy matching never fails), trimmed to `vocab_size`."""
    vocab = tok.get_vocab(with_added_tokens=False)
    pieces = sorted(vocab, key=vocab.__getitem__)  # id order: specials, alphabet, merges
    known = set(pieces)
    missing = [p for b in BYTES for p in (b, CONT + b) if p not in known]
    units = set(SPECIALS) | set(BYTES) | {CONT + b for b in BYTES}
    # Drop the last-learned merges to make room: they are the rarest.
    merges = [p for p in pieces if p not in units]
    keep = vocab_size - len(SPECIALS) - 2 * len(BYTES)
    ordered = [p for p in pieces if p in units] + missing + merges[:keep]
    return models.WordPiece(
        vocab={p: i for i, p in enumerate(ordered)},
        unk_token=SPECIALS[UNK_ID],
        continuing_subword_prefix=CONT,
        max_input_chars_per_word=1_000_000,  # the default 100 would turn long words into <unk>
    )


def _canonical_unigram(tok: Tokenizer, vocab_size: int) -> models.Unigram:
    """The trained pieces in a fixed order with fixed scores. The trainer sums its statistics in
    hash-map order, so scores differ in their last bits from run to run, and it scores the bytes
    it never saw in the data lowest, 1e-4 apart, in hash-set order: rounded, those bytes tied,
    and sorted by (score, piece), training is deterministic."""
    vocab = json.loads(tok.to_str())["model"]["vocab"]  # [[piece, log prob], ...], specials first
    specials = vocab[: len(SPECIALS)]
    pieces = [(p, v) for p, v in vocab[len(SPECIALS) :] if MARK not in p]  # _train_unigram's
    floor = min(v for _, v in pieces)
    unseen = floor + 1e-4 * (len(BYTES) + 1)  # the unseen bytes' scores lie below this
    scored = [(p, round(floor if len(p) == 1 and v < unseen else v, 6)) for p, v in pieces]
    scored.sort(key=lambda x: (-x[1], x[0]))
    # SentencePiece's final cut: the least likely pieces go, never a byte.
    excess = len(specials) + len(scored) - vocab_size
    multi = [i for i, (p, _) in enumerate(scored) if len(p) > 1]
    drop = set(multi[len(multi) - max(excess, 0) :])
    scored = [x for i, x in enumerate(scored) if i not in drop]
    return models.Unigram([tuple(x) for x in specials] + scored, unk_id=UNK_ID)


def training_sha256(files: list[Path]) -> str:
    """One hash over the files' names, sizes and contents (streamed, ~1 s per GB)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{f.stat().st_size}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def save_tokenizer(tok: Tokenizer, out_dir: Path, meta: dict) -> None:
    """Write tokenizer.json, then meta.json (with tokenizer.json's hash), each atomically."""
    out_dir = Path(out_dir)
    with atomic_write(out_dir / "tokenizer.json", "w", encoding="utf-8") as f:
        f.write(tok.to_str(pretty=True))
    added = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
    meta = {
        "format": FORMAT,
        **meta,
        "vocab_size": tok.get_vocab_size(),
        "special_tokens": {
            s: tok.token_to_id(s) for s in SPECIALS + sorted(set(added) - {*SPECIALS})
        },
        "tokenizer_sha256": sha256_file(out_dir / "tokenizer.json"),
        "tokenizers_version": tokenizers.__version__,
    }
    write_json(out_dir / "meta.json", meta)


def stats(tok: Subwords, lines: dict[str, list[str]]) -> dict[str, Any]:
    """Per language: mean tokens per sentence, <unk> share, round-trip exact-match rate."""
    out: dict[str, Any] = {}
    for lang, text in lines.items():
        ids = tok.encode(text)
        back = tok.decode(ids)
        n_tok = sum(map(len, ids))
        out[lang] = {
            "sentences": len(text),
            "mean_tokens": round(n_tok / max(len(text), 1), 3),
            "unk_share": sum(i.count(UNK_ID) for i in ids) / max(n_tok, 1),
            "roundtrip_exact": sum(a == b for a, b in zip(text, back)) / max(len(text), 1),
        }
    return out


def keep(
    parent: Path, out_dir: Path, cfg: TokenizerConfig, langs: tuple[str, str], tag: str = ""
) -> Subwords:
    """A continued run's tokenizer: the parent's files as they are (not retrained), checked."""
    expect = {"type": cfg.type, "min_frequency": cfg.min_frequency}
    tok = load_tokenizer(parent, {**expect, "src_lang": langs[0], "tgt_lang": langs[1]})
    if tag and tok.special_id(tag) is None:
        raise TokenizerError(
            f"{parent}: the parent's tokenizer has no {tag!r} unit (backtranslate.tag), and a "
            "continued run keeps it as it is: retrain from scratch (retrain.mode) or drop the tag"
        )
    with atomic_dir(out_dir) as tmp:
        for name in ("tokenizer.json", "meta.json"):
            (tmp / name).write_bytes((Path(parent) / name).read_bytes())
    return tok


def build(
    raw: Path,
    out_dir: Path,
    cfg: TokenizerConfig,
    langs: tuple[str, str],
    parent: Path | None = None,
    tag: str = "",
) -> dict:
    """The stage: train on raw/train.{src,tgt} (or keep the tokenizer folder `parent`), save to
    out_dir, return the metrics. `tag`: a special token added after the trained units."""
    files = [Path(raw) / f"train.{lang}" for lang in langs]
    if parent is not None:
        tok = keep(parent, out_dir, cfg, langs, tag)
    else:
        tok = train_tokenizer(files, cfg)
        if tag:
            if tag in SPECIALS:
                raise TokenizerError(f"backtranslate.tag {tag!r} is one of the fixed {SPECIALS}")
            tok.add_special_tokens([tag])  # the next id: the trained units keep theirs
        meta = {
            "type": cfg.type,
            "src_lang": langs[0],
            "tgt_lang": langs[1],
            "min_frequency": cfg.min_frequency,
            "train_files": [f.name for f in files],
            "train_sha256": training_sha256(files),
        }
        with atomic_dir(out_dir) as tmp:
            save_tokenizer(tok, tmp, meta)
        tok = Subwords(tok, cfg.type)
    valid = {
        lang: read_lines(Path(raw) / f"valid.{lang}", TokenizerError)
        for lang in langs
        if (Path(raw) / f"valid.{lang}").exists()
    }
    kept = {"kept_from": str(parent)} if parent is not None else {}
    return {
        "type": cfg.type,
        "vocab_size": tok.size,
        **kept,
        "valid": stats(tok, valid),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.tokenizer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("raw", type=Path, help="folder with {train,valid}.{src_lang,tgt_lang}")
    parser.add_argument("out", type=Path, help="output folder: tokenizer.json + meta.json")
    parser.add_argument("--metrics", type=Path, help="write the statistics here (JSON)")
    parser.add_argument(
        "--parent",
        type=Path,
        help="the parent package folder: with retrain.mode continue its tokenizer/ is kept",
    )
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    try:
        cfg = settings.load(TokenizerConfig, "tokenizer", args.params)
        dl = settings.load(DownloadConfig, "download", args.params)
        mode = settings.load(RetrainConfig, "retrain", args.params).mode
        parent = args.parent / TOKENIZER if args.parent and mode == "continue" else None
        tag = settings.load(BacktranslateConfig, "backtranslate", args.params).tag
        metrics = build(args.raw, args.out, cfg, (dl.src_lang, dl.tgt_lang), parent, tag)
    except (TokenizerError, ConfigError, OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: {e}")
    if args.metrics:
        write_json(args.metrics, metrics)
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    failure.recorded("tokenizer", main)()
