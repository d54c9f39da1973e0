"""Each sentence pair's cross-entropy under a model reading it with teacher forcing: what the score
stage measures the training corpus with (dual conditional cross-entropy, Junczys-Dowmunt 2018).

One forward pass per batch and no search: the model's own loss (Transformer.loss, the chunked
output projection and cross-entropy of ops.output_loss) writes each target token's NLL, which is
summed per sentence and divided by its length (EOS included): nats per target token, H(y|x).
Pairs are read in large batches of similar lengths (sorted by the longer side), in inference
mode, on every core torch uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from transformer.core.ids import EOS_ID
from transformer.core.layout import MODEL, TOKENIZER
from transformer.data.batches import collate
from transformer.data.vocab import Subwords, load_tokenizer, tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.network import Transformer
from transformer.model.precision import resolve_precision


@dataclass
class Scorer:
    """A package's model and tokenizer, ready to score on `device` in `precision`."""

    model: Transformer
    tokenizer: Subwords
    device: torch.device
    precision: str  # fp32 | bf16 (autocast: GEMMs bf16, the loss's statistics fp32)


def load_scorer(package: Path, precision: str = "fp32", device: str = "auto") -> Scorer:
    """The model of a package folder (model.pt + tokenizer/), checked to belong together;
    `device` auto: the (current) CUDA GPU where torch sees one, else the CPU."""
    package = Path(package)
    tok = load_tokenizer(package / TOKENIZER)
    ckpt = checkpoint.load(package / MODEL, mmap=True)
    model = checkpoint.build_model(ckpt, package / MODEL)
    want = ckpt.get("tokenizer_sha256")
    if (want and want != tokenizer_sha256(package / TOKENIZER)) or tok.size != model.vocab_size:
        raise checkpoint.CheckpointError(
            f"{package / TOKENIZER}: not the tokenizer {package / MODEL} was trained with"
        )
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(auto if device == "auto" else device)
    precision = resolve_precision(precision, dev, "score.precision")
    return Scorer(model.to(dev).eval(), tok, dev, precision)


def encode(tok: Subwords, lines: list[str], max_len: int) -> list[np.ndarray]:
    """Each line's ids with EOS, cut to `max_len` (the model's positions) where longer."""
    return [np.array((ids + [EOS_ID])[:max_len], np.int64) for ids in tok.encode(lines)]


def length_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int) -> Iterator:
    """Index arrays of pairs sorted by their longer side, each batch at most `max_tokens`
    padded positions per side (a longer pair alone)."""
    longest = np.maximum(src_lens, tgt_lens)
    order = np.argsort(longest, kind="stable")
    start = 0
    for k in range(1, len(order) + 1):
        # sorted ascending: the batch's padded length is its last pair's
        if k == len(order) or (k - start + 1) * longest[order[k]] > max_tokens:
            yield order[start:k]
            start = k


def cross_entropy(
    scorer: Scorer,
    src: list[str],
    tgt: list[str],
    batch_tokens: int = 16384,
    desc: str = "scoring",
) -> np.ndarray:
    """H(tgt | src) of each pair: the model's mean NLL per target token (nats, EOS included),
    teacher-forced, one forward pass per batch; (N,) float64."""
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} sources but {len(tgt)} targets")
    max_len = scorer.model.cfg.max_positions
    s_ids, t_ids = encode(scorer.tokenizer, src, max_len), encode(scorer.tokenizer, tgt, max_len)
    s_lens = np.array([len(x) for x in s_ids], np.int64)
    t_lens = np.array([len(x) for x in t_ids], np.int64)
    out = np.zeros(len(src), np.float64)
    dev = scorer.device
    autocast = torch.autocast(dev.type, torch.bfloat16, enabled=scorer.precision == "bf16")
    batches = list(length_batches(s_lens, t_lens, batch_tokens))
    with torch.inference_mode(), autocast:
        for idx in tqdm(batches, desc=desc, unit=" batches", mininterval=5.0, leave=False):
            b = collate([(s_ids[i], t_ids[i]) for i in idx]).to(dev)
            lens = torch.from_numpy(t_lens[idx]).to(dev)
            n = int(t_lens[idx].sum())
            nll = torch.empty(n, dtype=torch.float32, device=dev)
            # label smoothing 0: the loss is the NLL; rows: the non-pad targets, row-major
            scorer.model.loss(b.src, b.tgt_in, b.tgt_out, 0.0, n_targets=n, row_nll=nll)
            owner = torch.repeat_interleave(torch.arange(len(idx), device=dev), lens)
            sums = torch.zeros(len(idx), dtype=torch.float64, device=dev)
            sums.index_add_(0, owner, nll.double())
            out[idx] = (sums / lens).cpu().numpy()
    return out
