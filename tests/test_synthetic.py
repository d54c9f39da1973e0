"""The offline demo corpus: deterministic, disjoint, library-made targets, clean-proof."""

import json
import random
import re
import sys

import pytest
import yaml
from num2words import num2words

from transformer.core.sections.download import CleanConfig, SyntheticConfig
from transformer.data import synthetic
from transformer.data.clean import normalize, pair_filter

SMALL = SyntheticConfig(train=2000, valid=200, test=200, seed=3)


def test_deterministic_in_seed():
    a, b = synthetic.generate(SMALL), synthetic.generate(SMALL)
    assert a == b
    other = synthetic.generate(SyntheticConfig(train=2000, valid=200, test=200, seed=4))
    assert other["train"] != a["train"]


def test_split_sizes_and_disjoint():
    s = synthetic.generate(SMALL)
    assert {k: len(v) for k, v in s.items()} == {"train": 2000, "valid": 200, "test": 200}
    for side in (0, 1):
        sets = {k: {p[side] for p in v} for k, v in s.items()}
        assert len(sets["train"]) == 2000  # no duplicate within a split either
        assert not sets["train"] & sets["valid"]
        assert not sets["train"] & sets["test"]
        assert not sets["valid"] & sets["test"]


def test_numbers_and_dates_come_from_the_libraries_reordered():
    rng = random.Random(0)
    for _ in range(50):
        en, de = synthetic._bought_on(rng)
        count = int(re.search(r" (\d+) ", en).group(1))
        assert f" {num2words(count, lang='de')} " in de  # 21 -> einundzwanzig
        _, day, year = re.search(r"on (\w+) (\d+), (\d{4})\.$", en).groups()
        assert re.search(rf"am {day}\. \w+ {year} ", de)  # "21. November 2026": day first
    en, de = synthetic._know_that(random.Random(5))
    assert de.endswith(" hat.")  # verb-final subordinate clause


def test_times_are_24_hour():
    rng = random.Random(1)
    for _ in range(100):
        en, de = synthetic._time(rng)
        h, m, ampm = re.fullmatch(r"(\d+):(\d\d) (AM|PM)", en).groups()
        h24 = int(h) % 12 + (12 if ampm == "PM" else 0)
        assert de == f"{h24:02d}:{m}"


def test_survives_default_cleaning_and_stays_short():
    cfg = CleanConfig()
    for en, de in synthetic.generate(SMALL)["train"]:
        assert normalize(en, cfg) == en and normalize(de, cfg) == de
        assert pair_filter(en, de, cfg) is None
        assert 5 <= len(en.split()) <= 15


def test_cli_prints_pairs(capsys):
    synthetic.main(["-n", "3", "--seed", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 and lines[1].startswith("  ")


@pytest.mark.slow  # the whole demo pipeline under real dvc, shortened (about a minute)
def test_demo_de_en_pipeline_translates_german_into_english(tmp_path):
    """`python -m transformer.config preset demo-de-en` then `dvc repro`: every stage runs the
    reversed direction, and the model package says German -> English."""
    from helpers.checkout import checkout
    from prefect_fixtures import DVC, sh

    project = checkout(tmp_path, remote=False)
    sh(sys.executable, "-m", "transformer.config", "preset", "demo-de-en", cwd=project)
    params = yaml.safe_load((project / "params.yaml").read_text())
    for key, value in SHORT.items():  # the demo's recipe, smaller and 40 updates
        section, *path, last = key.split(".")
        node = params[section]
        for name in path:
            node = node[name]
        node[last] = value
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    sh(*DVC, "repro", cwd=project)
    data = project / "data"
    manifest = json.loads((data / "metrics/download.json").read_text())
    assert (manifest["src_lang"], manifest["tgt_lang"]) == ("de", "en")
    hyps = (data / "eval/hyps.test.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len((data / "raw/test.en").read_text(encoding="utf-8").splitlines())
    scores = json.loads((data / "metrics/evaluate.json").read_text())
    assert scores["n_sentences"] == 20 and "bleu_tok_compound_split" not in scores  # German's
    card = (data / "package/README.md").read_text(encoding="utf-8")
    assert "de-en" in card and "en-de" not in card


SHORT = {
    "download.synthetic.train": 300,
    "download.synthetic.valid": 20,
    "download.synthetic.test": 20,
    "tokenizer.vocab_size": 300,
    "model.d_model": 32,
    "model.d_ff": 64,
    "model.n_layers": 1,
    "train.max_steps": 40,
    "train.save_every_steps": 10,
    "train.valid_every_steps": 20,
    "average.last_k": 2,
    "decode.beam_size": 1,
}
