"""Model properties: causality, padding invariance, cached decoding == full decode, loss ==
reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from transformer.core.presets import preset_params
from transformer.core.sections.model import ModelConfig
from transformer.core.settings import ConfigError
from transformer.model.checkpoint import CheckpointError, build_model
from transformer.model.incremental import Decoder
from transformer.model.network import Transformer, attention, sinusoids

V = 40


def tiny(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2, **kw)
    return Transformer(cfg, V).eval()


def batch(B=3, S=7, T=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    tgt = torch.randint(4, V, (B, T), generator=g)
    src[0, S - 2 :] = 0  # right padding, as collate builds it
    tgt[1, T - 3 :] = 0
    return src, tgt


def test_shapes_and_tied_embeddings():
    m = tiny()
    src, tgt = batch()
    assert m(src, tgt).shape == (3, 6, V)
    assert m.output_weight is m.src_embed.weight and m.tgt_embed is None  # §3.4
    untied = tiny(tie_embeddings=False)
    assert untied.output_weight is not untied.src_embed.weight
    assert len(untied.state_dict()) == len(m.state_dict()) + 2


@pytest.mark.parametrize("pre_ln", [False, True])
def test_future_targets_do_not_change_earlier_outputs(pre_ln):
    m = tiny(pre_ln=pre_ln)
    src, tgt = batch()
    a = m(src, tgt)
    tgt2 = tgt.clone()
    tgt2[:, 3] = (tgt2[:, 3] + 1) % (V - 4) + 4
    b = m(src, tgt2)
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a[:, 3:], b[:, 3:])


def test_padding_does_not_change_outputs():
    m = tiny()
    src, tgt = batch()
    a = m(src[2:3], tgt[2:3])
    pad = torch.zeros(1, 4, dtype=torch.long)
    b = m(torch.cat([src[2:3], pad], 1), torch.cat([tgt[2:3], pad], 1))
    torch.testing.assert_close(a, b[:, : tgt.size(1)], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernels", ["cpu", "plain"])
def test_incremental_decoder_matches_full_decode_and_follows_beams(kernels):
    """incremental.Decoder, one position a step against its caches, gives the logits of the
    whole-prefix forward pass; following beams (rows swapped) and sentences leaving (rows
    dropped) keep each row's cache its own."""
    m = tiny()
    src, tgt = batch()
    other = tgt.clone()
    other[:, 1:] = (other[:, 1:] + 7) % (V - 4) + 4  # a second prefix per sentence
    full = {"a": m(src, tgt), "b": m(src, other)}  # (B, T, V)
    dec = Decoder(m, kernels=kernels)
    state = dec.start(*dec.encode(src), beam_size=2, steps=tgt.size(1))
    rows = ["a", "b"] * 3  # row 2n + j: sentence n, beam j
    sent = [0, 0, 1, 1, 2, 2]

    def step(t):
        y = torch.stack([(tgt if r == "a" else other)[n, t : t + 1] for r, n in zip(rows, sent)])
        got = dec.step(y, state)  # (rows, V)
        want = torch.stack([full[r][n, t] for r, n in zip(rows, sent)])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)

    for t in range(3):
        step(t)
    origin = torch.tensor([1, 0, 3, 2, 5, 4])  # each sentence's beams swap
    dec.reorder(state, origin, None)
    rows = [rows[i] for i in origin]
    step(3)
    keep = torch.tensor([True, False, True])  # sentence 1 leaves
    dec.reorder(state, torch.tensor([0, 1, 4, 5]), keep)
    rows, sent = [rows[i] for i in (0, 1, 4, 5)], [0, 0, 2, 2]
    step(4)


def reference_loss(logits, tgt_out, eps):
    """torch's own label-smoothed cross-entropy, summed over non-pad targets."""
    x, y = logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1)
    return (
        F.cross_entropy(x, y, ignore_index=0, label_smoothing=eps, reduction="sum"),
        F.cross_entropy(x, y, ignore_index=0, reduction="sum"),
    )


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("counted", [False, True])  # n_targets given: rows picked sync-free
def test_model_loss_equals_forward_plus_cross_entropy_and_grad(fused, counted):
    m = tiny()
    m.fused_loss = fused
    src, tgt = batch()
    tgt_out = torch.roll(tgt, -1, 1)
    tgt_out[tgt == 0] = 0
    loss, nll = m.loss(src, tgt, tgt_out, 0.1, int(tgt_out.ne(0).sum()) if counted else None)
    ref, ref_nll = reference_loss(m(src, tgt), tgt_out, 0.1)
    torch.testing.assert_close((loss, nll), (ref, ref_nll))
    params = [p for p in m.parameters() if p.requires_grad]
    grads = torch.autograd.grad(0.5 * loss, params)  # the fused op scales by the incoming grad
    ref_grads = torch.autograd.grad(0.5 * ref, params)
    for p, g, r in zip(params, grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    # given the count of targets (a training step, counted on the host), the very same loss
    n = int(tgt_out.ne(0).sum())
    assert torch.equal(torch.stack(m.loss(src, tgt, tgt_out, 0.1, n)), torch.stack((loss, nll)))


def test_target_output_vocab_is_the_shared_softmax_over_fewer_units():
    src, tgt = batch()
    tgt_out = torch.roll(tgt, -1, 1)
    tgt_out[tgt == 0] = 0
    ids = torch.unique(torch.cat([tgt_out[tgt_out.ne(0)], torch.tensor([5, 9])]))  # sorted
    torch.manual_seed(0)
    m = Transformer(
        ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2, output_vocab="target"), V, ids
    ).eval()
    logits = m(src, tgt)  # (B, T, V): -inf outside ids
    left_out = torch.ones(V, dtype=torch.bool)
    left_out[ids] = False
    assert torch.isinf(logits[..., left_out]).all() and torch.isfinite(logits[..., ids]).all()
    loss, _ = m.loss(src, tgt, tgt_out, 0.1)  # smoothing over the V' units only
    h = m.decode_features(tgt, *m.encode(src))[tgt_out.ne(0)]
    rows = torch.searchsorted(ids, tgt_out[tgt_out.ne(0)])
    ref = F.cross_entropy(h @ m.output_weight[ids].T, rows, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, ref)
    # checkpoints carry the set decoding needs
    ckpt = {"model": m.state_dict(), "model_config": dataclasses.asdict(m.cfg), "vocab_size": V}
    torch.testing.assert_close(build_model(ckpt)(src, tgt), logits)
    del ckpt["model"]["output_ids"]
    with pytest.raises(CheckpointError, match="output_ids is missing"):
        build_model(ckpt)
    outside = tgt_out.clone()
    outside[0, 0] = int(left_out.nonzero()[-1])
    with pytest.raises(ValueError, match="not in output_ids"):
        m.loss(src, tgt, outside, 0.1)
    with pytest.raises(RuntimeError, match="not in output_ids"):  # checked on the device
        m.loss(src, tgt, outside, 0.1, int(outside.ne(0).sum()))
    with pytest.raises(ValueError, match="output_ids"):
        Transformer(ModelConfig(output_vocab="target"), V)


def test_sinusoids_and_embedding_scale():
    pe = sinusoids(50, 16)
    torch.testing.assert_close(pe[0, 1::2], torch.ones(8))  # cos(0) = 1
    torch.testing.assert_close(pe[7, 0], torch.sin(torch.tensor(7.0)))
    m = tiny()
    with pytest.raises(ValueError, match="max_positions"):
        m(torch.ones(1, 2000, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))


def test_impossible_config_and_presets():
    with pytest.raises(ConfigError, match="divisible by model.n_heads"):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(ConfigError, match="dropout"):
        ModelConfig(dropout=1.5)
    big = ModelConfig(**preset_params("wmt14-en-de-big")["model"])  # Table 3, big
    assert (big.d_model, big.d_ff, big.n_heads, big.dropout) == (1024, 4096, 16, 0.3)


def test_bf16_autocast_runs_and_stays_close():
    m = tiny()
    src, tgt = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lo = m(src, tgt)
    assert lo.dtype == torch.bfloat16
    torch.testing.assert_close(lo.float(), m(src, tgt), atol=0.1, rtol=0.1)


def test_attention_dropout_path_is_sdpa_when_nothing_is_dropped():
    """Training with attention dropout spells Eq. 1 out (padding, causal and cross masks of its
    own); with p rounding to no drops it must give what SDPA gives in eval mode."""
    m = tiny(dropout=0.0, attention_dropout=1e-9)
    src, tgt = batch()
    ref = m(src, tgt)
    torch.testing.assert_close(m.train()(src, tgt), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T", [1, 5, 9])
def test_spelled_out_attention_is_sdpa(causal, T):
    """Eq. 1 spelled out (attention dropout's path, and attention_bench's) computes what SDPA
    does: padding masks, causal masks, and queries fewer than keys (top-left aligned)."""
    g = torch.Generator().manual_seed(T)
    q = torch.randn(3, 2, T, 8, generator=g)
    k, v = torch.randn(2, 3, 2, 9, 8, generator=g)
    mask = None if causal else (torch.arange(9) < torch.tensor([[9], [4], [1]]))[:, None, None]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(attention(q, k, v, mask, causal), ref, atol=1e-5, rtol=1e-5)


def test_spelled_out_attention_keeps_scores_fp32_under_bf16_autocast():
    """Scores 99 and 99.75 are 99 and 100 in bf16 (spacing 0.5 there): the weights would be
    softmax([0, 1]) instead of softmax([0, 0.75]). Inputs are exact in bf16; d_k = 1."""
    q = torch.tensor([3.0]).view(1, 1, 1, 1)
    k = torch.tensor([33.0, 33.25]).view(1, 1, 2, 1)
    v = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
    ref = torch.softmax(torch.tensor([0.0, 0.75]), -1)[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(q, k, v, None, False)
    assert abs(out.float().item() - ref.item()) < 0.01


def test_attention_dropout_drops_and_keeps_causality():
    m = tiny(dropout=0.0, attention_dropout=0.3).train()
    src, tgt = batch()
    tgt2 = tgt.clone()
    tgt2[:, 3] = (tgt2[:, 3] + 1) % (V - 4) + 4
    outs = []
    for t in (tgt, tgt2):
        torch.manual_seed(5)  # the same drop masks for both
        outs.append(m(src, t))
    torch.testing.assert_close(outs[0][:, :3], outs[1][:, :3])
    assert not torch.allclose(outs[0], m.eval()(src, tgt), atol=1e-3)
