"""The model side of decoding: a Transformer prepared for inference in one precision, stepping
one token at a time with cached keys and values (§3.2.3, §6.1); beam search is in decode.py.

The encoder runs once per batch; each decoder layer keeps its self-attention keys/values in a
preallocated cache and computes the cross-attention keys/values once per sentence, shared by its
beams.
"""

from __future__ import annotations

import copy
import math
import warnings
from functools import partial

import torch
from torch import Tensor, nn

from transformer.core.settings import ConfigError
from transformer.model.network import Transformer, sdpa
from transformer.model.precision import resolve_precision

NEG_INF = float("-inf")


class FastLinear(nn.Module):
    """nn.Linear through oneDNN, with the weight stored once in `dtype` (fp32 or bf16).

    On AMD CPUs torch's default fp32 GEMM (MKL) takes a generic path; oneDNN runs the same fp32
    GEMM about 2x faster (../shared/bench/peers/RESULTS.md §1). bf16 runs the GEMM on a
    bf16 copy of the weight (cast once, not at every call as autocast would) and returns fp32.
    The weight is reordered once into oneDNN's blocked layout (what inductor's CPU freezing
    does), which oneDNN otherwise redoes at every call: 5-50% per GEMM at decoding sizes.
    """

    ROWS_HINT = 256  # the typical rows per call (sentences x beams) the layout is chosen for

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        w = weight.detach().to(dtype).contiguous()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w, self.ROWS_HINT)  # opaque
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x: Tensor) -> Tensor:
        y = torch.ops.mkldnn._linear_pointwise(
            x.to(self.dtype), self.weight, self.bias, "none", [], ""
        )
        return y.float()  # fp32 out: the CPU attention kernel is several times slower in bf16


def _swap_linears(module: nn.Module, dtype: torch.dtype) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, FastLinear(child.weight, child.bias, dtype))
        else:
            _swap_linears(child, dtype)


class Decoder:
    """A model prepared for inference in one precision on one device: fp32, bf16 or int8 (a
    copy; `model` is left as it is).

    kernels "cpu" (the default on a CPU): fp32 and bf16 run every Linear through oneDNN (bf16:
    weights bf16, LayerNorm, softmax statistics and the residual stream fp32), and attention of
    a step's few queries as two batched GEMVs. int8 (CPU only) is dynamic quantization (weights
    int8 once, one scale per output channel; activations per call). kernels "plain" (the
    default elsewhere, e.g. CUDA): the model as it is, wholly in fp32 or bf16 (weights,
    activations and caches), attention through SDPA. Logits are fp32 either way. The tied
    output projection, an F.linear on the embedding in network.py, becomes a Linear of its own so
    that it is converted too.
    """

    def __init__(
        self,
        model: Transformer,
        precision: str = "fp32",
        device: torch.device | str | None = None,
        kernels: str = "auto",
    ):
        if precision not in ("fp32", "bf16", "int8"):
            raise ConfigError(f"decode.precision must be fp32, bf16 or int8, got {precision!r}")
        self.device = torch.device(device) if device is not None else model.output_weight.device
        if kernels == "auto":
            kernels = "cpu" if self.device.type == "cpu" else "plain"
        if kernels not in ("cpu", "plain") or (kernels == "cpu" and self.device.type != "cpu"):
            raise ValueError(
                f"kernels {kernels!r} on {self.device.type}: cpu (a CPU only) or plain"
            )
        if precision == "int8" and kernels != "cpu":
            raise ConfigError(
                f"decode.precision int8 (dynamic quantization) runs on a CPU only, "
                f"not on {self.device.type}: use bf16 or fp32 there"
            )
        resolve_precision(precision, self.device, "decode.precision")  # bf16: native?
        self.precision, self.max_positions = precision, model.cfg.max_positions
        W = model.output_matrix().detach()  # (V', D); V' < V with model.output_vocab target
        # skip_init: a Linear's own init would draw from the global generator, the dropout
        # stream of a training run that validates with this (valid BLEU)
        out = nn.utils.skip_init(nn.Linear, W.size(1), W.size(0), bias=False)
        out.weight = nn.Parameter(W.clone(), requires_grad=False)
        self.model = copy.deepcopy(model).eval().requires_grad_(False).to(self.device)
        self.out = nn.Sequential(out).to(self.device)
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        self.attend = _attend_few if kernels == "cpu" else _attend_sdpa
        if precision == "int8":
            with warnings.catch_warnings():  # torch.ao.quantization is deprecated for torchao
                warnings.simplefilter("ignore")
                # one scale per output row: the tied output projection's rows (the embeddings)
                # differ in norm; per-tensor int8 lost up to 0.4 val BLEU on Multi30k, this 0.2
                spec = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
                qd = partial(
                    torch.ao.quantization.quantize_dynamic, qconfig_spec=spec, dtype=torch.qint8
                )
                self.model, self.out = qd(self.model), qd(self.out)
        elif kernels == "plain":
            self.model.to(dtype=dtype)
            self.out.to(dtype=dtype)
        elif torch.backends.mkldnn.is_available():
            _swap_linears(self.model, dtype)
            _swap_linears(self.out, dtype)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.encode(src.to(self.device))

    def logits(self, h: Tensor) -> Tensor:
        return self.model.full_logits(self.out(h).float())  # (B, V) fp32; the last position only

    def step_full(self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor) -> Tensor:
        """Logits (B, V) after tgt_in (B, t), recomputing the whole prefix: network.py's own path."""
        h = self.model.decode_features(tgt_in.to(self.device), memory, src_pad_mask)
        return self.logits(h[:, -1])

    def start(self, memory: Tensor, src_pad_mask: Tensor, beam_size: int, steps: int) -> dict:
        """Incremental state: each layer's cross-attention K/V, once per sentence (not per beam).

        `steps` bounds the output length. Greedy caches are sized for it at once: rows are never
        reordered, so positions never written cost nothing, and nothing is copied to grow. Beam
        caches start small and double, as following the beams copies whole rows."""
        # contiguous once, or every step's batched matmul would copy the transposed views
        cross = [tuple(x.contiguous() for x in kv) for kv in self.model.cross_kv(memory)]
        bias = torch.zeros(src_pad_mask.shape, dtype=memory.dtype, device=memory.device)
        bias.masked_fill_(src_pad_mask, NEG_INF)  # (N, S)
        cap = steps if beam_size == 1 else 16
        return {
            "t": 0,
            "k": beam_size,
            "cross": cross,
            "bias": bias[:, None, None],
            "self": [],
            "cap": cap,
        }

    def step(self, y: Tensor, state: dict) -> Tensor:
        """Logits (N*k, V) after the new tokens y (N*k, 1), appending to the self-attention cache.

        The k beams of a sentence are k queries against that sentence's one cross-attention K/V,
        so the source side is neither copied per beam nor read k times.
        """
        x = self.model.embed_target(y.to(self.device), start=state["t"])  # (N*k, 1, D)
        h = self.model.decoder_stack(
            x, partial(self._self_attn, state), partial(self._cross_attn, state)
        )
        state["t"] += 1
        return self.logits(h[:, -1])

    def _cross_attn(self, state: dict, i: int, ca: nn.Module, z: Tensor) -> Tensor:
        ck, cv = state["cross"][i]  # (N, h, S, d_k)
        N, h, _, d_k = ck.shape
        q = ca.query(z.view(N, -1, h * d_k))  # (N, h, k, d_k): beams as queries
        return ca.merge(self.attend(q, ck, cv, state["bias"])).view(z.shape)  # (N*k, 1, D)

    def _self_attn(self, state: dict, i: int, sa: nn.Module, z: Tensor) -> Tensor:
        q, k, v = sa.self_qkv(z)  # (N*k, h, 1, d_k)
        if i == len(state["self"]):
            state["self"].append(SelfCache(state["cap"]))
        k, v = state["self"][i].append(k, v)  # (N*k, h, t+1, d_k): earlier positions, then this
        return sa.merge(self.attend(q, k, v, None))  # (N*k, 1, D)

    def reorder(self, state: dict, origin: Tensor, keep: Tensor | None) -> None:
        """Follow the beams (origin (N'*k,)); sentences not in `keep` (N,) bool leave."""
        if state["k"] > 1 or keep is not None:  # greedy: the identity until sentences leave
            origin = origin.to(self.device)
            for cache in state["self"]:
                cache.select(origin)
        if keep is not None:
            keep = keep.to(self.device)
            state["cross"] = [(ck[keep], cv[keep]) for ck, cv in state["cross"]]
            state["bias"] = state["bias"][keep]


class Ensemble:
    """Several Decoders decoding as one: each step's distribution is the mean of theirs,
    log(1/M sum_m P_m), as in fairseq's ensembles (Sennrich et al. 2016 ensembled the last
    checkpoints of one run, or runs of several seeds). Same interface as Decoder for
    beam.beam_search, with the cache (`use_cache=False` needs a single Decoder).

    The models may differ in shape; they must share the tokenizer (load_translator checks).
    """

    def __init__(self, decoders: list[Decoder]):
        if len({d.device for d in decoders}) > 1:
            raise ValueError(
                f"an ensemble decodes on one device, not {[d.device for d in decoders]}"
            )
        self.decoders, self.device = decoders, decoders[0].device
        self.max_positions = min(d.max_positions for d in decoders)

    def encode(self, src: Tensor) -> tuple[list, Tensor]:
        enc = [d.encode(src) for d in self.decoders]  # each (memory (B, S, D_m), pad mask)
        return enc, enc[0][1]

    def start(self, memory: list, src_pad_mask: Tensor, beam_size: int, steps: int) -> list:
        return [d.start(m, mask, beam_size, steps) for d, (m, mask) in zip(self.decoders, memory)]

    def step(self, y: Tensor, state: list) -> Tensor:
        lp = torch.stack([d.step(y, s).log_softmax(-1) for d, s in zip(self.decoders, state)])
        return lp.logsumexp(0) - math.log(len(self.decoders))  # (N*k, V) log-probabilities

    def reorder(self, state: list, origin: Tensor, keep: Tensor | None) -> None:
        for d, s in zip(self.decoders, state):
            d.reorder(s, origin, keep)


def _attend_few(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """Eq. 1 for a few queries per row (q (B, h, T, d_k), T = 1 or k beams) as two batched
    GEMVs: ~6x faster on CPU than the flash-attention kernel, which tiles for long queries.
    `bias` (B, 1, 1, S) is 0 or -inf (padding); k, v may be strided views of a cache."""
    scores = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5  # (B, h, T, S)
    if bias is not None:
        scores += bias
    return torch.softmax(scores, dim=-1) @ v  # (B, h, T, d_k)


def _attend_sdpa(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """_attend_few through SDPA: on a GPU its kernels keep the scores in fp32 and on chip."""
    return sdpa(q, k, v, bias)


class SelfCache:
    """One decoder layer's self-attention keys and values, (rows, h, capacity, d_k), in place.

    A step writes one position; following the beams copies whole rows with one 2-D index_select
    into a spare buffer (~5x faster on CPU than on the 4-D tensor); capacity doubles when full.
    torch.cat at every step would copy the whole prefix and allocate anew each time.
    """

    def __init__(self, capacity: int = 16) -> None:
        self.capacity = max(1, capacity)  # positions allocated at first; doubles from there
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.spare: tuple[Tensor, Tensor] | None = None
        self.t = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this step's k, v (rows, h, 1, d_k); the views of all positions so far."""
        if self.k is None or self.t == self.k.size(2):
            self._grow(k)
        self.k[:, :, self.t] = k[:, :, 0]
        self.v[:, :, self.t] = v[:, :, 0]
        self.t += 1
        return self.k[:, :, : self.t], self.v[:, :, : self.t]

    def _grow(self, like: Tensor) -> None:
        R, h, _, d_k = like.shape
        cap = max(self.capacity, 2 * self.t)
        k, v = like.new_empty(R, h, cap, d_k), like.new_empty(R, h, cap, d_k)
        if self.t:
            k[:, :, : self.t], v[:, :, : self.t] = self.k[:, :, : self.t], self.v[:, :, : self.t]
        self.k, self.v, self.spare = k, v, None

    def select(self, index: Tensor) -> None:
        """Keep rows `index` (R',), in that order; R' never exceeds the current row count."""
        if self.spare is None:
            self.spare = (torch.empty_like(self.k), torch.empty_like(self.v))
        R, old = index.numel(), (self.k, self.v)
        for src, dst in zip(old, self.spare):
            torch.index_select(
                src.view(src.size(0), -1), 0, index, out=dst.view(dst.size(0), -1)[:R]
            )
        self.k, self.v = (x[:R] for x in self.spare)
        self.spare = old
