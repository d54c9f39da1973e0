"""The download stage's monolingual part: a local file, the News Crawl layout (a folder, a
server on 127.0.0.1), Hugging Face `datasets` (a local Hub-layout copy), each cleaned by the
rules of one side of a train pair; bad input named by file and line; parts' line ranges."""

import gzip
import json
import logging
from pathlib import Path

import pytest
import yaml
from helpers.download import Server, hub_replica, local, write

from transformer import download
from transformer.core import settings
from transformer.core.sections.download import DownloadConfig, MonoSpec
from transformer.core.settings import ConfigError


def corpus(tmp_path: Path, **over) -> dict:
    """A local en -> de corpus (two train pairs; valid / test one each) with `over` laid on."""
    write(tmp_path / "t.en", "a house\nthe tree\nsmall dog\n")
    write(tmp_path / "t.de", "ein Haus\nder Baum\nkleiner Hund\n")
    write(tmp_path / "v.en", "the cat\n")
    write(tmp_path / "v.de", "die Katze schläft\n")
    parts = {"path": str(tmp_path / "t.{lang}")}
    evals = [{"path": str(tmp_path / "v.{lang}")}]
    return {**local(tmp_path, train=[parts], valid=evals, test=evals), **over}


def run(tmp_path: Path, section: dict) -> tuple[list[str], dict]:
    """The stage's CLI with --mono: (the monolingual lines, the manifest's record of them)."""
    params = write(tmp_path / "params.yaml", yaml.safe_dump({"download": section}))
    out, manifest = tmp_path / "out", tmp_path / "download.json"
    download.main(
        [str(out / "raw"), "--mono", str(out / "mono"), "--manifest", str(manifest)]
        + ["--params", str(params)]
    )
    text = (out / "mono" / "mono.de").read_text(encoding="utf-8")
    return text.splitlines(), json.loads(manifest.read_text())["monolingual"]


def test_a_local_file_is_cleaned_as_one_side_of_a_train_pair(tmp_path, caplog):
    write(
        tmp_path / "mono.de",
        b"Ein  Hund rennt\nEin Hund rennt\n\nkaputt \xff hier\ndie Katze schl\xc3\xa4ft\n"
        + b"Caf\x65\xcc\x81 am Markt\n"
        + b"viel " * 12
        + b"\n",
    )
    section = corpus(
        tmp_path, monolingual=[{"path": str(tmp_path / "mono.{lang}")}], clean={"max_words": 10}
    )
    with caplog.at_level(logging.WARNING, "transformer.download"):
        got, m = run(tmp_path, section)
    assert got == ["Ein Hund rennt", "Café am Markt"]  # whitespace collapsed, NFC
    d = m["dropped"]
    assert (m["read"], m["kept"]) == (7, 2)
    assert (d["duplicate"], d["empty"], d["invalid_utf8"], d["eval_overlap"], d["too_long"]) == (
        1,
        1,
        1,
        1,  # a valid / test reference: never in training data, not even as a target
        1,
    )
    assert f"{tmp_path / 'mono.de'}: line 4: invalid UTF-8" in caplog.text
    assert m["parts"]["mono.de"]["kept"] == 2 and m["files"]["mono.de"]["lines"] == 2


def test_without_parts_the_folder_holds_an_empty_file(tmp_path):
    got, m = run(tmp_path, corpus(tmp_path))
    assert got == [] and (m["read"], m["kept"]) == (0, 0)


def newscrawl(folder: Path) -> Path:
    """WMT's News Crawl layout: two German years (one gzipped), an English one, another file."""
    folder.mkdir()
    write(folder / "news.2019.de.shuffled.deduped.gz", gzip.compress(b"Satz eins\nSatz zwei\n"))
    write(folder / "news.2020.de.shuffled.deduped", "Satz drei\nSatz vier\n")
    write(folder / "news.2020.en.shuffled.deduped", "sentence\n")
    write(folder / "README", "not a year\n")
    return folder


def test_the_news_crawl_layout_reads_the_years_in_order(tmp_path):
    folder = newscrawl(tmp_path / "news-crawl")
    spec = {"path": str(folder), "format": "newscrawl"}
    got, m = run(tmp_path, corpus(tmp_path, monolingual=[spec]))
    assert got == ["Satz eins", "Satz zwei", "Satz drei", "Satz vier"]
    assert list(m["parts"]) == ["newscrawl:news-crawl"]
    got, _ = run(tmp_path, corpus(tmp_path, monolingual=[{**spec, "years": [2020]}]))
    assert got == ["Satz drei", "Satz vier"]
    # lines and max_lines count on across the years' files
    got, _ = run(tmp_path, corpus(tmp_path, monolingual=[{**spec, "lines": "2-", "max_lines": 2}]))
    assert got == ["Satz zwei", "Satz drei"]


def test_the_news_crawl_layout_on_a_server(tmp_path):
    body = gzip.compress(b"Zeile eins\nZeile zwei\n")
    server = Server({"/news-crawl/de/news.2021.de.shuffled.deduped.gz": body})
    try:
        spec = {"path": f"{server.url}/news-crawl/{{lang}}", "format": "newscrawl"}
        got, m = run(tmp_path, corpus(tmp_path, monolingual=[{**spec, "years": [2021]}]))
        assert got == ["Zeile eins", "Zeile zwei"] and m["kept"] == 2
        with pytest.raises(SystemExit, match=r"monolingual\[0\].years: a News Crawl URL"):
            run(tmp_path, corpus(tmp_path, monolingual=[spec]))
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def test_bad_monolingual_input_names_the_file_line_or_key(tmp_path):
    folder = newscrawl(tmp_path / "nc")
    spec = {"path": str(folder), "format": "newscrawl"}
    with pytest.raises(
        SystemExit, match=r"nc/news\.2018\.de\.shuffled\.deduped\(\.gz\): no such.*2019, 2020"
    ):
        run(tmp_path, corpus(tmp_path, monolingual=[{**spec, "years": [2018]}]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=r"empty: no news\.YEAR\.de\.shuffled\.deduped"):
        run(tmp_path, corpus(tmp_path, monolingual=[{**spec, "path": str(tmp_path / "empty")}]))
    body = gzip.compress("".join(f"Zeile {i * 7919 % 10007}\n" for i in range(5000)).encode())
    write(tmp_path / "broken.de.gz", body[: len(body) // 2])  # a download cut short
    with pytest.raises(SystemExit, match=r"broken\.de\.gz: read failed after line \d+"):
        run(tmp_path, corpus(tmp_path, monolingual=[{"path": str(tmp_path / "broken.de.gz")}]))
    with pytest.raises(SystemExit, match=r"nowhere\.de: no such file"):
        run(tmp_path, corpus(tmp_path, monolingual=[{"path": str(tmp_path / "nowhere.de")}]))
    params = write(
        tmp_path / "p.yaml",
        yaml.safe_dump({"download": {"monolingual": [{"path": "x", "lines": "5-2"}]}}),
    )
    with pytest.raises(ConfigError, match=r"p\.yaml: download\.monolingual\[0\]\.lines must be"):
        settings.load(DownloadConfig, "download", params)
    with pytest.raises(download.DownloadError, match="no folder was given for them"):
        download.download(DownloadConfig(monolingual=[MonoSpec(path="x")]), tmp_path / "raw")


def test_hugging_face_text_and_translation_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = tmp_path / "texts"
    (texts / "data").mkdir(parents=True)
    pq.write_table(
        pa.table({"text": ["Erster Satz", None, "Zweiter Satz"]}),
        texts / "data" / "train-00000-of-00001.parquet",
    )
    cache = str(tmp_path / "hfcache")
    section = corpus(
        tmp_path, monolingual=[{"path": str(texts), "format": "hf"}], hf_cache_dir=cache
    )
    got, m = run(tmp_path, section)
    assert got == ["Erster Satz", "Zweiter Satz"] and m["dropped"]["malformed"] == 1
    hub = hub_replica(tmp_path / "hub")  # a translation column: its German side
    spec = {"path": str(hub), "format": "hf", "hf_name": "de-en", "hf_column": "translation"}
    got, _ = run(
        tmp_path, corpus(tmp_path, monolingual=[{**spec, "max_lines": 3}], hf_cache_dir=cache)
    )
    assert got == ["train Satz 0", "train Satz 1", "train Satz 2"]
    with pytest.raises(
        SystemExit, match=r"no column 'sentence' \(download\.monolingual\[0\]\.hf_column"
    ):
        run(
            tmp_path,
            corpus(tmp_path, monolingual=[{**spec, "hf_column": "sentence"}], hf_cache_dir=cache),
        )


def test_a_parallel_part_can_be_a_range_of_its_lines(tmp_path):
    section = corpus(tmp_path)
    section["splits"]["train"][0]["lines"] = "2-3"
    run(tmp_path, section)
    out = tmp_path / "out" / "raw"
    assert (out / "train.en").read_text().splitlines() == ["the tree", "small dog"]
    section["splits"]["test"] = [{**section["splits"]["test"][0], "format": "sgm", "lines": "1-"}]
    with pytest.raises(SystemExit, match=r"splits\.test\[0\]\.lines: an sgm part is read whole"):
        run(tmp_path, section)


def test_the_crawl_filters_judge_the_target_language_alone(tmp_path):
    write(
        tmp_path / "crawl.de",
        "Der Hund läuft schnell über die grüne Wiese im Park\n"
        "This is clearly an English sentence about the weather today\n"
        "12345 67890 ### 2024 !!!\n"
        "Die Kinder spielen am Nachmittag fröhlich im Garten hinter dem Haus\n",
    )
    spec = {"path": str(tmp_path / "crawl.de"), "clean": {"langid": True, "script": True}}
    got, m = run(tmp_path, corpus(tmp_path, monolingual=[spec]))
    assert got == [
        "Der Hund läuft schnell über die grüne Wiese im Park",
        "Die Kinder spielen am Nachmittag fröhlich im Garten hinter dem Haus",
    ]
    assert (m["dropped"]["wrong_language"], m["dropped"]["script"]) == (1, 1)
