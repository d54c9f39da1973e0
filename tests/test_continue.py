"""retrain.mode continue at the stage level: the parent stage, the kept tokenizer, training from
the parent's weights, the shard stage's OOV rate, and when the flow falls back to scratch."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import forked

from flows.retrain import unfit
from transformer.core import presets
from transformer.data.vocab import load_tokenizer
from transformer.parent import NONE, check, scratch
from transformer.training.continuation import ParentError


def cli(module: str, *args: str | Path) -> str:
    """The stage's CLI in a process of its own (helpers/forked.py): its output."""
    code, out, err = forked.run(f"transformer.{module}", *args)
    assert code == 0, f"transformer.{module} exited {code}:\n{out}{err}"
    return out + err


def params(path: Path, **sections: dict) -> Path:
    p = presets.preset_params("demo")
    p["download"]["synthetic"].update(train=300, valid=20, test=20)
    p["tokenizer"]["vocab_size"] = 300
    p["model"].update(d_model=32, d_ff=64, n_layers=1)
    p["train"].update(max_steps=4, save_every_steps=2, valid_every_steps=2, threads=1)
    p["average"]["last_k"] = 2
    p["decode"]["beam_size"] = 1
    for name, values in sections.items():
        p[name] = presets.merge(p[name], values)
    path.write_text(yaml.safe_dump(p))
    return path


def run_to_package(d: Path, raw: Path, pfile: Path, parent: Path) -> Path:
    """parent, tokenizer, shard, train, average, evaluate, package as dvc.yaml chains them."""
    p = ("--params", pfile)
    cli("parent", parent, "--metrics", d / "parent.json", *p)
    cli("tokenizer", raw, d / "tok", "--parent", parent, *p)
    cli("shard", raw, d / "tok", d / "shards", "--metrics", d / "shard.json", *p)
    cli("train", d / "shards", d / "tok", d / "ckpt", "--parent", parent, "--no-progress", *p)
    cli("average", d / "ckpt", d / "model.pt", *p)
    cli("evaluate", d / "model.pt", d / "tok", raw, d / "eval", "--metrics", d / "ev.json", *p)
    pkg = d / "package"
    cli("package", d / "model.pt", d / "tok", d / "ev.json", pkg, "--parent", d / "parent.json", *p)
    return pkg


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


@pytest.fixture(scope="module")
def champion(tmp_path_factory) -> tuple[Path, Path]:
    """(raw data, the package of a model trained from scratch on it)."""
    d = tmp_path_factory.mktemp("champion")
    pfile = params(d / "params.yaml")
    cli("download", d / "raw", "--params", pfile)
    return d / "raw", run_to_package(d, d / "raw", pfile, d / "parent")


@pytest.mark.slow
def test_continued_run_starts_from_the_parents_weights_and_tokenizer(champion, tmp_path):
    raw, pkg = champion
    parent = tmp_path / "parent"
    subprocess.run(["cp", "-r", str(pkg), str(parent)], check=True)  # as dvc artifacts get does
    before = hashlib.sha256((parent / "model.pt").read_bytes()).hexdigest()
    # a rate so small that the continued weights must stay the parent's; any other start differs
    cont = {"mode": "continue", "parent": "v1.0.0", "continuation": {"max_steps": 4}}
    tiny = params(
        tmp_path / "p.yaml", retrain={**cont, "continuation": {"max_steps": 4, "lr_factor": 1e-9}}
    )
    out = run_to_package(tmp_path, raw, tiny, parent)
    assert (tmp_path / "tok/tokenizer.json").read_bytes() == (
        pkg / "tokenizer/tokenizer.json"
    ).read_bytes()
    new, old = weights(out / "model.pt"), weights(pkg / "model.pt")
    assert new.keys() == old.keys()
    for k in old:
        assert torch.allclose(new[k].float(), old[k].float(), atol=1e-6), k
    ckpt = torch.load(max((tmp_path / "ckpt").glob("step_*.pt")), weights_only=True)
    assert ckpt["parent_sha256"] == before
    assert ckpt["step"] == 4  # the continuation's own steps, from 1
    lineage = json.loads((out / "lineage.json").read_text())
    assert lineage["parent"]["version"] == "v1.0.0"
    assert lineage["parent"]["chain"] == ["v1.0.0"]
    # the grandchild names both ancestors, newest first
    grand = tmp_path / "g"
    grand.mkdir()
    subprocess.run(["cp", "-r", str(out), str(grand / "parent")], check=True)
    p2 = params(grand / "p.yaml", retrain={**cont, "parent": "v2.0.0"})
    cli("parent", grand / "parent", "--metrics", grand / "parent.json", "--params", p2)
    assert json.loads((grand / "parent.json").read_text())["chain"] == ["v2.0.0", "v1.0.0"]
    # a real rate moves the weights away from the parent's (this 4-step parent ended deep in
    # its warmup, at 1.3e-4: ten times that, at once)
    moved = tmp_path / "moved"
    moved.mkdir()
    fast = {"max_steps": 4, "rewarmup_steps": 1, "lr_factor": 10.0}
    p3 = params(moved / "p.yaml", retrain={**cont, "continuation": fast})
    cli(
        "train",
        tmp_path / "shards",
        tmp_path / "tok",
        moved / "ckpt",
        "--parent",
        parent,
        "--no-progress",
        "--params",
        p3,
    )
    last = weights(max((moved / "ckpt").glob("step_*.pt")))
    assert max((last[k].float() - old[k].float()).abs().max().item() for k in old) > 1e-4


def test_parent_stage_in_scratch_mode_leaves_only_none(tmp_path):
    (tmp_path / "p" / "tokenizer").mkdir(parents=True)
    (tmp_path / "p" / "model.pt").write_bytes(b"old")
    out = scratch(tmp_path / "p")
    assert out == {"mode": "scratch", "version": None, "chain": []}
    assert [f.name for f in (tmp_path / "p").iterdir()] == [NONE]


def test_the_parent_stage_in_scratch_mode_imports_no_torch(tmp_path):
    """Every retrain runs the stage; one with no parent has no model to read (torch: ~3 s)."""
    (tmp_path / "params.yaml").write_text("retrain: {mode: scratch}\n")
    code = (
        "import sys; from transformer import parent; parent.main(['p', '--params', "
        "'params.yaml']); print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.splitlines() == ["p: none", "False"]
    assert (tmp_path / "p" / NONE).is_file()


@pytest.mark.slow  # the champion fixture: the stages' CLIs to a package
def test_parent_stage_names_what_is_missing(tmp_path, champion):
    with pytest.raises(ParentError, match="retrain.parent is empty"):
        check(tmp_path, "")
    with pytest.raises(ParentError, match=r"model.pt: missing.*dvc artifacts get"):
        check(tmp_path, "v3.0.0")
    _, pkg = champion
    bad = tmp_path / "bad"
    subprocess.run(["cp", "-r", str(pkg), str(bad)], check=True)
    (bad / "tokenizer/tokenizer.json").write_text("{}")  # another run's tokenizer, meta.json too
    meta = json.loads((bad / "tokenizer/meta.json").read_text())
    meta["tokenizer_sha256"] = hashlib.sha256(b"{}").hexdigest()
    (bad / "tokenizer/meta.json").write_text(json.dumps(meta))
    with pytest.raises(
        ParentError, match="tokenizer: not the tokenizer .*model.pt was trained with"
    ):
        check(bad, "v3.0.0")


@pytest.mark.slow  # the champion fixture: the stages' CLIs to a package
def test_a_kept_tokenizer_must_match_the_recipe(champion, tmp_path):
    raw, pkg = champion
    cont = {"mode": "continue", "parent": "v1.0.0"}
    # the hf source: a pair the synthetic one cannot make is refused before the tokenizer looks
    fr = {"source": "hf", "tgt_lang": "fr"}
    other = params(tmp_path / "p.yaml", retrain=cont, download=fr)
    tok = ("transformer.tokenizer", raw, tmp_path / "tok", "--parent", pkg, "--params", other)
    code, _, err = forked.run(*tok)
    assert code == 1 and "tgt_lang is 'de', expected 'fr'" in err
    assert not (tmp_path / "tok").exists()


@pytest.mark.slow  # the champion fixture: the stages' CLIs to a package
def test_the_oov_rate_counts_words_the_tokenizer_leaves_to_bytes(champion, tmp_path):
    raw, pkg = champion
    tok = load_tokenizer(pkg / "tokenizer")
    own = tok.fit([raw / "train.en", raw / "train.de"])
    greek = tmp_path / "greek.txt"
    greek.write_text("Η γάτα κάθεται στο χαλί και κοιτάζει έξω\n" * 50)
    fit = tok.fit([greek])
    assert fit["oov_rate"] == 1.0 and fit["oov_types"] == 8, fit  # every Greek word is bytes
    assert "γάτα" in fit["oov_examples"]
    assert own["oov_rate"] < 0.5 and own["words"] > 1000
    both = tmp_path / "both.txt"
    both.write_text((raw / "train.en").read_text() + greek.read_text())
    assert own["oov_rate"] < tok.fit([both])["oov_rate"] < 1.0


def test_fallback_names_each_setting_that_does_not_fit():
    a = {"model": {"d_model": 32, "dropout": 0.1}, "tokenizer": {"vocab_size": 300}}
    a["download"] = {"src_lang": "en", "tgt_lang": "de"}
    b = json.loads(json.dumps(a))
    b["model"]["dropout"] = 0.3  # not a shape: the weights still fit
    assert unfit(a, b) == []
    b["model"]["d_model"], b["tokenizer"]["vocab_size"] = 64, 400
    b["download"]["tgt_lang"] = "fr"
    assert unfit(a, b) == [
        "model.d_model 32 -> 64",
        "tokenizer.vocab_size 300 -> 400",
        "download.tgt_lang 'de' -> 'fr'",
    ]


def test_the_continuations_rate_never_exceeds_the_champions_last_by_more_than_its_factor():
    """The rate goes on from where the champion's §5.3 schedule ended (its package's warmup and
    scale, its update count), re-warmed from 0: never above lr_factor x its last rate, whatever
    the model size or where the champion stopped (the fixed warmup 50 / scale 0.5 it replaces
    climbed to 2.7x on the demo and undid the champion's training)."""
    from transformer.core.sections.train import TrainConfig
    from transformer.train import rate
    from transformer.training.continuation import Continuation

    tcfg = TrainConfig()
    for updates, warmup, d_model, factor in [
        (600, 200, 128, 1.0),  # past its warmup: the rate goes on falling
        (50, 4000, 512, 1.0),  # stopped inside its warmup: held at its last rate, not climbing
        (1858, 100, 128, 2.0),
        (1, 1, 16, 0.5),
    ]:
        c = Continuation(updates, warmup, 0.5, 30, factor)
        rates = [rate(s, tcfg, d_model, 0.0, c) for s in range(1, 301)]
        last = c.last_rate(d_model)
        assert max(rates) <= factor * last * (1 + 1e-12), (updates, warmup, max(rates) / last)
        assert rates[0] < rates[29] and rates[29] == pytest.approx(
            factor * c.base(updates + 30, d_model) if updates >= warmup else factor * last
        )


@pytest.mark.slow
def test_a_continuation_trains_at_its_champions_rate(champion, tmp_path):
    """From a real package: its steps and the train settings it was trained with; the stage's
    logged rates stay under the champion's last one."""
    from transformer.core.sections.retrain import ContinuationConfig
    from transformer.core.sections.train import TrainConfig
    from transformer.training.continuation import continuation

    raw, pkg = champion
    c = continuation(pkg, ContinuationConfig(), TrainConfig(warmup_steps=1, lr_scale=9.0))
    theirs = yaml.safe_load((pkg / "params.yaml").read_text())["train"]
    assert (c.updates, c.warmup_steps, c.lr_scale) == (
        4,
        theirs["warmup_steps"],
        theirs["lr_scale"],
    )
    # the stage logs the rate it trains at: its first updates under the champion's last rate
    cont = {"mode": "continue", "parent": "v1.0.0", "continuation": {"max_steps": 40}}
    pfile = params(tmp_path / "p.yaml", retrain=cont)
    live = tmp_path / "live"
    out = cli(
        "train",
        raw.parent / "shards",
        raw.parent / "tok",
        tmp_path / "ckpt",
        "--parent",
        pkg,
        "--live",
        live,
        "--no-progress",
        "--params",
        pfile,
    )
    assert "continuing from" in out and "its last rate" in out, out
    logged = (live / "plots/metrics/train/lr.tsv").read_text().split()[3::2]
    assert logged and max(map(float, logged)) <= c.last_rate(32) * (1 + 1e-6), logged
