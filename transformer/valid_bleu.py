"""BLEU and chrF on the valid split during training: the evaluate stage's own decoding
(decode.Translator, beam.py's batches) and sacreBLEU scoring (evaluate.score), on the model being
trained, at each validation point.

The sentences are the raw valid split's (RAW_DIR/valid.{src,tgt}, as the evaluate stage reads
them), all of them or the first train.valid_bleu_sentences. Under DDP each rank decodes a
disjoint share of the batches the evaluate stage would form (every world-th one), so that each
sentence is decoded in the very batch, and to the very hypothesis, that one process gives; the
hypotheses are gathered, rank 0 scores them, and the scores are broadcast.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from transformer import dist, settings
from transformer.beam import batches
from transformer.decode import DecodeError, Translator
from transformer.evaluate import read_split, score
from transformer.ids import EOS_ID
from transformer.incremental import Decoder
from transformer.model import Transformer
from transformer.sections.decode import DecodeConfig
from transformer.sections.download import DownloadConfig
from transformer.sections.train import TrainConfig
from transformer.vocab import load_tokenizer


@dataclass
class ValidText:
    """The valid sentences scored during training, and how they are decoded and scored."""

    src: list[str]
    refs: list[str]
    tgt_lang: str  # sacreBLEU's trg_lang, as the evaluate stage passes it
    decode: DecodeConfig  # params `decode`, with train.valid_bleu_beam_size's beam


def load_valid_text(raw_dir: Path, tcfg: TrainConfig, params: Path) -> ValidText:
    """RAW_DIR/valid.{src_lang,tgt_lang} (the first train.valid_bleu_sentences where > 0) and
    params.yaml's `decode` settings, the beam size train.valid_bleu_beam_size's (0: decode's)."""
    dl = settings.load(DownloadConfig, "download", params)
    dec = settings.load(DecodeConfig, "decode", params)
    src, refs = (read_split(raw_dir, "valid", lang) for lang in (dl.src_lang, dl.tgt_lang))
    if len(src) != len(refs):
        raise DecodeError(
            f"{raw_dir}: valid.{dl.src_lang} has {len(src)} lines, "
            f"valid.{dl.tgt_lang} has {len(refs)}"
        )
    if n := tcfg.valid_bleu_sentences:  # a fixed subset: the first n, the same at every point
        src, refs = src[:n], refs[:n]
    beam = tcfg.valid_bleu_beam_size or dec.beam_size
    return ValidText(src, refs, dl.tgt_lang, replace(dec, beam_size=beam))


class ValidBleu:
    """valid/bleu and valid/chrf of a model, and the seconds spent on them."""

    def __init__(self, text: ValidText, tokenizer_dir: Path, device: torch.device):
        self.text, self.device = text, device
        self.tokenizer = load_tokenizer(tokenizer_dir)

    def __call__(self, model: Transformer) -> dict[str, float]:
        """{"bleu", "chrf", "bleu_seconds"}: the same on every rank (rank 0's)."""
        t0 = time.perf_counter()
        text, cfg = self.text, self.text.decode
        dec = Decoder(model, cfg.precision, self.device)  # a copy: the model is left training
        tr = Translator(dec, self.tokenizer, cfg, dec.max_positions)
        ids = tr.encode(text.src)
        # the sentences translate_ids decodes (the rest translate to ""), in its batches
        todo = [i for i, s in enumerate(ids) if len(s) > 1 or (s and s[0] != EOS_ID)]
        groups = list(batches([len(ids[i]) for i in todo], cfg.batch_tokens))
        mine: dict[int, str] = {}
        for g in groups[dist.rank() :: dist.world_size()]:
            rows = [todo[j] for j in g]  # length-sorted: translate_ids keeps them one batch
            mine.update(zip(rows, tr.translate([text.src[i] for i in rows])))
        del dec, tr
        out = None
        shares = dist.all_gather_object(mine)
        if dist.is_main():
            hyps = [""] * len(text.src)
            for share in shares:
                for i, h in share.items():
                    hyps[i] = h
            s = score(hyps, text.refs, text.tgt_lang, tokenized_bleu=False)
            out = {"bleu": s["bleu"], "chrf": s["chrf"]}
        out = dist.broadcast_object(out)
        return {**out, "bleu_seconds": time.perf_counter() - t0}
