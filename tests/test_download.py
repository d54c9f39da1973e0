"""The download stage end to end: every source, the cleaning counts, faults and atomicity."""

import gzip
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from helpers.download import SGM, TGZ, Server, hub_replica, local, run_cli, tarball, wmt_cfg, write

from transformer import download
from transformer.core.files import sha256_file
from transformer.core.sections.download import DownloadConfig, SourceSpec
from transformer.data import wmt
from transformer.data.wmt import SourceError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"real data not found at {DATA}")


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_cli_writes_splits_and_manifest(tmp_path):
    syn = {"train": 300, "valid": 40, "test": 40, "seed": 2}
    out, m = run_cli(tmp_path, {"source": "synthetic", "synthetic": syn})
    for split, n in (("train", 300), ("valid", 40), ("test", 40)):
        en, de = lines(out / f"{split}.en"), lines(out / f"{split}.de")
        assert len(en) == len(de) == n == m["splits"][split]["kept"]
        assert m["splits"][split]["files"][f"{split}.de"]["sha256"] == sha256_file(
            out / f"{split}.de"
        )
    assert not set(lines(out / "train.en")) & set(lines(out / "test.en"))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_synthetic_de_en_swaps_sides(tmp_path):
    syn = {"train": 20, "valid": 5, "test": 5}
    out, _ = run_cli(
        tmp_path, {"source": "synthetic", "src_lang": "de", "tgt_lang": "en", "synthetic": syn}
    )
    assert any("Euro" in s or " am " in s or "dass" in s for s in lines(out / "train.de"))


@pytest.mark.parametrize("pair", [("en", "fr"), ("de", "de")])
def test_synthetic_refuses_a_pair_it_cannot_make(tmp_path, pair):
    with pytest.raises(
        SystemExit,
        match=rf"params.yaml: download.src_lang / download.tgt_lang: the synthetic source "
        rf"makes en -> de or de -> en, got {pair[0]} -> {pair[1]}",
    ):
        run_cli(tmp_path, {"source": "synthetic", "src_lang": pair[0], "tgt_lang": pair[1]})


def test_demo_de_en_preset_is_the_demo_reversed(tmp_path):
    """The demo-de-en preset's download stage: German sources, English targets, line-aligned,
    every split (valid and test too) the en-de demo's pairs with the sides swapped."""
    from transformer import config

    raw = {}
    for name in ("demo", "demo-de-en"):
        params = tmp_path / f"{name}.yaml"
        config.main(["preset", name, "--out", str(params)])
        tree = yaml.safe_load(params.read_text())
        tree["download"]["synthetic"].update(train=200, valid=30, test=30)  # the demo's, fewer
        params.write_text(yaml.safe_dump(tree))
        raw[name], manifest = tmp_path / name / "raw", tmp_path / name / "download.json"
        download.main([str(raw[name]), "--manifest", str(manifest), "--params", str(params)])
    deen = json.loads((tmp_path / "demo-de-en" / "download.json").read_text())
    assert (deen["src_lang"], deen["tgt_lang"]) == ("de", "en")
    for split in download.SPLITS:
        de, en = lines(raw["demo-de-en"] / f"{split}.de"), lines(raw["demo-de-en"] / f"{split}.en")
        assert len(de) == len(en) == deen["splits"][split]["kept"] > 0
        assert (de, en) == (lines(raw["demo"] / f"{split}.de"), lines(raw["demo"] / f"{split}.en"))
    assert any(" dass " in s for s in de) and not any(" dass " in s for s in en)


def test_unknown_source_lists_valid(tmp_path):
    with pytest.raises(
        SystemExit,
        match=r"params.yaml: download.source must be one of synthetic, local, wmt, hf, got 'ftp'",
    ):
        run_cli(tmp_path, {"source": "ftp"})


# ----------------------------------------------------------------------------- local files
def test_local_text_cleaning_counts(tmp_path, caplog):
    write(
        tmp_path / "t.en",
        b"Hello  world\nsame\nsame\n\nbad\xff\none two three four\nvalid one\nCafe\xcc\x81\n",
    )
    write(tmp_path / "t.de", b"Hallo Welt\ngleich\ngleich\nleer\nschlecht\neins\ngilt eins\nx\n")
    write(tmp_path / "v.en", "valid one\n")
    write(tmp_path / "v.de", "anders\n")
    cfg = local(
        tmp_path,
        train=[{"path": str(tmp_path / "t.{lang}")}],
        valid=[{"src": str(tmp_path / "v.en"), "tgt": str(tmp_path / "v.de")}],
        test=[{"path": str(tmp_path / "v.{lang}")}],
    )
    with caplog.at_level(logging.WARNING, "transformer.download"):
        out, m = run_cli(tmp_path, cfg)
    d = m["splits"]["train"]["dropped"]
    assert (d["duplicate"], d["empty"], d["invalid_utf8"], d["ratio"], d["eval_overlap"]) == (
        1,
        1,
        1,
        1,
        1,
    )
    assert lines(out / "train.en") == ["Hello world", "same", "Café"]  # NFC, spaces collapsed
    assert m["splits"]["train"]["read"] == 8 and m["splits"]["train"]["kept"] == 3
    assert "t.en: line 5: invalid UTF-8" in caplog.text or "line 5: invalid UTF-8" in caplog.text
    assert list(m["splits"]["train"]["parts"]) == ["t"]


def test_misaligned_files_error_and_nothing_written(tmp_path):
    write(tmp_path / "a.en", "1\n2\n3\n")
    write(tmp_path / "a.de", "1\n2\n")
    cfg = local(tmp_path, **{s: [{"path": str(tmp_path / "a.{lang}")}] for s in download.SPLITS})
    with pytest.raises(SystemExit) as e:
        run_cli(tmp_path, cfg)
    msg = str(e.value)
    assert "a.en has 3 lines" in msg and "a.de has 2" in msg
    assert not (tmp_path / "raw").exists() and not (tmp_path / "download.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".raw")]


def test_unknown_split_and_format_are_listed(tmp_path):
    with pytest.raises(SourceError, match="unknown split download.splits.dev .*train, valid, test"):
        download.download(DownloadConfig(source="local", splits={"dev": []}), tmp_path / "o")
    bad = {s: [SourceSpec(path="x", format="csv")] for s in download.SPLITS}
    with pytest.raises(SourceError, match="unknown 'csv' .*text, sgm, tsv, jsonl, hf"):
        download.download(DownloadConfig(source="local", splits=bad), tmp_path / "o")


def test_tsv_jsonl_gz_formats(tmp_path, caplog):
    write(tmp_path / "t.tsv", "a b\tx y\nno tab here\nc d\te f\ng\th\textra\n\n")
    rows = [
        {"translation": {"en": "one", "de": "eins"}},
        {"translation": {"en": "two", "de": "zwei"}},
    ]
    write(tmp_path / "v.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    with gzip.open(tmp_path / "te.en.gz", "wt") as f:
        f.write("gz line\n")
    with gzip.open(tmp_path / "te.de.gz", "wt") as f:
        f.write("gz Zeile\n")
    cfg = local(
        tmp_path,
        train=[{"path": str(tmp_path / "t.tsv"), "format": "tsv"}],
        valid=[{"path": str(tmp_path / "v.jsonl"), "format": "jsonl"}],
        test=[{"path": str(tmp_path / "te.{lang}.gz")}],
    )
    out, m = run_cli(tmp_path, cfg)
    assert lines(out / "train.de") == ["x y", "e f"]
    assert m["splits"]["train"]["dropped"]["malformed"] == 2  # no tab; a third column
    assert m["splits"]["train"]["dropped"]["empty"] == 1  # a blank line is an empty pair
    for n, cols in ((2, 1), (4, 3)):
        assert f"t.tsv: line {n}: {cols} tab-separated columns, not 2; dropped" in caplog.text
    assert (
        lines(out / "valid.de") == ["eins", "zwei"]
        and m["splits"]["valid"]["dropped"]["malformed"] == 1
    )
    assert lines(out / "test.de") == ["gz Zeile"]


def test_jsonl_values_that_are_not_text_are_counted_not_fatal(tmp_path, caplog):
    rows = [
        '{"translation": {"en": "Hello\\nworld", "de": "Hallo\\nWelt"}}',
        '{"translation": {"en": "bad \\ud83d here", "de": "schlecht"}}',  # lone surrogate
        '{"translation": {"en": 2014, "de": "zweitausendvierzehn"}}',
        '{"translation": {"en": null, "de": "nichts"}}',
    ]
    write(tmp_path / "t.jsonl", "\n".join(rows).encode() + b"\n" + b'{"translation": \xff}\n')
    dev = [{"path": str(tmp_path / "dev.{lang}")}]
    for lang in ("en", "de"):
        write(tmp_path / f"dev.{lang}", f"dev {lang}\n")
    out, m = run_cli(
        tmp_path,
        local(
            tmp_path,
            train=[{"path": str(tmp_path / "t.jsonl"), "format": "jsonl"}],
            valid=dev,
            test=dev,
        ),
    )
    assert lines(out / "train.en") == ["Hello world"] and lines(out / "train.de") == ["Hallo Welt"]
    dropped = m["splits"]["train"]["dropped"]
    assert (dropped["invalid_utf8"], dropped["malformed"]) == (2, 2)
    assert caplog.text.count("line 5: invalid UTF-8") == 1  # logged once, not once a side
    for n in (3, 4):  # a number, a null
        assert f"line {n}: a value that is not text, pair dropped" in caplog.text


def test_an_archive_member_without_lang_is_refused(tmp_path):
    write(tmp_path / "c.tgz", tarball({"c.en": b"hello world\n"}))
    spec = [SourceSpec(path=str(tmp_path / "c.tgz"), src="c.en")]
    cfg = DownloadConfig(
        source="local", splits={s: spec for s in download.SPLITS}, cache_dir=str(tmp_path / "cache")
    )
    with pytest.raises(
        SourceError,
        match=r"c\.tgz: source and target are the same file; put "
        r"\{lang\} in src",
    ):
        download.download(cfg, tmp_path / "o")


def test_jsonl_unknown_pair_lists_languages(tmp_path):
    write(tmp_path / "v.jsonl", json.dumps({"translation": {"en": "a", "fr": "b"}}) + "\n")
    spec = [SourceSpec(path=str(tmp_path / "v.jsonl"), format="jsonl")]
    cfg = DownloadConfig(source="local", splits={s: spec for s in download.SPLITS})
    with pytest.raises(SourceError, match="no 'de' in translation .*en, fr"):
        download.download(cfg, tmp_path / "o")


def test_sgm_parsed_as_sacrebleu(tmp_path):
    write(tmp_path / "n-src.en.sgm", SGM)
    write(
        tmp_path / "n-ref.de.sgm",
        SGM.replace("A  first", "Ein erster").replace("Second", "Zweiter"),
    )
    spec = {
        "src": str(tmp_path / "n-src.en.sgm"),
        "tgt": str(tmp_path / "n-ref.de.sgm"),
        "format": "sgm",
    }
    cfg = {
        **local(tmp_path, train=[spec], valid=[spec], test=[spec]),
        "clean": {"drop_eval_overlap": False},
    }
    out, _ = run_cli(tmp_path, cfg)
    assert lines(out / "test.en") == ["A first sentence.", "Second &amp; last."]  # no unescape
    assert lines(out / "test.de") == ["Ein erster sentence.", "Zweiter &amp; last."]


# ----------------------------------------------------------------------------- http + archives


@pytest.fixture
def server():
    s = Server({"/wmt14/nc.tgz": TGZ, "/wmt14/plain.en": b"hi\n"})
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def test_wmt_tarball_over_http_with_drop_and_500s(tmp_path, server):
    server.faults["/wmt14/nc.tgz"] = ["500", "drop", "500"]
    import hashlib

    out, m = run_cli(tmp_path, wmt_cfg(tmp_path, server.url, hashlib.sha256(TGZ).hexdigest()))
    assert lines(out / "train.en")[:2] == [
        "news sentence number 0 here",
        "news sentence number 1 here",
    ]
    assert m["splits"]["train"]["kept"] == 3000 and m["splits"]["test"]["kept"] == 2
    ranges = [r for p, r in server.ranges if p == "/wmt14/nc.tgz"]
    assert ranges == [None, None, f"bytes={len(TGZ) // 2}-", f"bytes={len(TGZ) // 2}-"]  # resumed
    assert lines(out / "valid.de")[0] == "A erster sentence."


def test_http_failure_keeps_part_then_resumes(tmp_path, server):
    server.faults["/wmt14/nc.tgz"] = ["drop", "500", "500"]
    with pytest.raises(SystemExit, match=r"nc.tgz: download failed after 3 attempts .*\.part"):
        run_cli(tmp_path, wmt_cfg(tmp_path, server.url, retries=2))
    downloads = tmp_path / "cache" / "downloads"
    (part,) = downloads.iterdir()
    assert part.name.endswith(".part") and part.stat().st_size == len(TGZ) // 2
    assert not (tmp_path / "raw").exists()
    out, _ = run_cli(tmp_path, wmt_cfg(tmp_path, server.url))  # no faults left: resumes
    assert server.ranges[-1] == ("/wmt14/nc.tgz", f"bytes={len(TGZ) // 2}-")
    assert len(lines(out / "train.de")) == 3000


def test_checksum_mismatch_removes_download(tmp_path, server):
    with pytest.raises(SystemExit, match="nc.tgz: sha256 mismatch: expected 00+, got"):
        run_cli(tmp_path, wmt_cfg(tmp_path, server.url, sha="0" * 64))
    assert list((tmp_path / "cache" / "downloads").iterdir()) == []
    assert not (tmp_path / "raw").exists()


def test_a_cached_download_is_checked_against_its_sha256(tmp_path, server):
    import hashlib

    run_cli(tmp_path, wmt_cfg(tmp_path, server.url))  # cached, no sha256 given
    (cached,) = (tmp_path / "cache" / "downloads").glob("*.tgz")  # beside it, its validators
    cached.write_bytes(TGZ[:100])  # damaged in the cache since
    _, m = run_cli(tmp_path, wmt_cfg(tmp_path, server.url, hashlib.sha256(TGZ).hexdigest()))
    assert cached.read_bytes() == TGZ and m["splits"]["train"]["kept"] == 3000  # fetched again
    with pytest.raises(SystemExit, match="nc.tgz: sha256 mismatch: expected 00+, got"):
        run_cli(tmp_path, wmt_cfg(tmp_path, server.url, sha="0" * 64))


def test_a_replaced_archive_of_the_same_name_is_extracted_afresh(tmp_path):
    for lang in ("en", "de"):
        write(tmp_path / f"dev.{lang}", f"dev {lang}\n")
    dev = [{"path": str(tmp_path / "dev.{lang}")}]
    cfg = local(
        tmp_path, train=[{"path": str(tmp_path / "c.tgz"), "src": "c.{lang}"}], valid=dev, test=dev
    )
    for word in ("alpha", "beta"):
        write(
            tmp_path / "c.tgz",
            tarball(
                {
                    f"c.{lang}": "".join(f"{word} {lang} {i}\n" for i in range(5)).encode()
                    for lang in ("en", "de")
                }
            ),
        )
        out, _ = run_cli(tmp_path, cfg)
        assert lines(out / "train.en")[0] == f"{word} en 0"


class Moving(BaseHTTPRequestHandler):
    """One file whose content changes, with an ETag and If-None-Match (304), as a web server."""

    body, requests, down = b"", [], False

    def log_message(self, *args):
        pass

    def do_GET(self):
        if Moving.down:
            return self.send_error(503)
        etag = f'"{hashlib.sha256(Moving.body).hexdigest()[:16]}"'
        Moving.requests.append(self.headers.get("If-None-Match"))
        if self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(Moving.body)))
        self.end_headers()
        self.wfile.write(Moving.body)


def test_a_cached_download_is_fetched_again_when_the_source_changed(tmp_path, caplog):
    """Without a pinned sha256, a cached copy is revalidated (If-None-Match): kept while the
    server says 304, downloaded again once it changed, kept with a warning if the server is
    down; an archive's older extraction folders go."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Moving)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/c.tgz"
    make = lambda word: tarball(
        {
            f"c.{lang}": "".join(f"{word} {lang} {i}\n" for i in range(5)).encode()
            for lang in ("en", "de")
        }
    )
    try:
        Moving.body, Moving.requests = make("alpha"), []
        first = wmt.fetch(url, tmp_path / "dl", retries=1, backoff=0.01, timeout=5)
        again = wmt.fetch(url, tmp_path / "dl", retries=1, backoff=0.01, timeout=5)
        assert again == first and Moving.requests[0] is None and Moving.requests[1]  # 304
        old = wmt.extraction_dir(first, tmp_path / "x")
        wmt.extract(first, ["c.en"], old)
        Moving.body = make("beta")
        new = wmt.fetch(url, tmp_path / "dl", retries=1, backoff=0.01, timeout=5)
        assert new.read_bytes() == Moving.body and "changed upstream" in caplog.text
        (en,) = wmt.extract(new, ["c.en"], wmt.extraction_dir(new, tmp_path / "x"))
        assert en.read_text().startswith("beta en 0") and not old.exists()
        Moving.down = True
        assert wmt.fetch(url, tmp_path / "dl", retries=1, backoff=0.01, timeout=5) == new
        assert "could not check whether" in caplog.text and new.read_bytes() == Moving.body
    finally:
        Moving.down = False
        httpd.shutdown()
        httpd.server_close()


def test_http_404_is_not_retried(tmp_path, server):
    with pytest.raises(SourceError, match="missing.tgz: HTTP 404"):
        wmt.fetch(f"{server.url}/missing.tgz", tmp_path, retries=3, backoff=5.0)
    assert len(server.ranges) == 1


def test_truncated_archive_and_missing_member(tmp_path):
    bad = write(tmp_path / "bad.tgz", TGZ[: len(TGZ) // 2])
    with pytest.raises(SourceError, match="bad.tgz: truncated or corrupt archive"):
        wmt.extract(bad, ["training/nc-v9.de-en.zz"], tmp_path / "x")
    good = write(tmp_path / "good.tgz", TGZ)
    with pytest.raises(SourceError, match="no member nope .*training/nc-v9.de-en.en"):
        wmt.extract(good, ["nope"], tmp_path / "y")


def test_unsafe_members_refused(tmp_path):
    with pytest.raises(SourceError, match="unsafe member path"):
        wmt.extract(write(tmp_path / "a.tgz", TGZ), ["../escape"], tmp_path / "x")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        link = tarfile.TarInfo("evil.en")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(SourceError, match="evil.en is a link"):
        wmt.extract(write(tmp_path / "l.tgz", buf.getvalue()), ["evil.en"], tmp_path / "y")
    assert not (tmp_path / "y" / "evil.en").exists()


# ----------------------------------------------------------------------------- hugging face


def test_hf_local_replica(tmp_path):
    repo = hub_replica(tmp_path / "hub")
    out, m = run_cli(
        tmp_path,
        {
            "source": "hf",
            "hf_path": str(repo),
            "hf_name": "de-en",
            "hf_cache_dir": str(tmp_path / "hfcache"),
        },
    )
    assert lines(out / "test.en")[0] == "test sentence 0" and len(lines(out / "test.de")) == 6
    assert m["splits"]["train"]["kept"] == 50 and "hf:" in next(iter(m["splits"]["valid"]["parts"]))


def test_hf_unknown_config_is_reported(tmp_path):
    repo = hub_replica(tmp_path / "hub")
    cfg = DownloadConfig(
        source="hf", hf_path=str(repo), hf_name="xx-yy", hf_cache_dir=str(tmp_path / "c")
    )
    with pytest.raises(SourceError, match="xx-yy.*de-en"):
        download.download(cfg, tmp_path / "o")


def test_hf_offline_not_cached_fails_fast(tmp_path):
    params = write(
        tmp_path / "p.yaml",
        yaml.safe_dump({"download": {"source": "hf", "hf_cache_dir": str(tmp_path / "empty")}}),
    )
    env = {
        **os.environ,
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "home"),
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "transformer.download",
            str(tmp_path / "o"),
            "--params",
            str(params),
        ],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1
    assert "error: hf dataset wmt/wmt14" in r.stderr and "HF_DATASETS_OFFLINE" in r.stderr


# ----------------------------------------------------------------------------- real data
@needs_data
def test_multi30k_preset_real_text(tmp_path):
    preset = yaml.safe_load((ROOT / "presets" / "multi30k-en-de.yaml").read_text())["download"]
    for specs in preset["splits"].values():  # the preset's paths are relative to the repo root
        for s in specs:
            s["path"] = str(ROOT / s["path"])
    out, m = run_cli(tmp_path, {**preset, "cache_dir": str(tmp_path / "c")})
    assert m["splits"]["test"]["kept"] == 1000 and m["splits"]["valid"]["kept"] == 1014
    assert 28000 < m["splits"]["train"]["kept"] <= 29000
    assert lines(out / "test.en")[0] == lines(DATA / "multi30k" / "test_2016_flickr.en")[0].strip()


@needs_data
def test_multi30k_en_fr_preset_reads_the_french_files(tmp_path):
    from transformer.core import presets

    preset = presets.preset_params("multi30k-en-fr")["download"]  # validated as a whole
    for specs in preset["splits"].values():  # the preset's paths are relative to the repo root
        for s in specs:
            s["path"] = str(ROOT / s["path"])
    out, m = run_cli(tmp_path, {**preset, "cache_dir": str(tmp_path / "c")})
    assert (m["src_lang"], m["tgt_lang"]) == ("en", "fr")
    assert m["splits"]["test"]["kept"] == 1000 and m["splits"]["valid"]["kept"] == 1014
    assert 28000 < m["splits"]["train"]["kept"] <= 29000
    for split, name in (("test", "test_2016_flickr"), ("valid", "val")):
        released = [s.rstrip() for s in lines(DATA / "multi30k" / f"{name}.fr")]  # as sacreBLEU
        assert lines(out / f"{split}.fr") == released
        assert len(lines(out / f"{split}.en")) == len(lines(out / f"{split}.fr"))
    assert not (out / "train.de").exists()


@needs_data
def test_noisy_wmt_sample_and_newstest(tmp_path):
    ws, nt = DATA / "wmt-sample", DATA / "newstest2013"
    cfg = local(
        tmp_path,
        train=[{"path": str(ws / "train.tok.{lang}")}],
        valid=[{"path": str(nt / "newstest2013.{lang}")}],
        test=[{"path": str(nt / "newstest2013.{lang}")}],
    )
    out, m = run_cli(tmp_path, cfg)
    t = m["splits"]["train"]
    assert t["read"] == 10000 and t["kept"] == len(lines(out / "train.en")) < 10000
    assert t["dropped"]["ratio"] > 0 and t["read"] == t["kept"] + sum(t["dropped"].values())
    assert m["splits"]["test"]["kept"] == 3000  # test sets are kept whole
    assert all(s.strip() == s and "  " not in s for s in lines(out / "train.en"))


def test_atomic_dir_leaves_one_folder_even_after_a_kill_between_renames(tmp_path):
    from transformer.core.files import atomic_dir

    stale = tmp_path / ".raw.old"  # what a kill between the two renames leaves, raw missing
    stale.mkdir()
    (stale / "train.en").write_text("old\n")
    for text in ("new\n", "newer\n"):  # raw missing, then raw present
        with atomic_dir(tmp_path / "raw") as d:
            (d / "train.en").write_text(text)
        assert [p.name for p in tmp_path.iterdir()] == ["raw"]
        assert (tmp_path / "raw" / "train.en").read_text() == text
