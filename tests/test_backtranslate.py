"""The backtranslate stage: beam and sampling through the project's decoder, finished chunks
resumed (after a real SIGKILL under `dvc repro`), a second `dvc repro` translating nothing,
no pairs without a model or text, the direction checked; the tag reaching the source side."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml
from helpers.backtranslate import backward_package, bt_params, german
from prefect_fixtures import DVC, sh

from transformer import backtranslate, decode, download, shard, tokenizer
from transformer.core.files import sha256_file
from transformer.core.sections.backtranslate import BacktranslateConfig
from transformer.data.batches import load_split
from transformer.data.vocab import load_tokenizer, tokenizer_sha256

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    """(the mono folder: 10 German lines, a de -> en package folder)."""
    d = tmp_path_factory.mktemp("bt")
    (d / "mono").mkdir()
    (d / "mono" / "mono.de").write_text("".join(line + "\n" for line in german(10)))
    return d / "mono", backward_package(d / "backward")


def run(inputs, out: Path, **settings) -> tuple[dict, list[str], list[str]]:
    """The stage's CLI into `out`: (metrics, synthetic English, their German lines)."""
    mono, backward = inputs
    params = bt_params(out.parent / f"{out.name}.yaml", **settings)
    metrics = out.parent / f"{out.name}.json"
    backtranslate.main(
        [str(mono), str(backward), str(out), "--chunks", str(out.parent / f"{out.name}.chunks")]
        + ["--metrics", str(metrics), "--params", str(params)]
    )
    lines = [(out / f"synthetic.{lang}").read_text().splitlines() for lang in ("en", "de")]
    return json.loads(metrics.read_text()), *lines


def test_beam_search_is_the_translate_command(inputs, tmp_path):
    m, en, de = run(inputs, tmp_path / "beam", beam_size=2)
    assert m["lines"] == 10 and m["chunks"] == 3 and m["chunks_translated"] == 3
    assert m["pairs"] == len(en) == len(de) == 10 - m["empty_dropped"] and m["pairs"] >= 5
    assert m["backward"]["direction"] == "de-en" and m["pairs_per_second"] > 0
    assert not (tmp_path / "beam.chunks").exists()  # the chunks go once the output is whole
    # the translate CLI on the same lines with the same settings gives the same translations
    mono, backward = inputs
    (tmp_path / "decode.yaml").write_text(
        yaml.safe_dump({"decode": {"beam_size": 2, "max_len_a": 0.0, "max_len_b": 8}})
    )
    out = tmp_path / "translated.en"
    decode.main(
        ["--model", str(backward), "-i", str(mono / "mono.de"), "-o", str(out)]
        + ["--params", str(tmp_path / "decode.yaml"), "--no-progress", "--device", "cpu"]
    )
    cli = [" ".join(t.split()) for t in out.read_text(encoding="utf-8").split("\n")[:-1]]
    assert [t for t in cli if t] == en
    assert de == [g for g, t in zip(german(10), cli) if t]


def test_sampling_is_seeded_per_chunk_and_differs_from_beam(inputs, tmp_path):
    beam = run(inputs, tmp_path / "beam", beam_size=1)
    sampled = run(inputs, tmp_path / "s1", search="sample")
    assert sampled[0]["search"] == "sample"
    assert run(inputs, tmp_path / "s1-again", search="sample")[1:] == sampled[1:]
    assert run(inputs, tmp_path / "s2", search="sample", seed=2)[1:] != sampled[1:]
    assert sampled[1:] != beam[1:]
    # the most likely token at every step: greedy, which is beam search of one
    assert run(inputs, tmp_path / "top1", search="sample", topk=1)[1:] == beam[1:]


def test_finished_chunks_are_resumed_and_other_inputs_chunks_removed(inputs, tmp_path):
    """What a killed run left: chunk 1 of 3 whole (a marker text, to see it is not redone), a
    half-written temporary file, and a folder of other inputs' chunks."""
    mono, backward = inputs
    cfg = BacktranslateConfig(
        **yaml.safe_load(bt_params(tmp_path / "p.yaml").read_text())["backtranslate"]
    )
    model_sha = sha256_file(backward / "model.pt")
    key = backtranslate.fingerprint(mono / "mono.de", backward, cfg, ("en", "de"), model_sha)
    chunks = tmp_path / "out.chunks"
    (chunks / key).mkdir(parents=True)
    (chunks / key / "000000.en").write_text("".join(f"resumed {i}\n" for i in range(4)))
    (chunks / key / ".000001.en.x.tmp").write_text("half")
    (chunks / "0123456789abcdef").mkdir()
    m, en, _ = run(inputs, tmp_path / "out")
    assert (m["chunks_resumed"], m["chunks_translated"]) == (1, 2)
    assert en[:4] == [f"resumed {i}" for i in range(4)] and "resumed 0" not in en[4:]
    assert not chunks.exists()


def test_no_model_or_no_text_gives_no_pairs_and_says_why(inputs, tmp_path):
    mono, _ = inputs
    none = tmp_path / "helpers" / "backward"
    none.mkdir(parents=True)
    (none / "NONE").write_text("helpers.backward is de-en: that line has no champion yet\n")
    params = bt_params(tmp_path / "p.yaml")
    args = ["--chunks", str(tmp_path / "c"), "--params", str(params)]
    backtranslate.main(
        [str(mono), str(none), str(tmp_path / "out"), *args, "--metrics", str(tmp_path / "m.json")]
    )
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["pairs"] == 0 and m["backward"] is None and "no champion yet" in m["skipped"]
    assert (tmp_path / "out" / "synthetic.en").read_text() == ""
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "mono.de").write_text("")
    _, backward = inputs
    backtranslate.main(
        [
            str(tmp_path / "empty"),
            str(backward),
            str(tmp_path / "o2"),
            *args,
            "--metrics",
            str(tmp_path / "m2.json"),
        ]
    )
    assert "no monolingual text" in json.loads((tmp_path / "m2.json").read_text())["skipped"]


def test_a_model_of_the_wrong_direction_is_named(inputs, tmp_path):
    mono, _ = inputs
    forward = backward_package(tmp_path / "forward", "en", "de")
    params = bt_params(tmp_path / "p.yaml")
    with pytest.raises(SystemExit, match=r"forward/tokenizer/meta.json: a en->de model; .* de->en"):
        backtranslate.main(
            [
                str(mono),
                str(forward),
                str(tmp_path / "o"),
                "--chunks",
                str(tmp_path / "c"),
                "--params",
                str(params),
            ]
        )
    with pytest.raises(SystemExit, match=r"nowhere: no such folder"):
        backtranslate.main(
            [
                str(mono),
                str(tmp_path / "nowhere"),
                str(tmp_path / "o"),
                "--chunks",
                str(tmp_path / "c"),
                "--params",
                str(params),
            ]
        )
    (tmp_path / "bad.yaml").write_text("backtranslate: {serach: sample}\n")
    with pytest.raises(SystemExit, match=r"unknown key backtranslate.serach"):
        backtranslate.main(
            [
                str(mono),
                str(forward),
                str(tmp_path / "o"),
                "--chunks",
                str(tmp_path / "c"),
                "--params",
                str(tmp_path / "bad.yaml"),
            ]
        )


def test_the_tag_leads_each_synthetic_source_in_train_at_the_ratio(inputs, tmp_path):
    """download -> backtranslate -> tokenizer -> shard: the first ratio x (train pairs) synthetic
    pairs join train, each source led by the tag's id (a special token of the tokenizer's)."""
    _, en, de = run(inputs, tmp_path / "bt", search="sample")
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "download": {"synthetic": {"train": 12, "valid": 4, "test": 4}},
                "tokenizer": {"vocab_size": 300, "min_frequency": 1},
                "backtranslate": {"tag": "<BT>", "ratio": 0.5},
            }
        )
    )
    p, raw, tok_dir = ["--params", str(params)], tmp_path / "raw", tmp_path / "tok"
    download.main([str(raw), *p])
    tokenizer.main([str(raw), str(tok_dir), *p])
    shard.main(
        [str(raw), str(tok_dir), str(tmp_path / "shards"), "--synthetic", str(tmp_path / "bt")]
        + ["--metrics", str(tmp_path / "shard.json"), *p]
    )
    real = len((raw / "train.en").read_text().splitlines())
    n = min(len(en), int(0.5 * real))
    synthetic = json.loads((tmp_path / "shard.json").read_text())["synthetic"]
    assert synthetic == {"available": len(en), "pairs": n, "ratio": 0.5, "tag": "<BT>"} and n >= 4
    tok = load_tokenizer(tok_dir)
    tag = tok.special_id("<BT>")
    assert tag is not None and tok.encode(["<BT>"])[0] != [tag]  # typed text is never the tag
    ds = load_split(tmp_path / "shards", "train", tokenizer_sha256(tok_dir))
    pairs = [ds[i] for i in range(len(ds))]
    assert len(pairs) == real + n
    tagged = [(s, t) for s, t in pairs if s[0] == tag]
    assert all(tag not in s[1:] and tag not in t for s, t in pairs)
    assert sorted(tok.decode([s[1:-1].tolist() for s, _ in tagged])) == sorted(en[:n])
    assert sorted(tok.decode([t[:-1].tolist() for _, t in tagged])) == sorted(de[:n])


@pytest.mark.slow  # four `dvc repro`s, one SIGKILLed mid-way
def test_a_killed_translation_resumes_and_dvc_caches_the_result(inputs, tmp_path):
    """The dvc.yaml stage in a project of its own: its process SIGKILLed after its first whole
    chunk; the next `dvc repro` translates only the chunks not finished and gives what an
    uninterrupted run gives; after that, nothing is translated again (an unchanged stage; its
    output deleted: restored from DVC's cache); ratio and tag are no deps of it."""
    project, lines = tmp_path / "project", german(80)
    shutil.copytree(ROOT / "transformer", project / "transformer")
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["backtranslate"]
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"backtranslate": stage}}))
    (project / "data" / "mono").mkdir(parents=True)
    (project / "data" / "mono" / "mono.de").write_text("".join(x + "\n" for x in lines))
    shutil.copytree(inputs[1], project / "data" / "helpers" / "backward")
    params = yaml.safe_load(
        bt_params(project / "params.yaml", search="sample", max_len_b=24).read_text()
    )
    (project / ".gitignore").write_text("/data/\n__pycache__/\n")
    sh("git", "init", "-q", cwd=project)
    sh(*DVC, "init", "-q", cwd=project)
    chunks = project / "data" / "backtranslate.chunks"

    killed = kill_after_first_chunk(project, chunks)
    done = sorted(chunks.glob("*/0*.en"))
    assert killed and 1 <= len(done) < 20, len(done)
    out = sh(*DVC, "repro", cwd=project)
    metrics = project / "data" / "metrics" / "backtranslate.json"
    m = json.loads(metrics.read_text())
    resumed = (m["chunks"], m["chunks_resumed"], m["chunks_translated"])
    assert resumed == (20, len(done), 20 - len(done))
    assert f"chunk {len(done)}/20:" not in out and f"chunk {len(done) + 1}/20:" in out
    whole = tmp_path / "whole"
    backtranslate.main(
        [
            str(project / "data" / "mono"),
            str(inputs[1]),
            str(whole),
            "--chunks",
            str(tmp_path / "c"),
        ]
        + ["--params", str(project / "params.yaml")]
    )
    for lang in ("en", "de"):
        name = f"synthetic.{lang}"
        assert (project / "data" / "backtranslate" / name).read_text() == (whole / name).read_text()

    stamp = metrics.stat().st_mtime_ns
    out = sh(*DVC, "repro", cwd=project)
    assert "didn't change" in out and "chunk" not in out and metrics.stat().st_mtime_ns == stamp
    shutil.rmtree(project / "data" / "backtranslate")
    out = sh(*DVC, "repro", cwd=project)
    assert "chunk" not in out and (project / "data" / "backtranslate" / "synthetic.en").exists()
    params["backtranslate"].update(ratio=0.25, tag="<BT>")
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    assert json.loads(sh(*DVC, "status", "--json", cwd=project)) == {}


def kill_after_first_chunk(project: Path, chunks: Path) -> bool:
    """`dvc repro` in `project`, its stage's python process SIGKILLed (as the OOM killer would)
    once the first chunk is written; whether it was killed before it finished."""
    proc = subprocess.Popen(
        [*DVC, "repro"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    killed = False
    while proc.poll() is None and not killed:
        if any(chunks.glob("*/0*.en")):
            for child in psutil.Process(proc.pid).children(recursive=True):
                cmd = child.cmdline()
                if "transformer.backtranslate" in cmd and "python" in os.path.basename(cmd[0]):
                    child.send_signal(signal.SIGKILL)
                    killed = True
        time.sleep(0.005)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0 or not killed, out
    return killed and proc.returncode != 0
