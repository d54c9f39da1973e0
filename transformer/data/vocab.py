"""A trained tokenizer directory (tokenizer.json + meta.json): load it, check it, hash it, use it.

The seam between the stages and the tokenizer library: shard, train, decode and evaluate see a
`Subwords` (lines <-> ids, its size, how well it covers new text), never HF's `Tokenizer`. A new
tokenizer type is a trainer in transformer/tokenizer.py and, if its files differ, a loader here.
Apart from the trainer, so that the stages that only read a tokenizer do not rerun when the
trainer changes.

    python -m transformer.data.vocab fit data/parent/tokenizer data/raw/train.en data/raw/train.de

prints the kept tokenizer's fit to new text (JSON): the retrain flow's out-of-vocabulary probe.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models

from transformer.core.files import sha256_file
from transformer.core.ids import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID

FORMAT = 1  # meta.json's format
# WordPiece's continuation marker. Not "##": "#" is in the byte alphabet, so a word-initial
# "##" token would be indistinguishable from a continuation. "▸" is outside the alphabet.
CONT = "\u25b8"
OOV_SAMPLE = 200_000  # lines of each file the vocabulary fit is measured on


class TokenizerError(ValueError):
    """A tokenizer problem, naming the file or the parameter."""


def check_specials(tok: Tokenizer, where: str) -> None:
    got = [tok.token_to_id(s) for s in SPECIALS]
    if got != [PAD_ID, BOS_ID, EOS_ID, UNK_ID]:
        raise TokenizerError(f"{where}: special token ids {dict(zip(SPECIALS, got))} are not 0..3")


def read_meta(tok_dir: Path) -> dict[str, Any]:
    """meta.json of a tokenizer directory, with a clear error when missing or unreadable."""
    path = Path(tok_dir) / "meta.json"
    if not path.exists():
        raise TokenizerError(f"{path}: missing (run the tokenizer stage first)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise TokenizerError(f"{path}: not a format-{FORMAT} tokenizer meta file")
    return meta


def tokenizer_sha256(tok_dir: Path) -> str:
    """Hash of tokenizer.json: recorded by the shards and checkpoints made with it."""
    return sha256_file(Path(tok_dir) / "tokenizer.json")


class Subwords:
    """A checked tokenizer as the stages use it: lines to ids and back, exactly."""

    def __init__(self, tok: Tokenizer, kind: str):
        self._tok, self.kind = tok, kind
        self.size = tok.get_vocab_size()  # units, specials included: the model's vocabulary

    def encode(self, lines: list[str]) -> list[list[int]]:
        """The ids of each line (no EOS); Rust, parallel over all cores."""
        return [e.ids for e in self._tok.encode_batch_fast(lines)]

    def decode(self, ids: list[list[int]]) -> list[str]:
        """The text of each id sequence, special tokens dropped; decode(encode(x)) == x."""
        return self._tok.decode_batch(ids, skip_special_tokens=True)

    def special_id(self, token: str) -> int | None:
        """The id of special token `token` (e.g. a back-translation tag), or None if it has none."""
        for i, added in self._tok.get_added_tokens_decoder().items():
            if added.content == token and added.special:
                return i
        return None

    def library_copy(self) -> Tokenizer:
        """A copy of the HF `Tokenizer` itself, for exporting it to another library."""
        return Tokenizer.from_str(self._tok.to_str())

    def with_dropout(self, p: float) -> Subwords:
        """A copy that skips each BPE merge with probability p (BPE-dropout; BPE only)."""
        tok = Tokenizer.from_str(self._tok.to_str())
        if not isinstance(tok.model, models.BPE):
            raise TokenizerError(
                f"BPE-dropout {p} needs a bpe tokenizer, this one is {self.kind} "
                "(set shard.bpe_dropout: 0 or tokenizer.type: bpe)"
            )
        tok.model.dropout = p
        tok.encode_special_tokens = True
        return Subwords(tok, self.kind)

    def fit(self, files: list[Path], sample: int = OOV_SAMPLE) -> dict[str, Any]:
        """The words (pre-tokens of 2+ bytes) that no unit covers, left to single bytes, among
        the first `sample` lines of each file. With a kept tokenizer (retrain.mode continue) it
        measures how new the new data is; a byte-level tokenizer never emits <unk>, so this is
        its out-of-vocabulary rate."""
        tok, words = self._tok, Counter()
        for f in files:
            with open(f, encoding="utf-8", newline="\n") as fh:
                for line in itertools.islice(fh, sample):
                    text = tok.normalizer.normalize_str(line.rstrip("\n"))
                    words.update(w for w, _ in tok.pre_tokenizer.pre_tokenize_str(text))
        long = {w: n for w, n in words.items() if len(w) > 1}  # byte-level: one char per byte
        oov = {
            w: n
            for w, n in long.items()
            if all(len(t.value.removeprefix(CONT)) == 1 for t in tok.model.tokenize(w))
        }
        n_words, n_oov = sum(long.values()), sum(oov.values())
        top = sorted(oov, key=lambda w: (-oov[w], w))[:10]
        to_text = decoders.ByteLevel()
        return {
            "words": n_words,
            "oov_words": n_oov,
            "oov_rate": n_oov / max(n_words, 1),
            "oov_types": len(oov),
            "oov_examples": [to_text.decode([w]).strip() for w in top],
        }


def load_tokenizer(tok_dir: Path, expect: Mapping[str, Any] | None = None) -> Subwords:
    """Load and check a tokenizer directory; `expect` ({meta key: value}) must match meta.json."""
    tok_dir = Path(tok_dir)
    meta = read_meta(tok_dir)
    path = tok_dir / "tokenizer.json"
    if not path.exists():
        raise TokenizerError(f"{path}: missing (run the tokenizer stage first)")
    if (digest := sha256_file(path)) != meta.get("tokenizer_sha256"):
        raise TokenizerError(
            f"{path}: sha256 {digest[:12]}... does not match meta.json's "
            f"{str(meta.get('tokenizer_sha256'))[:12]}... (a tokenizer.json from another run?)"
        )
    for key, want in (expect or {}).items():
        if meta.get(key) != want:
            raise TokenizerError(
                f"{tok_dir}/meta.json: {key} is {meta.get(key)!r}, expected {want!r}"
            )
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception on bad JSON
        raise TokenizerError(f"{path}: cannot be loaded ({e})") from None
    if tok.get_vocab_size() != meta.get("vocab_size"):
        raise TokenizerError(
            f"{path}: {tok.get_vocab_size()} units, meta.json says {meta.get('vocab_size')}"
        )
    check_specials(tok, str(path))
    tok.encode_special_tokens = True  # not serialized by `tokenizers`: set on every load
    return Subwords(tok, str(meta.get("type")))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m transformer.data.vocab", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fit", help="the words of FILES a tokenizer leaves to single bytes (JSON)")
    p.add_argument("tokenizer", type=Path, help="a tokenizer folder (tokenizer.json + meta.json)")
    p.add_argument("files", type=Path, nargs="+", help="text files, one sentence a line")
    args = parser.parse_args(argv)
    try:
        fit = load_tokenizer(args.tokenizer).fit(args.files)
    except (TokenizerError, OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: {e}")
    print(json.dumps(fit))


if __name__ == "__main__":
    main()
