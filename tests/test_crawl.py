"""The crawl filters (language ID, copies, script ratio): each decision, its manifest count per
split and part, evaluation sets left byte for byte, and the max_drop guard."""

import pytest
from helpers.download import local, run_cli, write

from transformer.core.files import sha256_file
from transformer.core.sections.download import CleanConfig, SourceSpec, part_clean
from transformer.core.settings import ConfigError
from transformer.data.crawl import CrawlFilter, is_copy, script_letters, script_ratio

ALL = CleanConfig(langid=True, copies=True, script=True)
BORN = (
    "Born 1958 in Obernberg am Inn / Austria .",
    "Geboren 1958 in Obernberg am Inn / Österreich .",
)
GOOD = [
    ("The hotel is close to the old town and the station .", "Das Hotel liegt nahe der Altstadt und dem Bahnhof ."),
    ("We would like to thank the rapporteur for his excellent work .", "Wir danken dem Berichterstatter für seine hervorragende Arbeit ."),
    ("Breakfast is served every morning in the garden .", "Das Frühstück wird jeden Morgen im Garten serviert ."),
    BORN,
]  # fmt: skip
FRENCH = ("The restaurant is an ideal meeting point .", "Le restaurant est un point de rencontre idéal .")  # fmt: skip
COPY = (
    "This page was last modified on 5 May 2010 .",
    "This page was last modified on 5 May 2010 .",
)
DIGITS = ("Tel. 0049 30 1234 567 , 0049 30 1234 568", "Fax 0049 30 1234 569 , 0049 30 1234 560")


def test_each_filter_names_its_reason():
    f = CrawlFilter(ALL, "en", "de")
    assert f.reason(*FRENCH) == "wrong_language"
    assert f.reason(*COPY) == "copy"
    assert f.reason(*DIGITS) == "script"
    assert [f.reason(*p) for p in GOOD] == [None] * len(GOOD)


def test_short_or_unsure_lines_are_not_judged():
    f = CrawlFilter(ALL, "en", "de")
    assert not f.wrong_language(BORN[0], 0)  # py3langid's top is German at 0.13: unsure
    assert not f.wrong_language("Hotel Berlin", 0)  # two words: below langid_min_words
    sure = CrawlFilter(CleanConfig(langid=True, langid_min_prob=0.0), "en", "de")
    assert sure.wrong_language(BORN[0], 0)  # with no confidence asked, it would have gone


def test_copies_after_normalisation_and_nearly():
    assert is_copy("Hello , World !", "hello world", 0.8)
    assert is_copy(*COPY, 0.8)
    assert not is_copy(*GOOD[0], 0.8)
    assert not is_copy("2004 .", "2004 .", 0.8)  # no letters: the script filter's
    assert not is_copy("Global Account Manager at Sun", "Global Account Manager bei Sun", 0.8)


def test_script_ratio_counts_the_side_s_script():
    latin, cyrillic = script_letters("de"), script_letters("ru")
    assert script_ratio("Крім того , ми рекомендуємо", latin) < 0.1
    assert script_ratio("Крім того , ми рекомендуємо", cyrillic) > 0.8
    assert script_ratio(BORN[1], latin) > 0.7
    assert script_ratio(". . .", latin) == 0.0


def test_switched_off_filters_keep_everything():
    f = CrawlFilter(CleanConfig(), "en", "de")
    assert not f.active
    assert [f.reason(*p) for p in (FRENCH, COPY, DIGITS)] == [None, None, None]


def test_unknown_language_code_is_a_config_error():
    with pytest.raises(ConfigError, match="download.tgt_lang: 'xx' is not a language py3langid"):
        CrawlFilter(ALL, "en", "xx")


def test_part_settings_are_checked():
    with pytest.raises(ConfigError, match=r"unknown key k\.dedup \(a part may set: langid"):
        part_clean(CleanConfig(), SourceSpec(clean={"dedup": False}), "k")
    with pytest.raises(ConfigError, match=r"k\.langid must be bool, got 'yes'"):
        part_clean(CleanConfig(), SourceSpec(clean={"langid": "yes"}), "k")
    assert part_clean(CleanConfig(), SourceSpec(clean={"copies": True}), "k").copies


def _corpus(tmp_path, tgt_lang="de", max_drop=0.5):
    """Two train parts with the same noise, filters on for the crawl only; valid with French."""
    noisy = [*GOOD * 3, FRENCH, COPY, DIGITS]
    d = tmp_path / "in"
    d.mkdir()
    for name, pairs in (("crawl", noisy), ("europarl", noisy), ("valid", [*GOOD, FRENCH])):
        write(d / f"{name}.en", "".join(s + "\n" for s, _ in pairs))
        write(d / f"{name}.{tgt_lang}", "".join(t + "\n" for _, t in pairs))
    crawl = {"langid": True, "copies": True, "script": True}
    cfg = local(
        tmp_path,
        train=[
            {"path": str(d / "crawl.{lang}"), "name": "crawl", "clean": crawl},
            {"path": str(d / "europarl.{lang}"), "name": "europarl"},
        ],
        valid=[{"path": str(d / "valid.{lang}"), "name": "dev", "clean": crawl}],
        test=[{"path": str(d / "valid.{lang}"), "name": "test"}],
    )
    cfg.update(tgt_lang=tgt_lang, clean={"dedup": False, "drop_eval_overlap": False, "max_drop": max_drop})  # fmt: skip
    return d, cfg


def test_counts_per_part_and_split_and_eval_untouched(tmp_path):
    d, cfg = _corpus(tmp_path)
    out, m = run_cli(tmp_path, cfg)
    train = m["splits"]["train"]
    crawl, europarl = train["parts"]["crawl"], train["parts"]["europarl"]
    assert {k: crawl["dropped"][k] for k in ("wrong_language", "copy", "script")} == {
        "wrong_language": 1,
        "copy": 1,
        "script": 1,
    }
    assert crawl["kept"] == 12 and europarl["kept"] == 15  # europarl: today's rules only
    assert train["dropped"]["copy"] == 1 and train["kept"] == 27
    assert BORN[0] in (out / "train.en").read_text()
    dev = m["splits"]["valid"]
    assert dev["flagged"] == {"wrong_language": 1, "copy": 0, "script": 0}
    assert dev["kept"] == dev["read"] == 5  # flagged, never dropped
    for lang in ("en", "de"):
        assert sha256_file(out / f"valid.{lang}") == sha256_file(d / f"valid.{lang}")


def test_a_wrong_language_code_stops_the_stage(tmp_path):
    _, cfg = _corpus(tmp_path, tgt_lang="fr")  # German text declared French
    with pytest.raises(
        SystemExit, match=r"train: crawl: the wrong_language filter removed \d+ of 15"
    ):
        run_cli(tmp_path, cfg)
    assert not (tmp_path / "raw").exists()  # no half-written output
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_max_drop_names_the_part_and_filter(tmp_path):
    _, cfg = _corpus(tmp_path, max_drop=0.0)
    with pytest.raises(
        SystemExit,
        match=r"train: crawl: the wrong_language filter removed 1 of 15 pairs \(6.7%\), more "
        r"than download.clean.max_drop \(0.0\)",
    ):
        run_cli(tmp_path, cfg)
    assert not (tmp_path / "raw").exists()


def test_real_crawl_sample(tmp_path, shared_data):
    """wmt-sample's first 3,000 pairs filtered; Multi30k's val and test kept byte for byte."""
    ws, m30k = shared_data / "wmt-sample", shared_data / "multi30k"
    d = tmp_path / "in"
    d.mkdir()
    for lang in ("en", "de"):
        head = (ws / f"train.tok.{lang}").read_text(encoding="utf-8").splitlines()[:3000]
        write(d / f"train.{lang}", "\n".join(head) + "\n")
    on = {"langid": True, "copies": True, "script": True}
    cfg = local(
        tmp_path,
        train=[{"path": str(d / "train.{lang}"), "name": "sample"}],
        valid=[{"path": str(m30k / "val.{lang}"), "name": "val"}],
        test=[{"path": str(m30k / "test_2016_flickr.{lang}"), "name": "test2016"}],
    )
    cfg["clean"] = on
    out, m = run_cli(tmp_path, cfg)
    dropped = m["splits"]["train"]["dropped"]
    assert dropped["wrong_language"] >= 3 and dropped["copy"] >= 3 and dropped["script"] >= 1
    assert "Born 1958 in Obernberg am Inn / Austria ." in (out / "train.en").read_text()
    assert m["splits"]["test"]["flagged"]["wrong_language"] <= 2  # real German and English
    for split, name in (("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("en", "de"):
            assert sha256_file(out / f"{split}.{lang}") == sha256_file(m30k / f"{name}.{lang}")
