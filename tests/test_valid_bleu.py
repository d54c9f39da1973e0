"""Valid BLEU during training: the evaluate stage's decoding and sacreBLEU on the same weights
give the same numbers, alone or split across two gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.train import run, write_params

from transformer import evaluate
from transformer.core.sections.train import TrainConfig
from transformer.model import checkpoint
from transformer.training.validation import ValidBleu, load_valid_text


def references_near(raw, hyps: Path, out: Path) -> Path:
    """raw/valid.* with every other reference replaced by the model's own hypothesis: a chrF
    above 0 and below 100 for an untrained model."""
    out.mkdir()
    (out / "valid.en").write_bytes((raw / "valid.en").read_bytes())
    refs = (raw / "valid.de").read_text(encoding="utf-8").splitlines()
    own = hyps.read_text(encoding="utf-8").splitlines()
    mixed = [h if i % 2 else r for i, (h, r) in enumerate(zip(own, refs))]
    (out / "valid.de").write_text("\n".join(mixed) + "\n", encoding="utf-8")
    return out


@pytest.mark.parametrize("beam", [1, 0])  # greedy, and decode.beam_size's beam (2 here)
def test_valid_bleu_equals_the_evaluate_stages_bleu(stage_inputs, tmp_path, beam):
    d = stage_inputs
    ckpt, params, tok = d / "ckpts" / "step_00000002.pt", d / "params.yaml", d / "tokenizer"

    def evaluated(raw: Path, name: str) -> dict:
        args = [str(ckpt), str(tok), str(raw), str(tmp_path / name), "--split", "valid"]
        args += ["--beam-size", str(beam or 2), "--no-progress", "--params", str(params)]
        evaluate.main([*args, "--metrics", str(tmp_path / f"{name}.json")])
        return json.loads((tmp_path / f"{name}.json").read_text())

    evaluated(d / "raw", "first")
    raw = references_near(d / "raw", tmp_path / "first" / "hyps.valid.txt", tmp_path / "raw")
    want = evaluated(raw, "ev")
    assert 0 < want["chrf"] < 100, want  # (BLEU: 0, the untrained model's hypotheses are
    # single words: no 4-grams)
    text = load_valid_text(raw, TrainConfig(valid_bleu_beam_size=beam), params)
    assert text.decode.beam_size == (beam or 2) and len(text.src) == 8
    model = checkpoint.build_model(checkpoint.load(ckpt))
    got = ValidBleu(text, tok, torch.device("cpu"))(model)
    assert (got["bleu"], got["chrf"]) == (want["bleu"], want["chrf"])


def test_a_fixed_subset_is_the_first_n_sentences(stage_inputs):
    d = stage_inputs
    cfg = TrainConfig(valid_bleu_sentences=3)
    text = load_valid_text(d / "raw", cfg, d / "params.yaml")
    lines = (d / "raw" / "valid.en").read_text(encoding="utf-8").splitlines()
    assert text.src == lines[:3] and len(text.refs) == 3


@pytest.mark.slow  # torchrun with two gloo ranks
def test_two_gloo_ranks_score_the_valid_bleu_of_one_process(corpus, tmp_path):
    # one update at a negligible rate: weights near their initialisation, whose hypotheses are
    # words (a few updates more and the model says only its most frequent unit, " ")
    over = {"max_steps": 1, "valid_every_steps": 1, "lr_scale": 1e-6, "valid_bleu_beam_size": 1}
    one, two = (write_params(tmp_path / f"{n}.yaml", nproc=n, **over) for n in (1, 2))
    run(corpus, tmp_path / "one", one)
    # references half its own greedy output: a chrF above 0 to compare
    args = [str(checkpoint.step_path(tmp_path / "one", 1)), str(corpus / "tok")]
    args += [str(corpus / "raw"), str(tmp_path / "ev"), "--split", "valid", "--beam-size", "1"]
    evaluate.main([*args, "--no-progress", "--params", str(one)])
    raw = references_near(corpus / "raw", tmp_path / "ev" / "hyps.valid.txt", tmp_path / "raw")
    live = tmp_path / "live"
    run(corpus, tmp_path / "two", two, "--raw", str(raw), "--live", str(live), nproc=2)
    logged = json.loads((live / "metrics.json").read_text())["valid"]
    text = load_valid_text(raw, TrainConfig(valid_bleu_beam_size=1), two)
    model = checkpoint.build_model(checkpoint.load(checkpoint.step_path(tmp_path / "two", 1)))
    alone = ValidBleu(text, corpus / "tok", torch.device("cpu"))(model)
    assert logged["chrf"] > 0
    assert (logged["bleu"], logged["chrf"]) == (alone["bleu"], alone["chrf"])


def test_validating_more_often_leaves_the_weights_alone(corpus, tmp_path):
    """Scoring valid BLEU draws no random number: a run's dropout stream, and so its weights,
    are the same whether it validates after every update or every third."""
    weights = []
    for every in (1, 3):
        params = write_params(tmp_path / f"{every}.yaml", valid_every_steps=every)
        live = tmp_path / f"live{every}"
        run(corpus, tmp_path / f"ckpt{every}", params, "--raw", corpus / "raw", "--live", live)
        scored = (live / "plots/metrics/valid/bleu.tsv").read_text().splitlines()[1:]
        assert len(scored) == 6 // every, scored  # (step, BLEU) at each validation
        weights.append(checkpoint.load(checkpoint.step_path(tmp_path / f"ckpt{every}", 6)))
    assert all(torch.equal(weights[0]["model"][k], v) for k, v in weights[1]["model"].items())
