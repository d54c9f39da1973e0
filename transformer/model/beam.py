"""Greedy and batched beam search with incremental decoding (§6.1), over batches of sources;
and sampling (one draw per source from the model's distribution, for back-translation).

The encoder runs once per batch; the decoder caches each layer's self-attention keys/values and
computes the cross-attention keys/values once per sentence, shared by its beams. Sentences whose
beams have all finished leave the batch. Greedy decoding is beam_size=1 on the same path.
transformer/decode.py loads the models and holds the translate CLI.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from tqdm import tqdm

from transformer.core.ids import BOS_ID, EOS_ID, PAD_ID
from transformer.core.sections.decode import DecodeConfig
from transformer.model.incremental import NEG_INF, Decoder, Ensemble


def length_penalty(length: int | Tensor, alpha: float):
    """GNMT (Wu et al. 2016) lp(Y) = ((5 + |Y|) / 6)^α; a hypothesis scores log P(Y|X) / lp(Y)."""
    return ((5.0 + length) / 6.0) ** alpha


def beam_search(
    dec: Decoder | Ensemble,
    src: Tensor,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: Tensor | None = None,
    min_len: int = 0,
    use_cache: bool = True,
) -> list[list[int]]:
    """Best hypothesis per source row of `src` (B, S), as token ids without BOS/EOS.

    `max_len` (B,) caps each output (default S + 50, §6.1); a hypothesis reaching it ends there.
    `min_len` blocks EOS before that many tokens. `use_cache=False` recomputes the whole prefix
    at every step (the reference the cache is tested against).
    """
    finished = _finished(dec, src, beam_size, alpha, max_len, min_len, use_cache)
    return [max(f, key=lambda x: x[0])[1] if f else [] for f in finished]


def nbest_search(
    dec: Decoder | Ensemble,
    src: Tensor,
    beam_size: int,
    n: int,
    alpha: float = 0.6,
    max_len: Tensor | None = None,
    min_len: int = 0,
) -> list[list[list[int]]]:
    """The n best finished hypotheses per source row (n <= beam_size), best first: the first is
    beam_search's. Distillation keeps the one closest to the reference (mozilla's n-best)."""
    finished = _finished(dec, src, beam_size, alpha, max_len, min_len, True)
    # sorted() is stable: among equal scores the first found comes first, as max() picks it
    return [[h for _, h in sorted(f, key=lambda x: -x[0])[:n]] for f in finished]


@torch.inference_mode()
def _finished(
    dec: Decoder | Ensemble,
    src: Tensor,
    beam_size: int,
    alpha: float,
    max_len: Tensor | None,
    min_len: int,
    use_cache: bool,
) -> list[list[tuple[float, list[int]]]]:
    """Beam search (§6.1): per source row, the finished hypotheses as (score, ids), at least
    beam_size of them unless out of length."""
    B, k = src.size(0), beam_size
    if max_len is None:
        max_len = src.ne(PAD_ID).sum(1) + 50
    max_len = max_len.clamp(max=dec.max_positions).tolist()
    memory, src_pad_mask = dec.encode(src)  # on the decoder's device; the search runs on CPU
    if use_cache:
        state = dec.start(memory, src_pad_mask, k, steps=max(max_len, default=0))
    else:  # beams of a sentence are adjacent rows
        if isinstance(dec, Ensemble):
            raise ValueError("beam_search(use_cache=False) takes a single Decoder, not an Ensemble")
        memory = memory.repeat_interleave(k, dim=0)  # (B*k, S, D)
        src_pad_mask = src_pad_mask.repeat_interleave(k, dim=0)  # (B*k, S)
    rows = list(range(B))  # the original sentence of each active row
    tokens = torch.full((B * k, 1), BOS_ID, dtype=torch.long)  # (N*k, t+1)
    scores = torch.full((B, k), NEG_INF)
    scores[:, 0] = 0.0  # all beams start identical: only the first one is live at step 0
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    for t in range(max(max_len, default=0)):
        if use_cache:
            logits = dec.step(tokens[:, -1:], state)
        else:
            logits = dec.step_full(tokens, memory, src_pad_mask)
        # (N, 2k) each, brought to the CPU once a step (on a CPU: no copies)
        top, beam, tok = (
            x.cpu() for x in candidates(logits, scores.to(logits.device), block_eos=t < min_len)
        )
        N = len(rows)
        eos = tok.eq(EOS_ID) & top.isfinite()
        for n, j in eos[:, :k].nonzero().tolist():  # EOS among the k best: a finished hypothesis
            hyp = tokens[n * k + beam[n, j], 1:].tolist()
            finished[rows[n]].append((top[n, j].item() / length_penalty(t + 1, alpha), hyp))
        top, order = top.masked_fill(eos, NEG_INF).topk(k, dim=1)  # (N, k) best continuations
        beam, tok = beam.gather(1, order), tok.gather(1, order)
        origin = (torch.arange(N)[:, None] * k + beam).view(-1)  # (N*k,) row each beam comes from
        tokens = torch.cat([tokens[origin], tok.view(-1, 1)], dim=1)  # (N*k, t+2)
        scores = top
        done = []
        for n, r in enumerate(rows):
            if t + 1 >= max_len[r]:  # out of length: the live beams end here, without EOS
                lp = length_penalty(t + 1, alpha)
                finished[r] += [
                    (scores[n, j].item() / lp, tokens[n * k + j, 1:].tolist())
                    for j in range(k)
                    if scores[n, j].isfinite()
                ]
            done.append(len(finished[r]) >= k or t + 1 >= max_len[r])
        if all(done):
            break
        keep = torch.tensor([not d for d in done])
        if keep.all():
            keep = None
        else:  # drop finished sentences: later steps cost only the live ones
            rows = [r for r, d in zip(rows, done) if not d]
            scores = scores[keep]
            beam_keep = keep.repeat_interleave(k)  # (N*k,)
            tokens, origin = tokens[beam_keep], origin[beam_keep]
        if use_cache:
            dec.reorder(state, origin, keep)
        else:
            rows_on = origin.to(memory.device)
            memory, src_pad_mask = memory[rows_on], src_pad_mask[rows_on]
    return finished


@dataclass(frozen=True)
class Sampling:
    """Search by sampling instead of beam search: `topk` 0 draws from the whole distribution
    (Edunov et al. 2018's unrestricted sampling), k > 0 from its k most likely tokens."""

    topk: int = 0
    generator: torch.Generator | None = None  # on the decoder's device; None: torch's global


@torch.inference_mode()
def sample(
    dec: Decoder | Ensemble,
    src: Tensor,
    max_len: Tensor | None = None,
    topk: int = 0,
    generator: torch.Generator | None = None,
    min_len: int = 0,
) -> list[list[int]]:
    """One output per source row of `src` (B, S), each token drawn from the model's distribution
    given the prefix, until EOS or `max_len` (B,) (default S + 50); ids without BOS/EOS.
    `min_len` blocks EOS before that many tokens."""
    B = src.size(0)
    if max_len is None:
        max_len = src.ne(PAD_ID).sum(1) + 50
    max_len = max_len.clamp(max=dec.max_positions).tolist()
    memory, src_pad_mask = dec.encode(src)
    state = dec.start(memory, src_pad_mask, 1, steps=max(max_len, default=0))
    rows = list(range(B))  # the original sentence of each active row
    out: list[list[int]] = [[] for _ in range(B)]
    y = torch.full((B, 1), BOS_ID, dtype=torch.long)  # (N, 1) the last token of each row
    for t in range(max(max_len, default=0)):
        logits = dec.step(y, state).float()  # (N, V); an Ensemble's are log-probabilities
        logits[:, PAD_ID] = logits[:, BOS_ID] = NEG_INF  # never generated, as in beam search
        if t < min_len:
            logits[:, EOS_ID] = NEG_INF
        if topk:
            kth = logits.topk(min(topk, logits.size(1)), dim=1).values[:, -1:]  # (N, 1)
            logits.masked_fill_(logits < kth, NEG_INF)
        probs = torch.softmax(logits, dim=-1)
        y = torch.multinomial(probs, 1, generator=generator).cpu()  # (N, 1)
        done = []
        for n, r in enumerate(rows):
            token = int(y[n, 0])
            if token != EOS_ID:
                out[r].append(token)
            done.append(token == EOS_ID or t + 1 >= max_len[r])
        if all(done):
            break
        if any(done):  # finished sentences leave the batch
            keep = torch.tensor([not d for d in done])
            rows = [r for r, d in zip(rows, done) if not d]
            y = y[keep]
            dec.reorder(state, torch.arange(len(done))[keep], keep)
    return out


def candidates(logits: Tensor, scores: Tensor, block_eos: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The 2k best extensions per sentence: (score, beam, token), each (N, 2k), best first.

    2k so that k remain to continue even if k of them end in EOS (fairseq). A sentence's best 2k
    lie among each of its beams' own best 2k, so no (N*k, V) sum of scores and log-probabilities
    is ever formed: one softmax (for the normalizer) and one blocked top-k pass over the logits.
    """
    N, k = scores.shape
    # log P = logits - lse. softmax's vectorized kernel is ~4x faster on CPU than logsumexp, and
    # its largest entry, exp(0) / sum, is >= 1/V, so the log cannot underflow.
    lse = logits.amax(-1, keepdim=True) - torch.softmax(logits, -1).amax(-1, keepdim=True).log()
    logits[:, PAD_ID] = logits[:, BOS_ID] = NEG_INF
    if block_eos:
        logits[:, EOS_ID] = NEG_INF
    c = min(2 * k, logits.size(1))
    tok_l, tok_i = topk_rows(logits, c)  # (N*k, c)
    cand = (scores.view(-1, 1) + (tok_l - lse)).view(N, k * c)  # (N, k*c)
    top, idx = cand.topk(c, dim=1)  # (N, 2k)
    return top, idx // c, tok_i.view(N, k * c).gather(1, idx)


def topk_rows(x: Tensor, c: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """torch.topk(x, c, dim=1) for wide rows x (R, V), ~3x faster on CPU: the c largest entries
    of a row lie in its c blocks with the largest maxima, so one vectorized max pass over the
    blocks narrows the top-k pass down to c * block entries per row."""
    R, V = x.shape
    nb = V // block
    if nb <= 2 * c:
        return x.topk(c, dim=1)
    best = x[:, : nb * block].view(R, nb, block).amax(-1).topk(c, dim=1)[1]  # (R, c) blocks
    arange = partial(torch.arange, device=x.device)
    cols = (best[:, :, None] * block + arange(block)).view(R, c * block)  # (R, c*block)
    if V > nb * block:  # the short last block is always searched
        cols = torch.cat([cols, arange(nb * block, V).expand(R, -1)], dim=1)
    vals, j = x.gather(1, cols).topk(c, dim=1)  # (R, c)
    return vals, cols.gather(1, j)


def batches(lengths: list[int], batch_tokens: int) -> Iterator[list[int]]:
    """Indices sorted by length, cut into batches of at most batch_tokens source tokens (padded)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[i] > batch_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def translate_ids(
    dec: Decoder | Ensemble,
    srcs: list[list[int]],
    cfg: DecodeConfig,
    min_len: int = 0,
    max_len: int | None = None,
    progress: bool = False,
    sampling: Sampling | None = None,
) -> list[list[int]]:
    """Decode id lists (each ending in EOS) in length-sorted batches; results in input order.
    Beam search (cfg.beam_size), or with `sampling` one draw per source (cfg.beam_size unread).

    An empty source gives an empty output without touching the model.
    """
    out: list[list[int]] = [[] for _ in srcs]
    for ids, src, cap in _batched(srcs, cfg, max_len, progress):
        if sampling is None:
            hyps = beam_search(dec, src, cfg.beam_size, cfg.length_penalty, cap, min_len)
        else:
            hyps = sample(dec, src, cap, sampling.topk, sampling.generator, min_len)
        for i, h in zip(ids, hyps):
            out[i] = h
    return out


def nbest_ids(
    dec: Decoder | Ensemble, srcs: list[list[int]], cfg: DecodeConfig, n: int
) -> list[list[list[int]]]:
    """translate_ids' beam search keeping the n best hypotheses of each source, best first (an
    empty source: one empty hypothesis)."""
    out: list[list[list[int]]] = [[[]] for _ in srcs]
    for ids, src, cap in _batched(srcs, cfg, None, False):
        for i, h in zip(ids, nbest_search(dec, src, cfg.beam_size, n, cfg.length_penalty, cap)):
            out[i] = h or [[]]
    return out


def _batched(
    srcs: list[list[int]], cfg: DecodeConfig, max_len: int | None, progress: bool
) -> Iterator[tuple[list[int], Tensor, Tensor]]:
    """(indices into srcs, their padded batch (B, S), each one's output cap (B,)) per batch of
    the non-empty sources, in length order."""
    todo = [i for i, s in enumerate(srcs) if len(s) > 1 or (s and s[0] != EOS_ID)]
    bar = tqdm(total=len(srcs), unit="sent", disable=not progress, file=sys.stderr)
    bar.update(len(srcs) - len(todo))
    for b in batches([len(srcs[i]) for i in todo], cfg.batch_tokens):
        ids = [todo[j] for j in b]
        S = max(len(srcs[i]) for i in ids)
        src = torch.full((len(ids), S), PAD_ID, dtype=torch.long)  # (B, S)
        for row, i in enumerate(ids):
            src[row, : len(srcs[i])] = torch.tensor(srcs[i])
        lens = src.ne(PAD_ID).sum(1)
        if max_len is None:  # §6.1: input length + 50
            cap = (lens * cfg.max_len_a).long() + cfg.max_len_b
        else:
            cap = torch.full_like(lens, max_len)
        yield ids, src, cap
        bar.update(len(ids))
    bar.close()
