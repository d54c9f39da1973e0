"""The offline demo corpus: English→German sentences whose hard parts come from real libraries.

Numbers are spelled by num2words (21 → "einundzwanzig": units before tens), dates and times are
formatted by Babel from CLDR ("November 21, 2026" → "21. November 2026", "2:30 PM" → "14:30"),
quantities by Babel's unit formats ("3.5 liters" → "3,5 Liter"). The templates put German
verbs where German wants them (verb-second after a fronted adverb, verb-final in subordinate
clauses), so a model must attend across the sentence rather than translate word by word.
The words around the slots come from a small hand-written lexicon, which keeps the corpus
learnable by a tiny Transformer in minutes. Deterministic given the seed; splits are disjoint.
"""

from __future__ import annotations

import argparse
import datetime
import random
from collections.abc import Callable

from babel.dates import format_date, format_time
from babel.units import format_unit
from num2words import num2words

from transformer.core.sections.download import SyntheticConfig

EN, DE = "en_US", "de_DE"
NAMES = [
    "Anna",
    "Ben",
    "Clara",
    "David",
    "Emma",
    "Felix",
    "Greta",
    "Hans",
    "Ida",
    "Jonas",
    "Lena",
    "Max",
    "Nina",
    "Paul",
    "Sophie",
    "Tom",
]
# english singular, english plural, german singular, german plural, gender (m/f/n)
NOUNS = [
    ("apple", "apples", "Apfel", "Äpfel", "m"),
    ("book", "books", "Buch", "Bücher", "n"),
    ("car", "cars", "Auto", "Autos", "n"),
    ("chair", "chairs", "Stuhl", "Stühle", "m"),
    ("cup", "cups", "Tasse", "Tassen", "f"),
    ("dog", "dogs", "Hund", "Hunde", "m"),
    ("flower", "flowers", "Blume", "Blumen", "f"),
    ("house", "houses", "Haus", "Häuser", "n"),
    ("key", "keys", "Schlüssel", "Schlüssel", "m"),
    ("lamp", "lamps", "Lampe", "Lampen", "f"),
    ("letter", "letters", "Brief", "Briefe", "m"),
    ("table", "tables", "Tisch", "Tische", "m"),
    ("ticket", "tickets", "Fahrkarte", "Fahrkarten", "f"),
    ("picture", "pictures", "Bild", "Bilder", "n"),
    ("shoe", "shoes", "Schuh", "Schuhe", "m"),
]
# english past, german simple past, german past participle
VERBS = [
    ("bought", "kaufte", "gekauft"),
    ("sold", "verkaufte", "verkauft"),
    ("found", "fand", "gefunden"),
    ("saw", "sah", "gesehen"),
    ("painted", "malte", "gemalt"),
    ("cleaned", "putzte", "geputzt"),
    ("repaired", "reparierte", "repariert"),
    ("ordered", "bestellte", "bestellt"),
    ("lost", "verlor", "verloren"),
    ("carried", "trug", "getragen"),
]
PLACES = [  # english, german, gender: "to the X" is "zum" (m/n) or "zur" (f) + dative
    ("station", "Bahnhof", "m"),
    ("school", "Schule", "f"),
    ("museum", "Museum", "n"),
    ("park", "Park", "m"),
    ("library", "Bibliothek", "f"),
    ("market", "Markt", "m"),
    ("office", "Büro", "n"),
    ("bakery", "Bäckerei", "f"),
    ("harbour", "Hafen", "m"),
    ("church", "Kirche", "f"),
]
CONTAINERS = [
    ("bottle", "Flasche", "f"),
    ("box", "Kiste", "f"),
    ("bag", "Tasche", "f"),
    ("basket", "Korb", "m"),
    ("bucket", "Eimer", "m"),
    ("bowl", "Schüssel", "f"),
]
STUFF = [
    ("water", "Wasser"),
    ("milk", "Milch"),
    ("sugar", "Zucker"),
    ("flour", "Mehl"),
    ("rice", "Reis"),
    ("sand", "Sand"),
    ("coffee", "Kaffee"),
    ("salt", "Salz"),
]
NOM = {"m": "der", "f": "die", "n": "das"}  # definite article, nominative
ACC = {"m": "den", "f": "die", "n": "das"}  # ... accusative
TO = {"m": "zum", "f": "zur", "n": "zum"}  # "zu dem" / "zu der" contracted
FIRST, LAST = datetime.date(2020, 1, 1).toordinal(), datetime.date(2029, 12, 31).toordinal()

Pair = tuple[str, str]


def _space(s: str) -> str:
    """CLDR puts no-break spaces in "2:30 PM" and "3,5 Liter"; plain spaces tokenize alike."""
    return s.replace("\u202f", " ").replace("\xa0", " ")


def _date(rng: random.Random, fmt: str = "long") -> Pair:
    d = datetime.date.fromordinal(rng.randint(FIRST, LAST))
    return _space(format_date(d, fmt, locale=EN)), _space(format_date(d, fmt, locale=DE))


def _time(rng: random.Random) -> Pair:
    t = datetime.time(rng.randrange(24), 5 * rng.randrange(12))  # 12-hour "2:30 PM" -> "14:30"
    return _space(format_time(t, "short", locale=EN)), _space(format_time(t, "short", locale=DE))


def _count(rng: random.Random) -> Pair:
    n = rng.randint(2, 999)  # >= 2: the noun is plural; German words put units before tens
    return str(n), num2words(n, lang="de")


def _ordinal(rng: random.Random) -> Pair:
    n = rng.randint(1, 31)
    return num2words(n, lang="en", to="ordinal_num"), num2words(n, lang="de", to="ordinal")


def _quantity(rng: random.Random, units: list[str]) -> Pair:
    unit = rng.choice(units)
    value = rng.randint(1, 40) / 2 if unit != "length-meter" else 50 * rng.randint(2, 40)
    value = int(value) if value == int(value) else value  # "3 liters", not "3.0 liters"
    return tuple(_space(format_unit(value, unit, length="long", locale=loc)) for loc in (EN, DE))


def _bought_on(rng: random.Random) -> Pair:
    name, (v_en, v_de, _), (_, pl_en, _, pl_de, _) = (
        rng.choice(NAMES),
        rng.choice(VERBS),
        rng.choice(NOUNS),
    )
    (n_en, n_de), (d_en, d_de) = _count(rng), _date(rng)
    return f"{name} {v_en} {n_en} {pl_en} on {d_en}.", f"{name} {v_de} am {d_de} {n_de} {pl_de}."


def _on_date_fronted(rng: random.Random) -> Pair:  # German verb-second: "Am ... kaufte Anna ..."
    name, (v_en, v_de, _), (_, pl_en, _, pl_de, _) = (
        rng.choice(NAMES),
        rng.choice(VERBS),
        rng.choice(NOUNS),
    )
    (n_en, n_de), (d_en, d_de) = _count(rng), _date(rng)
    return f"On {d_en}, {name} {v_en} {n_en} {pl_en}.", f"Am {d_de} {v_de} {name} {n_de} {pl_de}."


def _know_that(rng: random.Random) -> Pair:  # verb-final subordinate clause
    name, (v_en, _, v_part), (o_en, _, o_de, _, g) = (
        rng.choice(NAMES),
        rng.choice(VERBS),
        rng.choice(NOUNS),
    )
    t_en, t_de = _time(rng)
    return (
        f"I know that {name} {v_en} the {o_en} at {t_en}.",
        f"Ich weiß, dass {name} um {t_de} {ACC[g]} {o_de} {v_part} hat.",
    )


def _costs(rng: random.Random) -> Pair:
    (o_en, _, o_de, _, g), (r_en, r_de), (n_en, n_de) = (
        rng.choice(NOUNS),
        _ordinal(rng),
        _count(rng),
    )
    return (
        f"The {r_en} {o_en} costs {n_en} euros.",
        f"{NOM[g].capitalize()} {r_de} {o_de} kostet {n_de} Euro.",
    )


def _will_walk(rng: random.Random) -> Pair:  # modal + infinitive at the end
    name, (p_en, p_de, g) = rng.choice(NAMES), rng.choice(PLACES)
    q_en, q_de = _quantity(rng, ["length-kilometer", "length-meter"])
    return (
        f"Tomorrow {name} will walk {q_en} to the {p_en}.",
        f"Morgen wird {name} {q_de} {TO[g]} {p_de} laufen.",
    )


def _because(rng: random.Random) -> Pair:
    name, (o_en, _, o_de, _, g), (d_en, d_de) = rng.choice(NAMES), rng.choice(NOUNS), _date(rng)
    return (
        f"{name} was happy because the {o_en} arrived on {d_en}.",
        f"{name} war glücklich, weil {NOM[g]} {o_de} am {d_de} ankam.",
    )


def _meeting(rng: random.Random) -> Pair:
    name, (d_en, d_de), (t_en, t_de) = rng.choice(NAMES), _date(rng, "full"), _time(rng)
    return (
        f"The meeting with {name} is on {d_en} at {t_en}.",
        f"Das Treffen mit {name} ist am {d_de} um {t_de}.",
    )


def _holds(rng: random.Random) -> Pair:
    (c_en, c_de, g), (s_en, s_de) = rng.choice(CONTAINERS), rng.choice(STUFF)
    unit = (
        ["volume-liter"] if s_en in ("water", "milk", "coffee") else ["mass-kilogram", "mass-gram"]
    )
    q_en, q_de = _quantity(rng, unit)
    return (
        f"The {c_en} holds {q_en} of {s_en}.",
        f"{NOM[g].capitalize()} {c_de} enthält {q_de} {s_de}.",
    )


def _train_leaves(rng: random.Random) -> Pair:  # separable verb, final: "abfährt"
    name, (r_en, r_de), (t_en, t_de) = rng.choice(NAMES), _ordinal(rng), _time(rng)
    return (
        f"{name} says that the {r_en} train leaves at {t_en}.",
        f"{name} sagt, dass der {r_de} Zug um {t_de} abfährt.",
    )


TEMPLATES: list[Callable[[random.Random], Pair]] = [
    _bought_on,
    _on_date_fronted,
    _know_that,
    _costs,
    _will_walk,
    _because,
    _meeting,
    _holds,
    _train_leaves,
]


def generate(cfg: SyntheticConfig) -> dict[str, list[Pair]]:
    """{split: [(english, german)]}, deterministic in cfg.seed; no sentence in two splits."""
    rng = random.Random(cfg.seed)
    seen_en: set[str] = set()
    seen_de: set[str] = set()
    out: dict[str, list[Pair]] = {}
    for split in ("test", "valid", "train"):  # eval first: train is what loses the rare clash
        pairs: list[Pair] = []
        want, tries = getattr(cfg, split), 0
        while len(pairs) < want:
            tries += 1
            if tries > 20 * want + 1000:
                raise ValueError(f"synthetic: cannot draw {want} distinct {split} sentences")
            en, de = rng.choice(TEMPLATES)(rng)
            if en in seen_en or de in seen_de:  # disjoint splits, and no duplicate pairs
                continue
            seen_en.add(en)
            seen_de.add(de)
            pairs.append((en, de))
        out[split] = pairs
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.data.synthetic",
        description="Print a few synthetic pairs.",
    )
    parser.add_argument("-n", type=int, default=10, help="how many pairs (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    cfg = SyntheticConfig(train=args.n, valid=0, test=0, seed=args.seed)
    for en, de in generate(cfg)["train"]:
        print(f"{en}\n  {de}")


if __name__ == "__main__":
    main()
