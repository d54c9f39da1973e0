"""The helpers and score stages (issue 81): another line's champion, checked, reads each training
pair; the misaligned ones go (dual conditional cross-entropy, or the backward model alone),
per part; valid and test pass byte for byte; with no champion nothing is scored, and it says so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from transformer import helpers, score
from transformer.core.sections import helpers as roles
from transformer.core.sections.helpers import HelpersConfig
from transformer.core.sections.score import ScoreConfig
from transformer.core.settings import ConfigError

PLANTED = range(0, 200, 10)  # every 10th pair's German side is another pair's: misaligned


def en_de_run(d: Path, helper: Path, score_cfg: dict, pin: str = "de-en@v1.0.0") -> Path:
    """An English->German run's inputs in d: raw/ (train: 200 pairs the helper never trained on,
    PLANTED misaligned; valid and test), the download manifest (parts crawl and curated, 100
    pairs each), params.yaml, and the helper's package as data/helpers/backward."""
    corpus, raw = helper.parent / "raw", d / "raw"
    raw.mkdir(parents=True)
    en = (corpus / "valid.en").read_text().splitlines()
    de = (corpus / "valid.de").read_text().splitlines()
    rotated = [*PLANTED[1:], PLANTED[0]]
    planted = list(de)
    for i, j in zip(PLANTED, rotated):
        planted[i] = de[j]
    (raw / "train.en").write_text("\n".join(en) + "\n")
    (raw / "train.de").write_text("\n".join(planted) + "\n")
    for split in ("valid", "test"):
        for lang in ("en", "de"):  # a sentence with a tab and no final newline: kept as it is
            (raw / f"{split}.{lang}").write_bytes((corpus / f"test.{lang}").read_bytes() + b"x\ty")
    parts = {"crawl": {"kept": 100}, "curated": {"kept": 100}}
    (d / "download.json").write_text(json.dumps({"splits": {"train": {"parts": parts}}}))
    params = {
        "download": {"src_lang": "en", "tgt_lang": "de"},
        "helpers": {"backward": pin},
        "score": {"worst": 5, **score_cfg},
    }
    (d / "params.yaml").write_text(yaml.safe_dump(params))
    shutil.copytree(helper, d / "helpers" / "backward")
    return d


def run_stages(d: Path) -> dict:
    """The helpers stage, then the score stage; the score stage's metrics."""
    p = str(d / "params.yaml")
    helpers.main([str(d / "helpers"), "--metrics", str(d / "helpers.json"), "--params", p])
    args = [str(d / x) for x in ("raw", "helpers", "corpus")]
    score.main(
        [*args, "--manifest", str(d / "download.json"), "--metrics", str(d / "score.json")]
        + ["--worst", str(d / "worst.tsv"), "--params", p]
    )
    return json.loads((d / "score.json").read_text())


def test_the_cost_is_junczys_dowmunts_dual_conditional_cross_entropy() -> None:
    h_f, h_b = np.array([1.0, 1.0, 3.0]), np.array([1.0, 3.0, 3.0])
    # |H_f - H_b| + (H_f + H_b) / 2: agreeing and likely < disagreeing < agreeing and unlikely
    assert score.costs(h_f, h_b).tolist() == [1.0, 4.0, 3.0]
    assert score.costs(None, h_b) is h_b  # the backward model alone (mozilla's filter)
    cost = np.array([0.5, 2.0, 1.0, 3.0])
    assert score.drops(cost, 1.5, 0.0).tolist() == [False, True, False, True]
    assert score.drops(cost, 0.0, 0.25).tolist() == [False, False, False, True]
    assert score.drops(cost, 2.5, 0.5).tolist() == [False, True, False, True]


def test_the_settings_are_checked_and_each_role_has_a_pin() -> None:
    assert [f for f in HelpersConfig.__dataclass_fields__] == list(roles.ROLES)
    assert roles.parse_pin("de-en@v2.0.0") == ("de-en", "v2.0.0")
    assert roles.parse_pin("de-en") == ("de-en", None)
    with pytest.raises(ConfigError, match="helpers.backward must be LINE@vX.Y.Z"):
        HelpersConfig(backward="de-en@latest")
    with pytest.raises(ConfigError, match="unknown key score.parts.crawl.drop"):
        ScoreConfig(parts={"crawl": {"drop": 0.1}})
    with pytest.raises(ConfigError, match=r"score.parts.crawl.drop_fraction must be in \[0, 1\)"):
        ScoreConfig(parts={"crawl": {"drop_fraction": 1.5}})


def test_the_backward_model_finds_the_misaligned_pairs_of_a_scored_part(
    de_en_helper: Path, tmp_path: Path
) -> None:
    d = en_de_run(
        tmp_path, de_en_helper, {"drop_fraction": 0.1, "parts": {"curated": {"drop_fraction": 0}}}
    )
    out = run_stages(d)
    used = json.loads((d / "helpers.json").read_text())
    assert used["backward"]["version"] == "v1.0.0" and used["forward"]["version"] is None
    assert out["method"] == score.METHODS[("backward",)]
    crawl, curated = out["parts"]["crawl"], out["parts"]["curated"]
    assert (crawl["read"], crawl["scored"], crawl["dropped"]) == (100, 100, 10)
    assert (curated["scored"], curated["dropped"], curated["kept"]) == (0, 0, 100)
    raw = (d / "raw" / "train.de").read_text().splitlines()
    kept = (d / "corpus" / "train.de").read_text().splitlines()
    gone = [i for i, line in enumerate(raw) if line not in kept]
    planted_in_crawl = [i for i in PLANTED if i < 100]
    assert len(gone) == 10 and len(set(gone) & set(planted_in_crawl)) >= 8, gone  # 10 planted
    assert [raw[i] for i in range(len(raw)) if i not in gone] == kept  # in order
    assert all(raw[i] in kept for i in PLANTED if i >= 100)  # the curated part is not scored
    # evaluation sets: never scored, byte for byte
    for f in ("valid.en", "valid.de", "test.en", "test.de"):
        assert (d / "corpus" / f).read_bytes() == (d / "raw" / f).read_bytes()
    rows = [r.split("\t") for r in (d / "worst.tsv").read_text().splitlines()]
    assert rows[0] == score.TSV_HEAD.strip().split("\t") and len(rows) == 6
    assert all(r[3] == "crawl" and r[5] == "yes" and r[1] == "" for r in rows[1:])
    assert sum(int(r[4]) - 1 in PLANTED for r in rows[1:]) >= 4  # the worst are planted ones


def test_scoring_that_drops_more_than_max_drop_stops_the_stage(
    de_en_helper: Path, tmp_path: Path
) -> None:
    d = en_de_run(tmp_path, de_en_helper, {"threshold": 1e-6, "drop_fraction": 0})
    with pytest.raises(SystemExit, match="part crawl: scoring drops .* download.clean.max_drop"):
        run_stages(d)
    assert not (d / "corpus").exists()  # nothing half-written


def test_a_helper_of_the_wrong_direction_is_refused(de_en_helper: Path, tmp_path: Path) -> None:
    d = en_de_run(tmp_path, de_en_helper, {})
    (d / "helpers" / "backward").rename(d / "helpers" / "forward")
    params = yaml.safe_load((d / "params.yaml").read_text())
    params["helpers"] = {"forward": "de-en@v1.0.0"}
    (d / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(SystemExit, match="de-en@v1.0.0 translates de -> en; a forward model"):
        run_stages(d)


def test_without_a_champion_nothing_is_scored_and_the_metrics_say_why(
    de_en_helper: Path, tmp_path: Path
) -> None:
    d = en_de_run(tmp_path, de_en_helper, {}, pin="de-en")  # declared; no champion yet
    (d / "helpers" / "backward" / "model.pt").unlink()  # a stale folder: emptied
    out = run_stages(d)
    assert not out["scored"] and out["method"] is None and out["dropped"] == 0
    assert "backward: de-en had no champion yet when this run started" in out["why"]
    assert sorted(p.name for p in (d / "helpers" / "backward").iterdir()) == [roles.NONE]
    for f in (d / "raw").iterdir():
        assert (d / "corpus" / f.name).read_bytes() == f.read_bytes()
    assert (d / "worst.tsv").read_text() == score.TSV_HEAD


def test_the_card_names_the_champions_used_and_what_scoring_dropped() -> None:
    from transformer.core.card import model_card

    used = {
        "backward": {"line": "de-en", "version": "v3.0.0", "model_sha256": "ab12"},
        "forward": {"line": None, "version": None, "why": "none declared"},
    }
    parts = {"crawl": {"read": 100, "scored": 100, "dropped": 10}, "curated": {"read": 5}}
    scored = {"scored": True, "method": "X", "read": 105, "dropped": 10, "parts": parts}
    lineage = {"bleu": 30.0, "split": "test", "helpers": used, "score": scored}
    card = model_card(lineage, {}, None, {}, "rev")
    assert "- other lines' champions used: backward de-en@v3.0.0 (model sha256 `ab12`)" in card
    assert "Train pairs scored by X: 10 of 105 dropped (crawl: 10 of 100)" in card
    none = {**lineage, "helpers": {"backward": {"line": "de-en", "why": "no champion yet"}}}
    none["score"] = {"scored": False, "why": "no model to score with"}
    card = model_card(none, {}, None, {}, "rev")
    assert "champions used: backward de-en: none (no champion yet)" in card
    assert "Train pairs not scored: no model to score with." in card


def test_a_pairs_cross_entropy_is_the_models_own_loss_whatever_its_batch(
    de_en_helper: Path,
) -> None:
    """Teacher-forced mean NLL per target token, as F.cross_entropy of the model's logits says;
    the same pair in a batch of one or of many (padding changes nothing)."""
    import torch
    import torch.nn.functional as F

    from transformer.data.batches import collate
    from transformer.model.crossent import cross_entropy, encode, load_scorer

    scorer = load_scorer(de_en_helper, "fp32")
    corpus = de_en_helper.parent / "raw"
    de = (corpus / "test.de").read_text().splitlines()[:40]
    en = (corpus / "test.en").read_text().splitlines()[:40]
    alone = cross_entropy(scorer, de, en, batch_tokens=1)  # a pair a batch
    many = cross_entropy(scorer, de, en, batch_tokens=16384)
    assert np.allclose(alone, many, atol=1e-4)
    src, tgt = (encode(scorer.tokenizer, [x], 1024)[0] for x in (de[3], en[3]))
    b = collate([(src, tgt)])
    with torch.inference_mode():
        logits = scorer.model(b.src, b.tgt_in)[0]  # (T, V)
        want = F.cross_entropy(logits, b.tgt_out[0]).item()
    assert abs(many[3] - want) < 1e-4
