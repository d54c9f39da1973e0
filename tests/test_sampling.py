"""Sampling (back-translation's other search): draws follow the model's distribution, top-1 is
greedy, a seed repeats a draw, lengths and input order hold as in beam search."""

import pytest
import torch
from helpers.decode import V

from transformer.core.ids import BOS_ID, EOS_ID, PAD_ID
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.model import ModelConfig
from transformer.model.beam import Sampling, beam_search, sample, translate_ids
from transformer.model.incremental import Decoder
from transformer.model.network import Transformer


@pytest.fixture(scope="module")
def untrained() -> Transformer:
    """A random model: its next-token distributions are wide, so draws differ."""
    torch.manual_seed(1)
    cfg = ModelConfig(d_model=16, d_ff=32, n_heads=2, n_layers=2, dropout=0.0)
    return Transformer(cfg, V).eval()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_top1_sampling_is_greedy(copy_model, sources):
    dec, cap = Decoder(copy_model), torch.full((len(sources),), 12)
    greedy = beam_search(dec, sources, beam_size=1, max_len=cap)
    assert sample(dec, sources, cap, topk=1, generator=gen(3)) == greedy
    assert len({len(h) for h in greedy}) > 2  # rows really leave the batch at different steps


def test_first_tokens_are_drawn_with_the_model_probabilities(untrained, sources):
    dec, n = Decoder(untrained), 4000
    src = sources[:1].expand(n, -1)  # one sentence, drawn n times
    draws = sample(dec, src, torch.ones(n, dtype=torch.long), generator=gen(0))
    with torch.no_grad():
        p = untrained(sources[:1], torch.tensor([[BOS_ID]]))[0, -1]
    p[[PAD_ID, BOS_ID]] = float("-inf")
    p = p.softmax(-1)
    first = [h[0] if h else EOS_ID for h in draws]
    freq = torch.bincount(torch.tensor(first), minlength=V).double() / n
    assert freq[PAD_ID] == freq[BOS_ID] == 0
    assert (p > 0.02).sum() >= 5  # a wide distribution, not one token
    # each token within 5 standard errors of its probability
    bound = 5 * (p * (1 - p) / n).sqrt() + 1e-3
    assert ((freq - p.double()).abs() <= bound).all(), (freq, p)


def test_a_seed_repeats_a_draw_and_another_seed_differs(untrained, sources):
    dec, cap = Decoder(untrained), torch.full((len(sources),), 10)
    a = sample(dec, sources, cap, generator=gen(5))
    assert sample(dec, sources, cap, generator=gen(5)) == a
    assert sample(dec, sources, cap, generator=gen(6)) != a
    top3 = sample(dec, sources, cap, topk=3, generator=gen(5))
    assert top3 != a  # a restricted draw is another draw
    assert all(len(h) <= 10 and PAD_ID not in h and BOS_ID not in h for h in a + top3)


def test_sampled_batches_keep_order_length_bounds_and_empty_sources(untrained, sources):
    dec = Decoder(untrained)
    srcs = [r[r.ne(0)].tolist() for r in sources] + [[]]
    cfg = DecodeConfig(max_len_a=0.0, max_len_b=4)
    out = translate_ids(dec, srcs, cfg, sampling=Sampling(generator=gen(1)))
    assert len(out) == len(srcs) and out[-1] == []
    assert all(len(h) <= 4 for h in out) and any(len(h) == 4 for h in out)
    forced = translate_ids(dec, srcs[:4], cfg, min_len=4, sampling=Sampling(generator=gen(1)))
    assert all(len(h) == 4 for h in forced)  # EOS blocked until min_len
