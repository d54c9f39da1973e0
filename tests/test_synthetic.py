"""The offline demo corpus: deterministic, disjoint, library-made targets, clean-proof. (The
demo reversed, `demo-de-en`, through every stage: tests/test_flows_continue.py's line b.)"""

import random
import re

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
