"""Hypotheses scored against references: sacreBLEU and chrF with their signatures, the paper's
tokenized, compound-split BLEU and the Multi30k literature's lowercased Moses-tokenized BLEU; a
split's lines read from the raw folder. The evaluate stage and training's validation BLEU score
through it, so the two never disagree."""

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

# The Multi30k papers' BLEU (fairseq's BLEU4 on the task's lc.norm.tok files, e.g. Wu et al.
# 2021's 41.02 on test2016, whose reference is 12,103 tokens): both sides lowercased, Moses
# normalize-punctuation.perl and tokenizer.perl -l LANG (sacremoses), then corpus BLEU on those
# tokens, unsmoothed (sacreBLEU with tokenize=none computes exactly fairseq's BLEU4 there).
MOSES_BLEU = "bleu_moses_lc"
MOSES_BLEU_METHOD = (
    "lowercased, Moses-normalized and -tokenized (multi30k lc.norm.tok), corpus BLEU on "
    "those tokens as fairseq's BLEU4 (the Multi30k literature's convention)"
)


def tokenize_compound_split(lines: list[str], lang: str) -> list[str]:
    """get_ende_bleu.sh's preprocessing of hypotheses and references, line by line."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    out = []
    for line in lines:
        t = tok.tokenize(norm.replace_unicode_punct(line), return_str=True, escape=True)
        out.append(COMPOUND.sub(r"\1 ##AT##-##AT## \2", t))
    return out


def tokenize_moses_lc(lines: list[str], lang: str) -> list[str]:
    """Multi30k's lc.norm.tok preprocessing (lowercase.perl, normalize-punctuation.perl -l LANG,
    tokenizer.perl -l LANG), line by line. Lowercasing first, as the task's script does, also
    changes tokens: Moses keeps a cased "Bart." whole (a German abbreviation) and splits "bart .",
    so test2016's German reference is 12,103 tokens, 12,102 tokenized cased."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    norm, tok = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [
        tok.tokenize(norm.normalize(line.lower()), return_str=True, escape=True) for line in lines
    ]


def score(
    hyps: list[str],
    refs: list[str],
    tgt_lang: str,
    tokenized_bleu: bool = True,
    moses_bleu: bool = False,
) -> dict:
    """Corpus BLEU and chrF with their sacreBLEU signatures; optionally the paper's BLEU and the
    Multi30k literature's (MOSES_BLEU, with both sides' lengths in its tokens)."""
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
    if moses_bleu:
        mb = BLEU(tokenize="none", force=True, smooth_method="none")
        got = mb.corpus_score(
            tokenize_moses_lc(hyps, tgt_lang), [tokenize_moses_lc(refs, tgt_lang)]
        )
        out[MOSES_BLEU] = round(got.score, 4)
        out[MOSES_BLEU + "_ref_tokens"] = got.ref_len
        out[MOSES_BLEU + "_hyp_tokens"] = got.sys_len
        out[MOSES_BLEU + "_method"] = MOSES_BLEU_METHOD
    return out


def read_split(raw_dir: Path, split: str, lang: str) -> list[str]:
    path = Path(raw_dir) / f"{split}.{lang}"
    if not path.is_file():
        raise DecodeError(f"{path}: no such file (evaluate.split / --split {split!r}?)")
    return files.read_lines(path, DecodeError)
