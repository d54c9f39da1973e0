"""The GPU check's workload and contenders (benchmarks/gpu/check.py): batches of realistic WMT
lengths, this project's model, HF MarianMTModel of the same shape and weights, and a plain
torch.nn.Transformer, each as a training step and (ours and HF) as beam search.

Ids are the project's (PAD 0, BOS 1, EOS 2); Marian is configured with the same ids (pad 0,
decoder start 1, eos 2), so every contender reads the same tensors.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.core.ids import BOS_ID, EOS_ID, PAD_ID
from transformer.core.sections.model import ModelConfig
from transformer.data.batches import BatchSampler, collate
from transformer.export import NORMS, marian_config
from transformer.model.beam import batches as decode_batches
from transformer.model.beam import beam_search
from transformer.model.incremental import Decoder
from transformer.model.network import Transformer, sdpa_backends, sinusoids

# Table 3 base and big (dropout as the presets), and a tiny one for the reduced CPU mode
SHAPES = {
    "base": {"d_model": 512, "d_ff": 2048, "n_heads": 8, "n_layers": 6, "dropout": 0.1},
    "big": {"d_model": 1024, "d_ff": 4096, "n_heads": 16, "n_layers": 6, "dropout": 0.3},
    "tiny": {"d_model": 32, "d_ff": 64, "n_heads": 2, "n_layers": 2, "dropout": 0.1},
}
EPS = 0.1  # label smoothing (§5.4)
# Sentence lengths in subword units: log-normal source lengths and a log-normal target/source
# ratio, (mu, sigma, ratio mu, ratio sigma), fitted to the whitespace-token counts of
# ../shared/data (wmt-sample: training data; newstest2013: a test set) and scaled by an assumed
# 1.3 subword units per token of a 37k joint BPE (+ log 1.3 = 0.26 on mu). EOS is added.
TRAIN_LENGTHS = (3.25, 0.53, -0.05, 0.26)
TEST_LENGTHS = (3.01, 0.64, -0.03, 0.19)


class Work(NamedTuple):
    """A training batch on the device, with its non-pad target tokens counted once on the host."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    n_tgt: int


def pair_lengths(n: int, law: tuple, seed: int, max_len: int = 256) -> tuple[np.ndarray, ...]:
    """(src, tgt) lengths of n pairs, EOS included, at most max_len (shard.max_len)."""
    mu, sigma, r_mu, r_sigma = law
    rng = np.random.default_rng(seed)
    src = np.exp(rng.normal(mu, sigma, n))
    tgt = src * np.exp(rng.normal(r_mu, r_sigma, n))
    return tuple(np.clip(np.rint(x), 1, max_len - 1).astype(np.int64) + 1 for x in (src, tgt))


def random_ids(rng: np.random.Generator, length: int, vocab: int) -> np.ndarray:
    """length - 1 ordinary units and EOS."""
    return np.append(rng.integers(4, vocab, length - 1), EOS_ID)


# Pairs whose lengths the check draws: a real corpus's count (WMT14 en-de: 4.5M), so that long
# buckets fill as they do in a real run (20,000 pairs left static batches' targets 55-73% real)
PAIRS = 1 << 20


@functools.lru_cache(maxsize=8)
def sampler(max_tokens: int, static: bool, pairs: int = PAIRS, seed: int = 0) -> BatchSampler:
    """The train stage's sampler over `pairs` pairs of TRAIN_LENGTHS (cached: seconds to build)."""
    return BatchSampler(*lengths(pairs, seed), max_tokens, seed, static=static)


@functools.lru_cache(maxsize=2)
def lengths(pairs: int, seed: int) -> tuple[np.ndarray, ...]:
    return pair_lengths(pairs, TRAIN_LENGTHS, seed)


def draw_stats(max_tokens: int, static: bool, pairs: int = PAIRS, seed: int = 0) -> dict:
    """An epoch of the check's batches: shapes, and the share of padded positions holding tokens
    (both sides, as the train stage logs it; and of the targets alone, which tokens/s counts)."""
    s = sampler(max_tokens, static, pairs, seed)
    tgt = lengths(pairs, seed)[1]
    if static:
        padded = sum(r * L for r, L in s.shapes)
    else:
        padded = sum(len(b) * int(tgt[b].max()) for b in s.batches)
    return {"pairs": pairs, **s.stats, "tgt_pad_efficiency": round(int(tgt.sum()) / padded, 4)}


def train_batches(
    vocab: int,
    max_tokens: int,
    n: int,
    device: torch.device | None,
    seed: int = 0,
    static: bool = False,
    pairs: int = PAIRS,
) -> list[Work]:
    """n batches as the train stage makes them (BatchSampler: max_tokens padded positions per
    side, length-bucketed, or of static shapes; shuffled) from `pairs` pairs of TRAIN_LENGTHS,
    random units; on `device` (None: left on the host, for the train stage's update to copy)."""
    src_lens, tgt_lens = lengths(pairs, seed)
    rng = np.random.default_rng(seed + 1)
    out = []
    smp = sampler(max_tokens, static, pairs, seed)
    smp.set_epoch(0)
    for idx in smp:
        b = collate(
            [
                (random_ids(rng, src_lens[i], vocab), random_ids(rng, tgt_lens[i], vocab))
                for i in idx
            ],
            smp.shape,
        )
        b = b if device is None else b.to(device)
        out.append(Work(*b, int(b.tgt_out.ne(PAD_ID).sum())))
        if len(out) == n:
            return out
    raise ValueError(f"fewer than {n} batches of {max_tokens} tokens in {pairs:,} pairs")


def test_set(n: int, vocab: int, seed: int = 2) -> tuple[list[list[int]], list[int]]:
    """n source sentences of TEST_LENGTHS (ids, EOS last) and each one's reference length."""
    src_lens, tgt_lens = pair_lengths(n, TEST_LENGTHS, seed)
    rng = np.random.default_rng(seed + 1)
    return [random_ids(rng, s, vocab).tolist() for s in src_lens], tgt_lens.tolist()


# ----------------------------------------------------------------------------- the models
def ours(shape: str, vocab: int, device: torch.device, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**SHAPES[shape]), vocab).to(device)


def n_params(model: nn.Module) -> int:
    """Trainable parameters, a shared matrix once (what MFU's 6·N·tokens counts)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def mfu_params(shape: str, vocab: int) -> int:
    """n_params of our model of that shape, counted without building it."""
    with torch.device("meta"):
        return n_params(Transformer(ModelConfig(**SHAPES[shape]), vocab))


def marian_from(model: Transformer):
    """HF MarianMTModel of `model`'s shape holding its weights (post-LN, tied, no attention or
    activation dropout, our sinusoids): the same function, in HF's code."""
    from transformers import MarianMTModel

    c = model.cfg
    if c.pre_ln or not c.tie_embeddings or model.output_ids is not None:
        raise ValueError("Marian holds post-LN models with one shared, full softmax only")
    cfg = marian_config(model)  # the export's config: the same mapping the package ships
    hf = MarianMTModel._from_config(cfg, attn_implementation="sdpa")
    missing, unexpected = hf.load_state_dict(marian_state(model), strict=False)
    tied = {"lm_head.weight", "final_logits_bias"} | {
        f"model.{side}.{name}.weight"
        for side in NORMS
        for name in ("embed_tokens", "embed_positions")
    }
    if unexpected or set(missing) - tied:
        raise ValueError(f"Marian's layout changed: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for side in (hf.model.encoder, hf.model.decoder):
            side.embed_positions.weight.copy_(model.pe)
    return hf.to(model.output_weight.device)


def marian_state(model: Transformer) -> dict[str, Tensor]:
    """Our state dict in Marian's names (separate q/k/v projections); the shared embedding once
    (Marian ties the other three uses to it)."""
    sd, out = model.state_dict(), {"model.shared.weight": model.src_embed.weight}
    for side, norms in NORMS.items():
        for i in range(model.cfg.n_layers):
            a, b = f"{side}.{i}.", f"model.{side}.layers.{i}."
            for p in ("weight", "bias"):
                for j, norm in enumerate(norms, 1):
                    out[f"{b}{norm}.{p}"] = sd[f"{a}res{j}.norm.{p}"]
                for name, t in zip("qkv", sd[f"{a}self_attn.in_proj.{p}"].chunk(3)):
                    out[f"{b}self_attn.{name}_proj.{p}"] = t
                out[f"{b}self_attn.out_proj.{p}"] = sd[f"{a}self_attn.out_proj.{p}"]
                out[f"{b}fc1.{p}"], out[f"{b}fc2.{p}"] = sd[f"{a}ff.w1.{p}"], sd[f"{a}ff.w2.{p}"]
                if side == "decoder":
                    k, v = sd[f"{a}cross_attn.in_proj.{p}"].chunk(2)
                    out[f"{b}encoder_attn.k_proj.{p}"], out[f"{b}encoder_attn.v_proj.{p}"] = k, v
                    out[f"{b}encoder_attn.q_proj.{p}"] = sd[f"{a}cross_attn.q_proj.{p}"]
                    out[f"{b}encoder_attn.out_proj.{p}"] = sd[f"{a}cross_attn.out_proj.{p}"]
    return out


class TorchTransformer(nn.Module):
    """What a user writes in ~30 lines with torch.nn.Transformer: a shared embedding scaled by
    √d + sinusoids, dropout, nn.Transformer (post-LN, batch_first; its own final LayerNorms,
    attention dropout = dropout), the output projection tied to the embedding."""

    def __init__(self, shape: str, vocab: int):
        super().__init__()
        s = SHAPES[shape]
        d = self.d = s["d_model"]
        self.emb = nn.Embedding(vocab, d, padding_idx=PAD_ID)
        nn.init.normal_(self.emb.weight, 0.0, d**-0.5)
        self.register_buffer("pe", sinusoids(1024, d), persistent=False)
        self.drop = nn.Dropout(s["dropout"])
        self.tf = nn.Transformer(
            d, s["n_heads"], s["n_layers"], s["n_layers"], s["d_ff"], s["dropout"], batch_first=True
        )

    def embed(self, x: Tensor) -> Tensor:
        return self.drop(self.emb(x) * math.sqrt(self.d) + self.pe[: x.size(1)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(
            tgt_in.size(1), device=src.device, dtype=torch.bool
        )
        h = self.tf(
            self.embed(src),
            self.embed(tgt_in),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src.eq(PAD_ID),
            tgt_key_padding_mask=tgt_in.eq(PAD_ID),
            memory_key_padding_mask=src.eq(PAD_ID),
        )
        return F.linear(h, self.emb.weight)


# ----------------------------------------------------------------------------- training steps
def train_step(model: nn.Module, kind: str, dtype: torch.dtype) -> Callable[[Work], Tensor]:
    """A peer's update as its docs run it (forward, label-smoothed loss summed over target tokens
    / their count, backward, fused Adam): kind "marian" (logits, then the cross-entropy
    Seq2SeqTrainer's label smoother computes) or "torch" (logits, likewise). Ours is the train
    stage's own update (train.py). Every kind attends with our SDPA backends
    (model.sdpa_backends: no cuDNN attention, whose per-shape plans would cost the peers what
    they cost us)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    dev = params[0].device.type
    model.train()

    def step(b: Work) -> Tensor:
        with torch.autocast(dev, dtype=dtype, enabled=dtype != torch.float32), sdpa_backends(dev):
            if kind == "marian":
                logits = model(
                    input_ids=b.src, attention_mask=b.src.ne(PAD_ID), decoder_input_ids=b.tgt_in
                ).logits
            else:
                logits = model(b.src, b.tgt_in)
            loss = F.cross_entropy(
                logits.float().flatten(0, 1),
                b.tgt_out.flatten(),
                ignore_index=PAD_ID,
                label_smoothing=EPS,
                reduction="sum",
            )
        (loss / b.n_tgt).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


# ----------------------------------------------------------------------------- timing
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, items: list, device: torch.device) -> tuple[list[float], list]:
    """fn(item) for each item: (seconds each, results); device events on a GPU, no host sync
    between items."""
    if device.type != "cuda":
        times, outs = [], []
        for it in items:
            t = time.perf_counter()
            outs.append(fn(it))
            times.append(time.perf_counter() - t)
        return times, outs
    ev = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in items
    ]
    outs = []
    for (a, b), it in zip(ev, items):
        a.record()
        outs.append(fn(it))
        b.record()
    sync(device)
    return [a.elapsed_time(b) / 1e3 for a, b in ev], outs


def measure_steps(
    step,
    work: list[Work],
    warmup: int,
    n_params: int,
    peak_tflops: float | None,
    device: torch.device | None = None,
    cold: bool = True,
    reset_peak: bool = True,
) -> dict:
    """`warmup` steps, then the rest twice: a first pass, each batch's shapes new to this
    process (cold), and the timed pass over the same batches, every shape seen once. Every
    contender is timed on shapes it has seen, whichever ran first: what is done once per new
    shape (likely cuBLAS's kernel choice) is kept for the process, so a contender measured
    first on cold shapes would pay for the ones after it (seen on an H100: up to 1.6x).
    Target tokens/s (median over steps; the cold pass's too), MFU, peak memory, the first and
    last timed loss per token. cold False: no first pass (a captured contender's priming was
    it); reset_peak False: the peak since the caller's reset (a captured contender's graphs)."""
    dev = device or work[0].src.device  # (ours's batches stay on the host: its update copies)
    t = time.perf_counter()
    for b in work[:warmup]:
        step(b)
    sync(dev)
    warm_s = time.perf_counter() - t
    toks = [b.n_tgt for b in work[warmup:]]
    first, _ = timed(step, work[warmup:], dev) if cold else (None, None)
    if dev.type == "cuda" and reset_peak:
        torch.cuda.reset_peak_memory_stats(dev)
    times, losses = timed(step, work[warmup:], dev)
    rate = statistics.median(n / s for n, s in zip(toks, times))
    mfu = None if peak_tflops is None else float(f"{6 * n_params * rate / peak_tflops / 1e12:.4g}")
    return {
        "tokens_per_s": round(rate),
        "tokens_per_s_total": round(sum(toks) / sum(times)),
        "tokens_per_s_cold": first and round(statistics.median(n / s for n, s in zip(toks, first))),
        "mfu": mfu,
        "step_ms_median": round(1e3 * statistics.median(times), 2),
        "steps": len(times),
        "warmup_steps": warmup,
        "warmup_s": round(warm_s, 2),
        "tgt_tokens_per_step": round(statistics.mean(toks)),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
        if dev.type == "cuda"
        else None,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved(dev) / 2**30, 2)
        if dev.type == "cuda"
        else None,
        "loss_first": round(float(losses[0]) / toks[0], 4),
        "loss_last": round(float(losses[-1]) / toks[-1], 4),
    }


def peak_tflops(name: str) -> float | None:
    """The dense bf16 peak of a GPU, by its name (torch.cuda.get_device_name)."""
    if "H200" in name or ("H100" in name and ("HBM3" in name or "SXM" in name)):
        return 989.0  # H100 SXM, H200
    if "H100" in name and "PCIe" in name:
        return 756.0
    return None


# ----------------------------------------------------------------------------- decoding
def decode_plan(
    srcs: list[list[int]], ref_lens: list[int], batch_tokens: int
) -> list[tuple[list[int], int]]:
    """translate's batches (length-sorted, batch_tokens padded source tokens) and each one's
    output length: its longest reference. Random weights emit EOS at random, so every
    contender produces exactly that many tokens per sentence (EOS blocked until then)."""
    return [
        (b, max(ref_lens[i] for i in b))
        for b in decode_batches([len(s) for s in srcs], batch_tokens)
    ]


def padded(srcs: list[list[int]], rows: list[int]) -> Tensor:
    x = torch.full((len(rows), max(len(srcs[i]) for i in rows)), PAD_ID, dtype=torch.long)
    for r, i in enumerate(rows):
        x[r, : len(srcs[i])] = torch.tensor(srcs[i])
    return x


@torch.inference_mode()
def decode_ours(dec: Decoder, srcs, plan, beam: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in srcs]
    for rows, n in plan:
        hyps = beam_search(dec, padded(srcs, rows), beam, 1.0, torch.full((len(rows),), n), n)
        for i, h in zip(rows, hyps):
            out[i] = h
    return out


@torch.inference_mode()
def decode_hf(hf, srcs, plan, beam: int) -> list[list[int]]:
    """HF generate with the same batches and lengths; PAD and BOS never generated, as ours."""
    out: list[list[int]] = [[] for _ in srcs]
    hf.eval()
    dev = hf.device
    for rows, n in plan:
        x = padded(srcs, rows).to(dev)
        with sdpa_backends(dev.type):
            y = hf.generate(
                input_ids=x,
                attention_mask=x.ne(PAD_ID),
                num_beams=beam,
                do_sample=False,
                min_new_tokens=n,
                max_new_tokens=n,
                length_penalty=1.0,
                early_stopping=False,
                suppress_tokens=[PAD_ID, BOS_ID],
            )
        for i, h in zip(rows, y[:, 1:].tolist()):  # without the decoder start
            out[i] = h
    return out


def time_decode(decode, plan, device: torch.device) -> tuple[dict, list[list[int]]]:
    """decode(plan) timed after a warm-up on its first batch: sentences/s, tokens/s (output
    tokens), and the hypotheses."""
    decode(plan[:1])  # kernels, handles, the allocator's pools
    sync(device)
    t = time.perf_counter()
    hyps = decode(plan)
    sync(device)
    s, toks = time.perf_counter() - t, sum(map(len, hyps))
    return {
        "seconds": round(s, 2),
        "sentences_per_s": round(len(hyps) / s, 1),
        "tokens_per_s": round(toks / s),
        "tokens": toks,
    }, hyps
