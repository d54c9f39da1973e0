"""Scoring: BLEU equals the sacrebleu CLI's, t2t compound splitting, the stage's files, lineage."""

import json
import math
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from helpers.evaluate import LINES

from flows.dag import Stage
from flows.lineage import Snapshot, flatten, lineage
from transformer import average, evaluate
from transformer.core.files import sha256_file
from transformer.core.metrics import KEYS
from transformer.data.vocab import tokenizer_sha256
from transformer.model import checkpoint
from transformer.model.scoring import (
    MOSES_BLEU,
    TOK_BLEU,
    score,
    tokenize_compound_split,
    tokenize_moses_lc,
)


def sacrebleu_cli(ref: Path, hyp: Path, *extra: str) -> dict:
    """The `sacrebleu` console script beside this Python, JSON output (argument list, no shell)."""
    exe = shutil.which("sacrebleu", path=str(Path(sys.executable).parent)) or "sacrebleu"
    out = subprocess.run(
        [exe, str(ref), "-i", str(hyp), "-f", "json", "-w", "4", *extra],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def perturb(lines: list[str], seed: int = 0) -> list[str]:
    """System-like output: some words dropped or swapped, so BLEU lands well between 0 and 100."""
    rng, out = random.Random(seed), []
    for line in lines:
        w = line.split()
        if len(w) > 3 and rng.random() < 0.5:
            del w[rng.randrange(len(w))]
        if len(w) > 3 and rng.random() < 0.5:
            i = rng.randrange(len(w) - 1)
            w[i], w[i + 1] = w[i + 1], w[i]
        out.append(" ".join(w))
    return out


def test_bleu_and_chrf_equal_the_sacrebleu_cli(shared_data, tmp_path):
    refs = (shared_data / "multi30k" / "val.de").read_text(encoding="utf-8").splitlines()[:300]
    hyps = perturb(refs)
    (tmp_path / "ref.de").write_text("\n".join(refs) + "\n", encoding="utf-8")
    (tmp_path / "hyp.de").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    ours = score(hyps, refs, "de", tokenized_bleu=False)
    cli = sacrebleu_cli(tmp_path / "ref.de", tmp_path / "hyp.de", "-m", "bleu", "-l", "en-de")
    assert 20 < ours["bleu"] < 95
    assert ours["bleu"] == cli["score"] and ours["bleu_signature"] == cli["signature"]
    chrf = sacrebleu_cli(tmp_path / "ref.de", tmp_path / "hyp.de", "-m", "chrf")
    assert ours["chrf"] == chrf["score"] and ours["chrf_signature"] == chrf["signature"]


def test_compound_splitting_follows_get_ende_bleu():
    got = tokenize_compound_split(["Ein rich-text-Format, a-b-c “gut” & schnell."], "de")
    # what `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'` prints after tokenizer.perl -l de:
    # matches don't overlap, so in "a-b-c" the second hyphen stays
    assert got == [
        (
            "Ein rich ##AT##-##AT## text ##AT##-##AT## Format , a ##AT##-##AT## b-c "
            "&quot; gut &quot; &amp; schnell ."
        )
    ]
    hyps, refs = ["Das E-Mail-Programm ist neu."], ["Das E-Mail-Programm ist neu ."]
    s = score(hyps, refs, "de")
    assert s[TOK_BLEU] == 100.0 and s["bleu"] == 100.0
    assert "get_ende_bleu" in s[TOK_BLEU + "_method"]
    s = score(["Das E Mail Programm ist neu."], refs, "de")
    assert s[TOK_BLEU] < 100.0


def fairseq_bleu4(hyps: list[str], refs: list[str]) -> float:
    """fairseq's BLEU4 (fairseq/scoring/bleu.py's Scorer over libbleu), written out: per
    sentence the n-grams of its whitespace tokens, matches clipped by the reference's counts,
    all summed over the corpus; BP = min(1, exp(1 - reflen / predlen)); no smoothing."""
    match, count, reflen, predlen = [0] * 4, [0] * 4, 0, 0
    for hyp, ref in zip(hyps, refs):
        h, r = hyp.split(), ref.split()
        reflen, predlen = reflen + len(r), predlen + len(h)
        for n in range(1, 5):
            grams = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            theirs = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            match[n - 1] += sum(min(c, theirs[g]) for g, c in grams.items())
            count[n - 1] += max(len(h) - n + 1, 0)
    logs = [math.log(m / c) if m else float("-inf") for m, c in zip(match, count)]
    return min(1.0, math.exp(1 - reflen / predlen)) * math.exp(sum(logs) / 4) * 100


def test_moses_lc_bleu_is_fairseqs_bleu4_on_lowercased_moses_tokens(shared_data):
    refs = (shared_data / "multi30k" / "val.de").read_text(encoding="utf-8").splitlines()[:300]
    hyps = perturb(refs, seed=1)
    hyps = [h.upper() if i % 3 == 0 else h for i, h in enumerate(hyps)]  # case: not scored
    s = score(hyps, refs, "de", tokenized_bleu=False, moses_bleu=True)
    h, r = tokenize_moses_lc(hyps, "de"), tokenize_moses_lc(refs, "de")
    assert 20 < s[MOSES_BLEU] < 95 and s[MOSES_BLEU] > s["bleu"] + 5  # the upper-cased lines
    assert s[MOSES_BLEU] == pytest.approx(fairseq_bleu4(h, r), abs=1e-4)
    assert s[MOSES_BLEU + "_ref_tokens"] == sum(len(x.split()) for x in r)
    assert s[MOSES_BLEU + "_hyp_tokens"] == sum(len(x.split()) for x in h)
    assert tokenize_moses_lc(['Ein "Test" der E-Mail, 3.5 km.'], "de") == [
        "ein &quot; test &quot; der e-mail , 3.5 km ."
    ]  # Multi30k's lc.norm.tok files escape as tokenizer.perl does, hyphens kept (no -a)


def test_multi30k_test2016_german_reference_is_12103_moses_tokens(shared_data):
    """Wu et al. 2021's test2016 reference length in tokens (lowercased, Moses-tokenized)."""
    refs = (shared_data / "multi30k" / "test_2016_flickr.de").read_text(encoding="utf-8")
    lines = refs.splitlines()
    s = score(lines, lines, "de", tokenized_bleu=False, moses_bleu=True)
    assert s[MOSES_BLEU + "_ref_tokens"] == 12103 and s[MOSES_BLEU] == 100.0


def test_stage_writes_hyps_and_metrics_with_lineage(stage_inputs):
    d = stage_inputs
    params = ["--params", str(d / "params.yaml")]
    average.main([str(d / "ckpts"), str(d / "model.pt"), *params])
    evaluate.main(
        [
            str(d / "model.pt"),
            str(d / "tokenizer"),
            str(d / "raw"),
            str(d / "eval"),
            "--metrics",
            str(d / "metrics.json"),
            "--no-progress",
            *params,
        ]
    )
    m = json.loads((d / "metrics.json").read_text())
    hyps = d / "eval" / "hyps.test.txt"
    assert len(hyps.read_text(encoding="utf-8").split("\n")) == len(LINES) + 1
    assert m["split"] == "test" and m["beam_size"] == 2 and m["n_sentences"] == len(LINES)
    assert m["reference_cleanup"] == "none"  # the references as released (download.clean)
    assert m["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert {"chrf", TOK_BLEU, "chrf_signature", MOSES_BLEU} <= set(m)
    assert m[MOSES_BLEU + "_ref_tokens"] >= len(LINES) and "fairseq" in m[MOSES_BLEU + "_method"]
    assert m["lineage"]["averaged_steps"] == [1, 2]
    assert m["lineage"]["tokenizer_sha256"] == tokenizer_sha256(d / "tokenizer")
    assert m["bleu"] == sacrebleu_cli(d / "raw" / "test.de", hyps, "-m", "bleu")["score"]
    # the contract with the flows: every value they read is where transformer/core/metrics.py says
    flat = flatten(m)
    assert {f: flat.get(path) is not None for f, path in KEYS.items()} == dict.fromkeys(KEYS, True)
    record = lineage(
        Snapshot(d), {"evaluate": Stage("evaluate", (), (), ("metrics.json",), (), ())}, "rev"
    )
    assert record["test_sha256"] == m["set_sha256"] and record["bleu"] == m["bleu"]


def test_several_splits_and_beams_from_the_cli(stage_inputs, tmp_path):
    d = stage_inputs
    evaluate.main(
        [
            str(d / "ckpts" / "step_00000001.pt"),
            str(d / "tokenizer"),
            str(d / "raw"),
            str(tmp_path),
            "--split",
            "valid",
            "test",
            "--beam-size",
            "1",
            "3",
            "--metrics",
            str(tmp_path / "m.json"),
            "--no-progress",
            "--params",
            str(d / "params.yaml"),
        ]
    )
    m = json.loads((tmp_path / "m.json").read_text())
    assert {"valid.beam1", "test.beam1", "valid.beam3", "test.beam3", "lineage"} == set(m)
    assert m["test.beam3"]["beam_size"] == 3 and (tmp_path / "hyps.valid.beam1.txt").exists()
    assert m["lineage"]["averaged_steps"] == []


def test_bad_inputs_are_named(stage_inputs, tmp_path):
    d = stage_inputs
    args = [str(d / "tokenizer"), str(d / "raw"), str(tmp_path), "--params", str(d / "params.yaml")]
    with pytest.raises(SystemExit, match=r"error: .*params\.yaml: not a readable checkpoint"):
        evaluate.main([str(d / "params.yaml"), *args])
    with pytest.raises(SystemExit, match=r"error: .*nosuch\.en: no such file"):
        # a checkpoint of the fixture's own (model.pt is another test's average: any order)
        evaluate.main([str(d / "ckpts" / "step_00000002.pt"), *args, "--split", "nosuch"])


def test_an_ensemble_is_scored_and_its_members_recorded(stage_inputs, tmp_path):
    d, ck = stage_inputs, stage_inputs / "ckpts"
    common = [
        str(d / "tokenizer"),
        str(d / "raw"),
        "--no-progress",
        "--params",
        str(d / "params.yaml"),
    ]

    def run(out: Path, *extra: str) -> dict:
        evaluate.main(
            [
                str(ck / "step_00000002.pt"),
                common[0],
                common[1],
                str(out),
                "--metrics",
                str(out / "m.json"),
                *common[2:],
                *extra,
            ]
        )
        return json.loads((out / "m.json").read_text())

    alone = run(tmp_path / "alone")
    both = run(tmp_path / "both", "--ensemble", str(ck / "step_00000001.pt"))
    assert both["lineage"]["step"] == 2 and "ensemble" not in alone["lineage"]
    assert [e["step"] for e in both["lineage"]["ensemble"]] == [1]
    assert both["lineage"]["ensemble"][0]["model_sha256"] == sha256_file(ck / "step_00000001.pt")
    hyps = [(tmp_path / w / "hyps.test.txt").read_text() for w in ("alone", "both")]
    assert hyps[0] != hyps[1]  # the second model changed the translations

    other = checkpoint.load(ck / "step_00000001.pt")
    other["tokenizer_sha256"] = "0" * 64
    checkpoint.save(tmp_path / "other.pt", other)
    with pytest.raises(
        SystemExit,
        match=r"error: .*tokenizer sha256 \w+ is not the one "
        r".*other\.pt was trained with",
    ):
        run(tmp_path / "bad", "--ensemble", str(tmp_path / "other.pt"))
