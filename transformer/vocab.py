"""A trained tokenizer directory (tokenizer.json + meta.json): load it, check it, hash it.

Apart from the trainer (transformer/tokenizer.py), so that the stages that only read a
tokenizer (shard, train, decode) do not rerun when the trainer changes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from transformer.files import sha256_file
from transformer.ids import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID

FORMAT = 1  # meta.json's format
# WordPiece's continuation marker. Not "##": "#" is in the byte alphabet, so a word-initial
# "##" token would be indistinguishable from a continuation. "▸" is outside the alphabet.
CONT = "\u25b8"


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


def load_tokenizer(tok_dir: Path, expect: Mapping[str, Any] | None = None) -> Tokenizer:
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
    return tok
