"""Hypotheses scored against references: sacreBLEU and chrF with their signatures, and the
paper's tokenized, compound-split BLEU; a split's lines read from the raw folder. The evaluate
stage and training's validation BLEU score through it, so the two never disagree."""

from __future__ import annotations

import re
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF

from transformer.core import files
from transformer.model.translator import DecodeError

TOK_BLEU = "bleu_tok_compound_split"

# tensor2tensor's get_ende_bleu.sh: Moses replace-unicode-punctuation + tokenizer.perl -l LANG
# (here sacremoses), compounds split as ##AT##-##AT##, then multi-bleu.perl (sacreBLEU with
# tokenize=none). Comparable to the paper's 27.3/28.4, not to sacreBLEU.
TOK_BLEU_METHOD = "tensor2tensor get_ende_bleu.sh (tokenized, compound-split; paper-comparable)"

COMPOUND = re.compile(r"(\S)-(\S)")  # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'


def tokenize_compound_split(lines: list[str], lang: str) -> list[str]:
    """get_ende_bleu.sh's preprocessing of hypotheses and references, line by line."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    out = []
    for line in lines:
        t = tok.tokenize(norm.replace_unicode_punct(line), return_str=True, escape=True)
        out.append(COMPOUND.sub(r"\1 ##AT##-##AT## \2", t))
    return out


def score(hyps: list[str], refs: list[str], tgt_lang: str, tokenized_bleu: bool = True) -> dict:
    """Corpus BLEU and chrF with their sacreBLEU signatures; optionally the paper's BLEU."""
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    bleu, chrf = BLEU(trg_lang=tgt_lang), CHRF()
    out = {
        "bleu": round(bleu.corpus_score(hyps, [refs]).score, 4),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": round(chrf.corpus_score(hyps, [refs]).score, 4),
        "chrf_signature": str(chrf.get_signature()),
    }
    if tokenized_bleu:
        # multi-bleu.perl: BLEU on the given tokens, no smoothing, no further tokenization
        tb = BLEU(tokenize="none", force=True, smooth_method="none")
        h, r = tokenize_compound_split(hyps, tgt_lang), tokenize_compound_split(refs, tgt_lang)
        out[TOK_BLEU] = round(tb.corpus_score(h, [r]).score, 4)
        out[TOK_BLEU + "_method"] = TOK_BLEU_METHOD
    return out


def read_split(raw_dir: Path, split: str, lang: str) -> list[str]:
    path = Path(raw_dir) / f"{split}.{lang}"
    if not path.is_file():
        raise DecodeError(f"{path}: no such file (evaluate.split / --split {split!r}?)")
    return files.read_lines(path, DecodeError)
