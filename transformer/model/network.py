"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017), in paper order.

Encoder-decoder, post-LN residual blocks (§3.1), scaled dot-product multi-head attention through
`F.scaled_dot_product_attention` (§3.2; spelled out for attention dropout), position-wise FFN
(§3.3), shared embeddings scaled by √d_model (§3.4), sinusoidal positions (§3.5), dropout on
sub-layer outputs and on embeddings + positions (§5.4), label smoothing (§5.4). Incremental
decoding (incremental.py) runs the same decoder stack (`decoder_stack`) with attention of its
own against cached keys and values.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer.core.ids import PAD_ID
from transformer.core.sections.model import ModelConfig
from transformer.model.ops import dropout, output_loss

# cuDNN's attention builds a plan for each new shape, hundreds of ms each, and every batch of a
# length-bucketed run and every decoding step has a new shape; flash and memory-efficient
# kernels need no plan (docs/gpu.md).
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_backends(device_type: str):
    """The context in which SDPA runs SDPA_BACKENDS alone: on CUDA; elsewhere it changes nothing."""
    return sdpa_kernel(SDPA_BACKENDS) if device_type == "cuda" else contextlib.nullcontext()


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False):
    """F.scaled_dot_product_attention in sdpa_backends: on CUDA without cuDNN's kernel."""
    with sdpa_backends(q.device.type):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def sinusoids(n_pos: int, d_model: int) -> Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...)."""
    pos = torch.arange(n_pos, dtype=torch.float32)[:, None]
    inv = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2).float() / d_model)
    pe = torch.zeros(n_pos, d_model)
    pe[:, 0::2] = torch.sin(pos * inv)
    pe[:, 1::2] = torch.cos(pos * inv)
    return pe  # (n_pos, D)


def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p_drop: float = 0.0
) -> Tensor:
    """Eq. 1 spelled out, with dropout on the weights (SDPA with dropout_p > 0 takes this math
    path on CPU too, but draws its mask with the slow Bernoulli sampler). QK^T and the softmax
    are fp32 under autocast, as in SDPA's fused kernels, so switching paths keeps the numerics."""
    with torch.autocast(q.device.type, enabled=False):
        scores = q.float() @ k.float().transpose(-2, -1) * q.size(-1) ** -0.5  # (B, h, T, S)
    if causal:
        T, S = scores.shape[-2:]
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = dropout(torch.softmax(scores, dim=-1), p_drop, True)
    return weights.to(v.dtype) @ v  # (B, h, T, d_k)


class MultiHeadAttention(nn.Module):
    """§3.2.2: h heads of scaled dot-product attention; Q, K, V projections fused into one GEMM."""

    def __init__(self, cfg: ModelConfig, cross: bool):
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.d_k, self.cross = cfg.n_heads, d // cfg.n_heads, cross
        self.p_attn = cfg.attention_dropout
        # self-attention: one (3D, D) projection; cross: Q from the decoder, (2D, D) K/V from memory
        self.q_proj = nn.Linear(d, d) if cross else None
        self.in_proj = nn.Linear(d, 2 * d if cross else 3 * d)
        self.out_proj = nn.Linear(d, d)  # W^O
        for w in (self.in_proj.weight.chunk(2 if cross else 3)) + (
            (self.q_proj.weight,) if cross else ()
        ):
            nn.init.xavier_uniform_(w)  # per D x D block, as if the projections were separate
        nn.init.xavier_uniform_(self.out_proj.weight)
        for lin in (self.in_proj, self.out_proj) + ((self.q_proj,) if cross else ()):
            nn.init.zeros_(lin.bias)

    def split(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)

    def merge(self, o: Tensor) -> Tensor:
        """W^O of the concatenated heads: (B, h, T, d_k) -> (B, T, D)."""
        B, h, T, d_k = o.shape
        return self.out_proj(o.transpose(1, 2).reshape(B, T, h * d_k))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        p = self.p_attn if self.training else 0.0
        if p > 0:
            o = attention(q, k, v, mask, causal, p)
        else:
            o = sdpa(q, k, v, mask, causal)
        return self.merge(o)  # (B, T, D)

    def self_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's queries, keys and values of x (B, T, D): 3 x (B, h, T, d_k)."""
        q, k, v = self.in_proj(x).chunk(3, dim=-1)  # 3 x (B, T, D)
        return self.split(q), self.split(k), self.split(v)

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """Self-attention over x (B, T, D); `mask` (B, 1, 1|T, T) bool, True = attend."""
        return self.attend(*self.self_qkv(x), mask, causal)

    def query(self, x: Tensor) -> Tensor:
        """Cross-attention's queries of decoder states x (B, T, D): (B, h, T, d_k)."""
        return self.split(self.q_proj(x))

    def cross_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        k, v = self.in_proj(memory).chunk(2, dim=-1)  # 2 x (B, S, D)
        return self.split(k), self.split(v)  # (B, h, S, d_k)


class FeedForward(nn.Module):
    """§3.3: FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, cfg: ModelConfig, d_ff: int | None = None):
        super().__init__()
        d_ff = d_ff or cfg.d_ff  # the decoder's may differ (model.d_ff_decoder)
        self.w1, self.w2 = nn.Linear(cfg.d_model, d_ff), nn.Linear(d_ff, cfg.d_model)
        self.p_act = cfg.activation_dropout
        for lin in (self.w1, self.w2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(dropout(self.w1(x), self.p_act, self.training, relu=True))


class Residual(nn.Module):
    """§3.1 LayerNorm(x + Dropout(Sublayer(x))); pre-LN: x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm, self.p, self.pre_ln = nn.LayerNorm(cfg.d_model), cfg.dropout, cfg.pre_ln

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_ln:
            return x + dropout(sublayer(self.norm(x)), self.p, self.training)
        return self.norm(x + dropout(sublayer(x), self.p, self.training))  # §5.4 residual dropout


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn, self.ff = MultiHeadAttention(cfg, cross=False), FeedForward(cfg)
        self.res1, self.res2 = Residual(cfg), Residual(cfg)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.res1(x, lambda y: self.self_attn(y, mask))
        return self.res2(x, self.ff)


# a decoder layer's attention sub-layer: (layer index, its MultiHeadAttention, input) -> output
AttentionFn = Callable[[int, MultiHeadAttention, Tensor], Tensor]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg, cross=False)
        self.cross_attn = MultiHeadAttention(cfg, cross=True)
        self.ff = FeedForward(cfg, cfg.decoder_d_ff)
        self.res1, self.res2, self.res3 = Residual(cfg), Residual(cfg), Residual(cfg)

    def forward(self, x: Tensor, self_attn, cross_attn) -> Tensor:
        """x (B, t, D) through the three sub-layers; the two attentions are given as functions
        of their (normalised, with pre-LN) input: a whole sequence's, or one decoding step's
        against cached keys and values."""
        x = self.res1(x, self_attn)
        x = self.res2(x, cross_attn)
        return self.res3(x, self.ff)


class Transformer(nn.Module):
    """Encoder-decoder Transformer; ids follow architecture.md (PAD_ID = 0)."""

    # the loss's output projection + label smoothing: ops.output_loss's chunked fused op, or
    # F.linear + F.cross_entropy (False). The fused op's CUDA default stands until
    # benchmarks/gpu/check.py measures both by the rule written there.
    fused_loss: bool = True

    def __init__(self, cfg: ModelConfig, vocab_size: int, output_ids: Tensor | None = None):
        """output_ids (V',): the sorted units the softmax spans, when cfg.output_vocab is target."""
        super().__init__()
        self.cfg, self.vocab_size = cfg, vocab_size
        D = cfg.d_model
        # §3.4: shared source/target/output matrix, N(0, d^-0.5) so that √d·E has unit scale
        self.src_embed = nn.Embedding(vocab_size, D, padding_idx=PAD_ID)
        nn.init.normal_(self.src_embed.weight, 0.0, D**-0.5)
        nn.init.zeros_(self.src_embed.weight[PAD_ID].data)
        if cfg.tie_embeddings:  # not registered twice: one state_dict key per tensor
            self.tgt_embed, self.out_weight = None, None
        else:
            self.tgt_embed = nn.Embedding(vocab_size, D, padding_idx=PAD_ID)
            nn.init.normal_(self.tgt_embed.weight, 0.0, D**-0.5)
            self.out_weight = nn.Parameter(torch.randn(vocab_size, D) * D**-0.5)
        self.register_buffer("pe", sinusoids(cfg.max_positions, D), persistent=False)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # pre-LN leaves the residual stream un-normalised: one final LayerNorm per stack
        self.enc_norm = nn.LayerNorm(D) if cfg.pre_ln else nn.Identity()
        self.dec_norm = nn.LayerNorm(D) if cfg.pre_ln else nn.Identity()
        if (cfg.output_vocab == "target") != (output_ids is not None):
            state = "missing" if output_ids is None else "present"
            raise ValueError(
                f"model.output_ids is {state} but model_config.output_vocab is "
                f"{cfg.output_vocab!r} (given exactly when it is target)"
            )
        # a buffer, so that checkpoints carry it: decoding must never emit a unit never trained
        # as an output (its logit, an input embedding only, is meaningless there)
        self.register_buffer("output_ids", None if output_ids is None else output_ids.long())

    @property
    def output_weight(self) -> Tensor:
        return self.src_embed.weight if self.out_weight is None else self.out_weight  # (V, D)

    def output_matrix(self) -> Tensor:
        """The rows of the output projection the softmax spans: (V', D), V' = V when shared."""
        W = self.output_weight
        return W if self.output_ids is None else W[self.output_ids]

    def full_logits(self, logits: Tensor) -> Tensor:
        """(..., V') logits over output_matrix() rows -> (..., V), -inf for the units left out."""
        if self.output_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.output_ids, logits)

    def embed(self, emb: nn.Embedding, ids: Tensor, start: int = 0) -> Tensor:
        end = start + ids.size(1)
        if end > self.cfg.max_positions:
            raise ValueError(
                f"sequence length {end} exceeds model.max_positions ({self.cfg.max_positions})"
            )
        x = emb(ids) * math.sqrt(self.cfg.d_model) + self.pe[start:end]  # (B, T, D)
        return dropout(x, self.cfg.dropout, self.training)  # §5.4 on embeddings + positions

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, D), src_pad_mask (B, S) bool, True = pad."""
        src_pad_mask = src.eq(PAD_ID)
        # a filler row of a static-shape batch (all padding) attends to its first position: with
        # no key at all its softmax would be NaN. A real row's first position is a token.
        src_pad_mask[:, 0] = False
        mask = ~src_pad_mask[:, None, None, :]  # (B, 1, 1, S) True = attend
        x = self.embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.enc_norm(x), src_pad_mask

    def embed_target(self, ids: Tensor, start: int = 0) -> Tensor:
        """Decoder input ids (B, t) at positions start.. -> (B, t, D); tied: the one matrix."""
        return self.embed(self.tgt_embed or self.src_embed, ids, start)

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values of memory (B, S, D)."""
        return [layer.cross_attn.cross_kv(memory) for layer in self.decoder]

    def decoder_stack(self, x: Tensor, self_attn: AttentionFn, cross_attn: AttentionFn) -> Tensor:
        """Embedded targets x (B, t, D) through the decoder layers and the final norm; each
        layer's attention comes from self_attn / cross_attn (see AttentionFn)."""
        for i, layer in enumerate(self.decoder):
            x = layer(
                x, partial(self_attn, i, layer.self_attn), partial(cross_attn, i, layer.cross_attn)
            )
        return self.dec_norm(x)

    def decode_features(self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor) -> Tensor:
        """The decoder stack's output (B, T, D) for the whole target prefix tgt_in (B, T)."""
        mem_mask = ~src_pad_mask[:, None, None, :]  # (B, 1, 1, S)
        kv = self.cross_kv(memory)

        def self_attn(i: int, sa: MultiHeadAttention, y: Tensor) -> Tensor:
            # right-padded targets: the causal mask alone keeps real queries off pad keys (§3.2.3)
            return sa(y, causal=True)

        def cross_attn(i: int, ca: MultiHeadAttention, y: Tensor) -> Tensor:
            return ca.attend(ca.query(y), *kv[i], mem_mask, False)

        return self.decoder_stack(self.embed_target(tgt_in), self_attn, cross_attn)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor) -> Tensor:
        """tgt_in (B, t) -> logits (B, t, V)."""
        h = self.decode_features(tgt_in, memory, src_pad_mask)
        return self.full_logits(F.linear(h, self.output_matrix()))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """src (B, S), tgt_in (B, T) -> logits (B, T, V)."""
        memory, src_pad_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_pad_mask)

    def loss(
        self,
        src: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor,
        eps: float,
        n_targets: int | None = None,
        every_position: bool = False,
        row_nll: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(loss_sum, nll_sum) over non-pad targets; projects only non-pad positions to V.

        n_targets: tgt_out's count of non-pad targets, when the caller has it (counted on the host
        before the copy to a GPU); the loss then never waits for the device (a training step).
        every_position: project every position and weigh the pad ones 0 instead: no tensor's
        shape then depends on the count, as a captured or compiled update of static-shape
        batches needs (at the price of the padding's share of the output GEMM).
        row_nll: each projected target's NLL is written there too (scoring a corpus,
        transformer/model/crossent.py; no gradients): the non-pad targets in (B, T) row-major
        order, so a sentence's are consecutive (with every_position: all B*T, 0 at padding).
        """
        memory, src_pad_mask = self.encode(src)
        h = self.decode_features(tgt_in, memory, src_pad_mask).flatten(0, 1)  # (B*T, D)
        target = tgt_out.flatten()
        keep = target.ne(PAD_ID)
        if not every_position:
            # boolean indexing would wait for the device to count the rows
            pos = (
                keep.nonzero() if n_targets is None else torch.nonzero_static(keep, size=n_targets)
            ).squeeze(1)
            # (N, D), (N,): the V-sized GEMM skips padding
            h, target, keep = h.index_select(0, pos), target.index_select(0, pos), None
        if self.output_ids is not None:  # ids -> rows of output_matrix()
            ids, target = target, torch.searchsorted(self.output_ids, target)
            outside = self.output_ids[target.clamp(max=self.output_ids.numel() - 1)].ne(ids)
            if keep is not None:
                outside, target = outside & keep, target.clamp(max=self.output_ids.numel() - 1)
            why = "not in output_ids (model.output_vocab target: units from other data?)"
            if n_targets is not None or every_position:  # checked without waiting
                torch._assert_async(outside.any().logical_not(), f"a target unit is {why}")
            elif bool(outside.any()):
                raise ValueError(f"target unit {int(ids[outside][0])} is {why}")
        return output_loss(h, self.output_matrix(), target, eps, self.fused_loss, keep, row_nll)
