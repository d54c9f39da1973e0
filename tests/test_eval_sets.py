"""valid / test reach the scorer as released: sacreBLEU's own reading of the same file, every
pair kept, a bad file an error naming file and line; the hf switch; the statmt.org mirror."""

import hashlib
import json
import logging

import pytest
from helpers.download import TGZ, Server, hub_replica, local, run_cli, wmt_cfg, write
from sacrebleu.dataset import DATASETS

from transformer.core import presets
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.shard import ShardConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.core.settings import ConfigError
from transformer.data import wmt
from transformer.model.scoring import read_split
from transformer.shard import shard
from transformer.tokenizer import build

# Segments that any clean-up would change: C1 controls (U+0096 is in the official en-fr
# newstest2014 reference), NEL, LINE SEPARATOR, \x1c, no-break space, tabs, \r, outer spaces,
# text after </seg>, an entity, an empty segment.
SEGS = [
    "Sie sagte \u0096 nein \u0096 dreimal.",
    "  leading and trailing  ",
    "a\u0085b\u2028c\x1cd",
    "no\u00a0break\tand\ttabs\r",
    'odd <b>markup</b> &amp; "quotes"</seg> after the end',
    "",
    "Caf\u0065\u0301 stays decomposed",
]


def sgm(segs: list[str], lang: str) -> bytes:
    body = "".join(f'<seg id="{i}">{s}</seg>\n' for i, s in enumerate(segs, 1))
    return (
        f'<refset setid="newstest2014" srclang="any" trglang="{lang}">\n'
        f'<doc sysid="ref" docid="d1" genre="news" origlang="en">\n<p>\n{body}</p>\n'
        "</doc>\n</refset>\n"
    ).encode()


def sgm_part(tmp_path, name: str = "nt") -> dict:
    return {
        "src": str(tmp_path / f"{name}-src.en.sgm"),
        "tgt": str(tmp_path / f"{name}-ref.de.sgm"),
        "format": "sgm",
    }


def sacrebleu_reads(path) -> bytes:
    """What sacreBLEU extracts from an SGM file: its wmt14/full dataset's own conversion."""
    out = path.with_name(path.name + ".sacrebleu")
    DATASETS["wmt14/full"]._convert_format(str(path), str(out))
    return out.read_bytes()


def eval_cfg(tmp_path, segs_en, segs_de, **clean) -> dict:
    write(tmp_path / "nt-src.en.sgm", sgm(segs_en, "en"))
    write(tmp_path / "nt-ref.de.sgm", sgm(segs_de, "de"))
    write(tmp_path / "t.en", "".join(f"train sentence {i}\n" for i in range(30)))
    write(tmp_path / "t.de", "".join(f"Trainingssatz {i}\n" for i in range(30)))
    return {
        **local(
            tmp_path,
            train=[{"path": str(tmp_path / "t.{lang}")}],
            valid=[sgm_part(tmp_path)],
            test=[sgm_part(tmp_path)],
        ),
        "clean": clean,
    }


def test_sgm_eval_sets_are_byte_identical_to_sacrebleu_and_stay_so_to_the_scorer(tmp_path):
    segs_de = [s.replace("Sie", "Er") for s in SEGS]
    out, m = run_cli(tmp_path, eval_cfg(tmp_path, SEGS, segs_de))
    for split in ("valid", "test"):
        for lang, name in (("en", "nt-src.en.sgm"), ("de", "nt-ref.de.sgm")):
            expected = sacrebleu_reads(tmp_path / name)
            assert (out / f"{split}.{lang}").read_bytes() == expected
            # the evaluate stage's reader splits at "\n" only (not at U+2028, U+0085, \x1c)
            assert read_split(out, split, lang) == expected.decode().split("\n")[:-1]
    assert "\u0096" in (out / "test.en").read_text()  # kept, as in the official reference
    assert m["splits"]["test"]["kept"] == len(SEGS) and m["eval_cleanup"] == "none"
    # the shard stage reads them line for line too: every segment is one pair
    build(out, tmp_path / "tok", TokenizerConfig(vocab_size=300), ("en", "de"))
    metrics = shard(out, tmp_path / "tok", tmp_path / "shards", ShardConfig(), ("en", "de"))
    assert metrics["test"]["pairs"] == metrics["valid"]["pairs"] == len(SEGS)


def test_eval_cleanup_is_opt_in_and_labelled(tmp_path):
    cfg = eval_cfg(tmp_path, SEGS, SEGS, normalize_eval=True)
    out, m = run_cli(tmp_path, cfg)
    test = (out / "test.en").read_text().split("\n")
    assert test[0] == "Sie sagte nein dreimal." and test[2] == "a b c d"  # controls dropped
    assert m["eval_cleanup"].startswith("normalized (line breaks, remove_control, nfc")
    cfg["clean"] = {"filter_eval": True}
    _, m = run_cli(tmp_path, cfg)
    assert m["splits"]["test"]["dropped"]["empty"] == 1
    assert m["eval_cleanup"] == "filtered (empty, length, ratio, duplicates)"


def test_train_pairs_overlapping_an_eval_set_are_found_whatever_its_spacing(tmp_path):
    cfg = eval_cfg(tmp_path, ["  Ein  Satz\u0096 hier "], ["  A  sentence here "])
    write(tmp_path / "t.en", "Ein Satz hier\nother words\nkeep this\n")
    write(tmp_path / "t.de", "something else here\nA sentence here\nbehalte das\n")
    out, m = run_cli(tmp_path, cfg)
    assert m["splits"]["train"]["dropped"]["eval_overlap"] == 2
    assert (out / "train.en").read_text() == "keep this\n"
    assert (out / "test.en").read_text() == "Ein Satz\u0096 hier\n"


@pytest.mark.parametrize("split", ["valid", "test"])
def test_invalid_utf8_in_an_eval_sgm_stops_the_stage_naming_file_and_line(tmp_path, split):
    cfg = eval_cfg(tmp_path, ["one", "two", "three"], ["eins", "zwei", "drei"])
    bad = (tmp_path / "nt-ref.de.sgm").read_bytes().replace(b"zwei", b"zw\xffi")
    write(tmp_path / "bad-ref.de.sgm", bad)
    write(tmp_path / "bad-src.en.sgm", (tmp_path / "nt-src.en.sgm").read_bytes())
    cfg["splits"][split] = [sgm_part(tmp_path, "bad")]
    with pytest.raises(
        SystemExit,
        match=r"bad-ref\.de\.sgm: line 5: invalid UTF-8 .*never "
        r"shortened",
    ):
        run_cli(tmp_path, cfg)
    assert not (tmp_path / "raw").exists() and not (tmp_path / "download.json").exists()


def test_invalid_utf8_in_a_train_sgm_is_dropped_and_the_warning_names_the_file_line(
    tmp_path, caplog
):
    cfg = eval_cfg(tmp_path, ["one", "two", "three"], ["eins", "zwei", "drei"])
    write(tmp_path / "tr-src.en.sgm", sgm(["a b", "c d", "e f"], "en"))
    write(
        tmp_path / "tr-ref.de.sgm",
        sgm(["A B", "C D", "E \xff F"], "de").replace(b"\xc3\xbf", b"\xff"),
    )  # "\xff" as one byte: not UTF-8
    cfg["splits"]["train"] = [sgm_part(tmp_path, "tr")]
    with caplog.at_level(logging.WARNING, "transformer.download"):
        out, m = run_cli(tmp_path, cfg)
    assert m["splits"]["train"]["dropped"]["invalid_utf8"] == 1
    assert (out / "train.de").read_text() == "A B\nC D\n"
    assert "tr-ref.de.sgm: line 6: invalid UTF-8" in caplog.text  # the file's line, not seg 3


def test_a_seg_without_its_closing_tag_is_an_error_naming_file_and_line(tmp_path):
    cfg = eval_cfg(tmp_path, ["one", "two"], ["eins", "zwei"])
    text = (tmp_path / "nt-src.en.sgm").read_bytes().replace(b"two</seg>", b"two")
    write(tmp_path / "nt-src.en.sgm", text)
    with pytest.raises(SystemExit, match=r"nt-src\.en\.sgm: line 5: <seg> without </seg>"):
        run_cli(tmp_path, cfg)


def test_plain_text_eval_sets_are_read_as_sacrebleu_reads_plain_text(tmp_path):
    write(tmp_path / "v.en", b"  one \xc2\x96 x \t\r\nab\xe2\x80\xa8cd\n")
    write(tmp_path / "v.de", b"eins\r\nzwei\n")
    cfg = eval_cfg(tmp_path, ["x"], ["y"])
    cfg["splits"]["test"] = [{"path": str(tmp_path / "v.{lang}")}]
    out, _ = run_cli(tmp_path, cfg)
    # PlainTextDataset: print(line.rstrip()): the end's whitespace goes, the rest stays
    assert (out / "test.en").read_bytes() == b"  one \xc2\x96 x\nab\xe2\x80\xa8cd\n"
    assert (out / "test.de").read_bytes() == b"eins\nzwei\n"


def test_an_eval_value_with_a_line_break_is_an_error_unless_normalized(tmp_path):
    rows = [{"translation": {"en": "one\ntwo", "de": "eins zwei"}}]
    write(tmp_path / "v.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    cfg = eval_cfg(tmp_path, ["x"], ["y"])
    cfg["splits"]["test"] = [{"path": str(tmp_path / "v.jsonl"), "format": "jsonl"}]
    with pytest.raises(SystemExit, match=r"v.jsonl: line 1: a test sentence holds a line break"):
        run_cli(tmp_path, cfg)
    cfg["clean"] = {"normalize_eval": True}
    out, _ = run_cli(tmp_path, cfg)
    assert (out / "test.en").read_text() == "one two\n"


# ----------------------------------------------------------------------------- hf switch
@pytest.mark.parametrize("preset", ["wmt14-en-de-base", "wmt14-en-de-big"])
def test_source_hf_alone_switches_a_wmt14_preset_to_the_hub_copy(tmp_path, caplog, preset):
    section = presets.preset_params(preset)["download"]
    section |= {
        "source": "hf",
        "hf_path": str(hub_replica(tmp_path / "hub")),
        "hf_cache_dir": str(tmp_path / "hfcache"),
    }
    with caplog.at_level(logging.INFO, "transformer.download"):
        out, m = run_cli(tmp_path, section)  # no network here: statmt.org would fail
    assert m["splits"]["test"]["kept"] == 6 and m["splits"]["train"]["kept"] == 50
    assert (out / "valid.de").read_text().startswith("validation Satz 0\n")
    assert (
        "download.source is hf: the 3 non-hf part(s) in download.splits.train do not apply"
        in caplog.text
    )


# ----------------------------------------------------------------------------- mirror
def test_mirrored_keeps_the_path():
    url = "https://www.statmt.org/wmt14/test-full.tgz"
    assert wmt.mirrored(url, "http://127.0.0.1:8000") == "http://127.0.0.1:8000/wmt14/test-full.tgz"
    assert wmt.mirrored(url, "http://h:1/statmt/") == "http://h:1/statmt/wmt14/test-full.tgz"
    for bad in ("127.0.0.1:8000", "ftp://h/x", "http://"):
        with pytest.raises(ConfigError, match="download.mirror must be an http"):
            DownloadConfig(mirror=bad)


def test_one_mirror_override_points_every_url_at_the_mirror(tmp_path):
    server = Server({"/wmt14/nc.tgz": TGZ})
    try:
        cfg = wmt_cfg(tmp_path, "https://www.statmt.org", hashlib.sha256(TGZ).hexdigest())
        _, m = run_cli(tmp_path, {**cfg, "mirror": server.url})
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
    assert m["splits"]["train"]["kept"] == 3000 and m["splits"]["test"]["kept"] == 2
    assert {p for p, _ in server.ranges} == {"/wmt14/nc.tgz"}
