"""Validation during training: the label-smoothed loss, NLL and perplexity on the valid
split (validate), and BLEU and chrF on its raw sentences (ValidBleu): the evaluate stage's own
decoding (translator.Translator, beam.py's batches) and scoring (scoring.score), on the model
being trained, at each validation point.

The sentences are the raw valid split's (RAW_DIR/valid.{src,tgt}, as the evaluate stage reads
them), all of them or the first train.valid_bleu_sentences. Under DDP each rank decodes a
disjoint share of the batches the evaluate stage would form (every world-th one), so that each
sentence is decoded in the very batch, and to the very hypothesis, that one process gives; the
hypotheses are gathered, rank 0 scores them, and the scores are broadcast.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from transformer.core import dist, settings
from transformer.core.ids import EOS_ID, PAD_ID
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.train import TrainConfig
from transformer.data.batches import BatchSampler, collate
from transformer.data.vocab import load_tokenizer
from transformer.model.beam import batches
from transformer.model.incremental import Decoder
from transformer.model.network import Transformer
from transformer.model.scoring import read_split, score
from transformer.model.translator import DecodeError, Translator


@torch.no_grad()
def validate(model: Transformer, dataset, cfg: TrainConfig, device, autocast) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity per target token on a split, summed over ranks."""
    model.eval()
    sampler = BatchSampler(
        dataset.src_lens, dataset.tgt_lens, cfg.max_tokens, cfg.seed, shuffle=False
    )
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for idx in list(sampler)[dist.rank() :: dist.world_size()]:  # each rank a disjoint share
        b = collate([dataset[j] for j in idx])
        tgt_out = b.tgt_out.to(device)
        with autocast():
            loss, nll = model.loss(
                b.src.to(device), b.tgt_in.to(device), tgt_out, cfg.label_smoothing
            )
        sums += torch.stack([loss.double(), nll.double(), tgt_out.ne(PAD_ID).sum().double()])
    loss, nll, n = dist.all_reduce_sum(sums).tolist()
    model.train()
    n = max(n, 1.0)
    return {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 50.0))}


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
