"""The retrain flow's decision (pure), its flow-only settings (editing them reruns no stage), and
overrides and settings read with the run's revision's own code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.checkout import checkout
from prefect_fixtures import DVC, sh

from flows.pipeline import prepare
from flows.recipe import resolve
from flows.retrain import KEPT, decide_start
from flows.shell import check_override, read_section
from flows.significance import Rules
from transformer import tokenizer as T
from transformer.core.sections.model import ARCH_KEYS, WEIGHT_KEYS
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.core.settings import ConfigError
from transformer.data.vocab import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
OURS = {"model": {"d_model": 64}, "tokenizer": {"vocab_size": 300}, "download": {"src_lang": "en"}}
CHAMPION = {"version": "v1.0.0", "experiment_commit": "abc"}


def fits(rate: float):
    """A fit probe that records its calls (the champion's tokenizer on the new data)."""
    asked: list[str] = []

    def fit(version: str) -> dict:
        asked.append(version)
        return {"oov_rate": rate}

    return fit, asked


def test_continues_when_the_recipe_fits_and_the_tokenizer_covers_the_data():
    fit, asked = fits(0.005)
    start = decide_start("continue", CHAMPION, OURS, OURS, 0.01, fit)
    assert (start.parent, start.overrides, asked) == (
        "v1.0.0",
        ("retrain.parent=v1.0.0",),
        ["v1.0.0"],
    )
    assert start.why.startswith("continued from v1.0.0 (its tokenizer kept, OOV rate 0.50%")


def test_each_reason_for_scratch_is_named_and_the_probe_runs_only_when_needed():
    fit, asked = fits(0.5)
    assert decide_start("scratch", CHAMPION, OURS, OURS, 0.01, fit).overrides == ()
    none = decide_start("continue", None, None, OURS, 0.01, fit)
    assert none.why == "from scratch: no champion to continue from"
    changed = {**OURS, "model": {"d_model": 48}, "tokenizer": {"vocab_size": 320}}
    shape = decide_start("continue", CHAMPION, OURS, changed, 0.01, fit)
    assert "model.d_model 64 -> 48; tokenizer.vocab_size 300 -> 320 since v1.0.0" in shape.why
    assert asked == []  # nothing fetched or measured for a champion that cannot be continued
    oov = decide_start("continue", CHAMPION, OURS, OURS, 0.4, fit)
    assert (oov.parent, oov.overrides, asked) == (None, ("retrain.mode=scratch",), ["v1.0.0"])
    assert "leaves 50.00% of the new train data's words" in oov.why
    assert "more than retrain.max_oov_rate 40.00%" in oov.why


def test_a_continued_retrain_keeps_every_key_a_checkpoint_must_match():
    """KEPT's model keys are the weights' (WEIGHT_KEYS), so ARCH_KEYS' too: a changed one trains
    from scratch rather than failing to load the champion's weights."""
    assert KEPT["model"] == WEIGHT_KEYS and set(ARCH_KEYS) <= set(KEPT["model"])
    fit, asked = fits(0.0)
    for k in WEIGHT_KEYS:
        changed = {**OURS, "model": {**OURS["model"], k: "other"}}
        start = decide_start("continue", CHAMPION, OURS, changed, 0.01, fit)
        assert start.parent is None and f"the recipe changed model.{k} " in start.why
    assert asked == []


def set_params(project: Path, **retrain) -> None:
    path = project / "params.yaml"
    params = yaml.safe_load(path.read_text())
    params["retrain"].update(retrain)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.mark.slow
def test_the_gate_settings_leave_dvc_status_clean(tmp_path):
    """The parent stage reads the retrain section (retrain.mode, retrain.parent): an edit of the
    gate's settings (margin, alpha, max_chrf_drop, bootstrap_samples/seed) or the OOV limit
    leaves it up to date, and no stage lists those keys."""
    project = checkout(tmp_path, remote=False)
    sh(*DVC, "repro", "--single-item", "parent", cwd=project)

    def status() -> dict:
        return json.loads(sh(*DVC, "status", "--json", "parent", cwd=project))

    assert status() == {}
    gate = {"alpha": 0.01, "max_chrf_drop": 0.5, "bootstrap_samples": 200, "bootstrap_seed": 7}
    set_params(project, margin=2.5, max_oov_rate=0.3, **gate)
    assert status() == {}
    assert Rules.of(read_section(project, "retrain")) == Rules(2.5, 0.01, 0.5, 200, 7)
    assert read_section(project, "retrain")["margin"] == 2.5
    assert resolve(project).rules.margin == 0.0  # the gate is the committed params.yaml's
    sh("git", "commit", "-qam", "the gate's settings", cwd=project)
    assert resolve(project).rules == Rules(2.5, 0.01, 0.5, 200, 7)
    set_params(project, parent="v9.0.0")  # what the stage reads: stale
    assert status() == {
        "parent": [{"changed deps": {"params.yaml": {"retrain.parent": "modified"}}}]
    }
    dvc_yaml = yaml.safe_load((project / "dvc.yaml").read_text())
    listed = {p for s in dvc_yaml["stages"].values() for p in s.get("params", [])}
    flow_only = {f"retrain.{k}" for k in ("margin", "max_oov_rate", *gate)}
    assert not listed & {"retrain", *flow_only}


@pytest.mark.slow
def test_overrides_are_checked_by_the_runs_revision(tmp_path):
    """A key that only the run's revision has is accepted; one that no revision has is refused,
    named, before anything is written."""
    project = checkout(tmp_path, remote=False)
    section = project / "transformer/core/sections/evaluate.py"
    text = section.read_text()
    anchor = "    split: str"
    assert anchor in text
    section.write_text(
        text.replace(anchor, "    extra_knob: int = 0  # new at this revision\n" + anchor, 1)
    )
    sh("git", "commit", "-qam", "a new evaluate setting", cwd=project)
    with pytest.raises(ConfigError, match="unknown key evaluate.extra_knob"):
        check_override("evaluate.extra_knob=3")  # this process's schema lacks it
    ws, _ = prepare(project, "HEAD", "demo", ["evaluate.extra_knob=3"])
    assert yaml.safe_load((ws / "params.yaml").read_text())["evaluate"]["extra_knob"] == 3
    with pytest.raises(
        ConfigError, match=r"unknown key evaluate\.nowhere \(valid keys: .*extra_knob"
    ):
        prepare(project, "HEAD", "demo", ["evaluate.nowhere=1"])
    assert "nowhere" not in (ws / "params.yaml").read_text()
    set_params(ws, margin=-1.0)
    with pytest.raises(ConfigError, match="retrain.margin must be a number >= 0"):
        read_section(ws, "retrain")


def test_the_fit_probe_is_the_tokenizers_own_measure(tmp_path):
    """`python -m transformer.data.vocab fit` (what the flow runs in the workspace) prints what
    Subwords.fit measures, and names a missing tokenizer folder."""
    train = tmp_path / "train.en"
    train.write_text("the house by the river\nthe river by the house\n" * 20)
    new = tmp_path / "new.en"
    new.write_text("η γάτα κάθεται στο χαλί\nthe house\n")
    cfg = TokenizerConfig(vocab_size=T.min_vocab_size("bpe") + 20, min_frequency=1)
    tok = T.train_tokenizer([train], cfg)
    T.save_tokenizer(tok, tmp_path / "tok", {"type": "bpe"})
    cli = [sys.executable, "-m", "transformer.data.vocab", "fit"]
    out = json.loads(sh(*cli, str(tmp_path / "tok"), str(new), cwd=ROOT))
    assert out == load_tokenizer(tmp_path / "tok").fit([new])
    assert out["oov_words"] == 5 and out["words"] == 7  # the Greek words, not "the", "house"
    nope = [*cli, str(tmp_path / "nope"), str(new)]
    r = subprocess.run(nope, capture_output=True, text=True, check=False)
    assert r.returncode == 1 and "nope/meta.json: missing" in r.stderr
