"""benchmarks/quality/noise_clean.py: the injected noise is what it says, and each run's params
are a valid project config."""

from __future__ import annotations

from pathlib import Path

import yaml

from benchmarks.quality import noise_clean
from benchmarks.quality.multi30k_sweep import overrides_to_tree
from transformer.core.presets import load_all, merge, preset_params


def fake_data(root: Path, n: int = 200) -> Path:
    m = root / "multi30k"
    m.mkdir(parents=True)
    for lang, word in (("en", "dog"), ("de", "Hund"), ("fr", "chien")):
        (m / f"train.{lang}").write_text("".join(f"a {word} number {i}\n" for i in range(n)))
    (root / "wmt-sample").mkdir()
    (root / "wmt-sample" / "train.tok.en").write_text(
        "".join(f"news line {i} here\n" for i in range(50)) + "too short\n"
    )
    return root


def test_noise_replaces_the_rate_in_equal_kinds_and_nothing_else(tmp_path):
    data = fake_data(tmp_path / "data")
    counts = noise_clean.build(tmp_path / "c", 0.2, seed=3, data=data)
    assert counts == dict.fromkeys(noise_clean.KINDS, 10)
    en = (tmp_path / "c" / "train.en").read_text().splitlines()
    de = (tmp_path / "c" / "train.de").read_text().splitlines()
    assert en == [f"a dog number {i}" for i in range(200)]  # sources untouched
    kinds = {
        int(i) - 1: k
        for i, k in (r.split("\t") for r in (tmp_path / "c" / "noise.tsv").read_text().splitlines())
    }
    assert len(kinds) == 40
    for i, line in enumerate(de):
        k = kinds.get(i)
        if k is None:
            assert line == f"a Hund number {i}"
        elif k == "french":
            assert line == f"a chien number {i}"
        elif k == "copy":
            assert line == en[i]
        elif k == "wmt":
            assert line.startswith("news line ")
        else:  # misaligned: another pair's German, never its own
            assert line.startswith("a Hund number ") and line != f"a Hund number {i}"
    oracle = (tmp_path / "c" / "oracle" / "train.de").read_text().splitlines()
    assert oracle == [f"a Hund number {i}" for i in range(200) if i not in kinds]
    assert len((tmp_path / "c" / "oracle" / "train.en").read_text().splitlines()) == 160
    again = noise_clean.build(tmp_path / "d", 0.2, seed=3, data=data)
    assert again == counts
    assert (tmp_path / "d" / "train.de").read_bytes() == (tmp_path / "c" / "train.de").read_bytes()


def test_kept_counts_each_kind_the_download_stage_kept(tmp_path):
    data = fake_data(tmp_path / "data")
    corpus = tmp_path / "c"
    noise_clean.build(corpus, 0.2, seed=1, data=data)
    en = (corpus / "train.en").read_text().splitlines()
    de = (corpus / "train.de").read_text().splitlines()
    rows = (r.split("\t") for r in (corpus / "noise.tsv").read_text().splitlines())
    copies = {int(i) - 1 for i, k in rows if k == "copy"}
    raw = tmp_path / "raw"
    raw.mkdir()
    keep = [i for i in range(len(en)) if i not in copies]
    (raw / "train.en").write_text("".join(en[i] + "\n" for i in keep))
    (raw / "train.de").write_text("".join(de[i] + "\n" for i in keep))
    out = noise_clean.kept(raw, corpus)
    assert out["copy"] == {"injected": 10, "kept": 0}
    assert out["french"] == {"injected": 10, "kept": 10}
    assert out["clean pairs"] == {"injected": 160, "kept": 160}


def test_each_run_is_a_valid_config_and_only_filtered_filters(tmp_path):
    base = preset_params("multi30k-en-de")
    for run in noise_clean.RUNS:
        flat = noise_clean.params_for(run, tmp_path / "corpus", 20, seed=2)
        params = merge(base, overrides_to_tree(flat))
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        cfg = load_all(tmp_path / "params.yaml")["download"]  # every section validated
        assert cfg.clean.langid == cfg.clean.copies == cfg.clean.script == (run == "filtered")
        assert params["train"]["time_budget_minutes"] == 20 and params["train"]["seed"] == 2
        paths = [p["path"] for parts in params["download"]["splits"].values() for p in parts]
        assert all(Path(p).is_absolute() for p in paths), paths
        assert ("corpus" in paths[0]) == (run != "clean")


def test_the_drop_curve_counts_each_kind_among_each_fractions_worst():
    """benchmarks/quality/drop_curve.py: the worst `fraction` by cost, as the score stage drops
    them (the earlier of equal costs first), counted by kind."""
    from benchmarks.quality.drop_curve import curve

    costs = [0.1, 3.0, 0.2, 2.0, 2.0, 0.3, 0.4, 0.5, 0.6, 0.7]
    kind_of = ["clean", "misaligned", "clean", "misaligned", "clean"] + ["clean"] * 4 + ["wmt"]
    low, high = curve(costs, kind_of, [0.2, 0.4])
    assert low == {
        "fraction": 0.2,
        "dropped": 2,
        "cost_at_edge": 2.0,
        "misaligned": 2,  # 3.0, then the earlier of the two 2.0s
        "misaligned_of": 2,
        "clean": 0,
        "clean_of": 7,
        "other_noise": 0,
    }
    assert (high["dropped"], high["misaligned"], high["clean"], high["other_noise"]) == (4, 2, 1, 1)
