"""The package stage: one folder with the model, its tokenizer, scores and params, checked to
belong together, that `transformer-translate --model DIR` reads."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from flows.lineage import params_hash
from transformer import decode, package
from transformer.core.card import NOT_RECIPE, recipe
from transformer.core.layout import CURVES, NOT_PACKAGED, PARAMS
from transformer.package import PackageError


def test_the_package_holds_what_translating_needs(scored, tmp_path):
    d = scored
    package.main(
        [
            str(d / "avg.pt"),
            str(d / "tokenizer"),
            str(d / "ev.json"),
            str(tmp_path / "pkg"),
            "--params",
            str(d / "params.yaml"),
        ]
    )
    pkg = tmp_path / "pkg"
    assert sorted(p.name for p in pkg.iterdir()) == [
        "README.md",  # the model card
        "hf",  # params package.hf (default true): the model for Hugging Face transformers
        "lineage.json",
        "model.pt",
        "params.yaml",
        "tokenizer",
    ]
    assert (pkg / "model.pt").read_bytes() == (d / "avg.pt").read_bytes()
    assert json.loads((pkg / "lineage.json").read_text()) == json.loads((d / "ev.json").read_text())
    assert yaml.safe_load((pkg / "params.yaml").read_text())["decode"]["beam_size"] == 2
    # --model DIR translates as the model, its tokenizer and its params named one by one
    src = tmp_path / "in.txt"
    src.write_text("the cat sat\n\nwe read a book\n")
    for out, args in (
        ("a.txt", ["--model", str(pkg)]),
        (
            "b.txt",
            [
                "--model",
                str(d / "avg.pt"),
                "--tokenizer",
                str(d / "tokenizer"),
                "--params",
                str(pkg / "params.yaml"),
            ],
        ),
    ):
        decode.main([*args, "-i", str(src), "-o", str(tmp_path / out), "--no-progress"])
    assert (tmp_path / "a.txt").read_text() == (tmp_path / "b.txt").read_text()
    assert len((tmp_path / "a.txt").read_text().split("\n")) == 4


def test_parts_that_do_not_belong_together_are_refused(scored, tmp_path):
    d = scored
    other = tmp_path / "other-tokenizer"
    shutil.copytree(d / "tokenizer", other)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text() + " ")
    with pytest.raises(PackageError, match="other-tokenizer: tokenizer sha256 .* is not the one"):
        package.package(d / "avg.pt", other, d / "ev.json", {}, tmp_path / "pkg")
    with pytest.raises(PackageError, match=r"ev\.json scores model .*, not .*step_00000001\.pt"):
        package.package(
            d / "ckpts" / "step_00000001.pt", d / "tokenizer", d / "ev.json", {}, tmp_path / "pkg"
        )
    assert not (tmp_path / "pkg").exists()  # nothing half-written
    with pytest.raises(SystemExit, match="a folder without model.pt: not a package"):
        decode.main(["--model", str(tmp_path), "-i", "/dev/null"])
    with pytest.raises(SystemExit, match="--tokenizer is required unless --model is a package"):
        decode.main(["--model", str(d / "avg.pt"), "-i", "/dev/null"])


def test_the_retrain_section_is_left_out_of_the_package_the_recipe_hash_and_the_card(
    scored, tmp_path
):
    """NOT_PACKAGED (transformer/core/layout.py), one list: the package's params.yaml leaves it
    out, so the recipe's hash the retrain flow compares is the same for the project's params.yaml
    as for the package's; the card's recipe (what trained the model) leaves out `package` too."""
    d = scored
    params = {
        "decode": {"beam_size": 2},
        "package": {"hf": False, "ctranslate2": "none"},
        "retrain": {"margin": 0.5},
    }
    package.package(d / "avg.pt", d / "tokenizer", d / "ev.json", params, tmp_path / "pkg")
    kept = (tmp_path / "pkg" / PARAMS).read_text()
    assert set(yaml.safe_load(kept)) == set(params) - set(NOT_PACKAGED) == {"decode", "package"}
    assert params_hash(yaml.safe_dump(params)) == params_hash(kept)
    other = {**params, "retrain": {"margin": 1.0}}
    assert params_hash(yaml.safe_dump(other)) == params_hash(kept)
    other = {**params, "package": {"hf": True}}
    assert params_hash(yaml.safe_dump(other)) != params_hash(kept)
    # the other lines' champions used: the card's lineage names them, not its recipe
    assert set(NOT_RECIPE) == {*NOT_PACKAGED, "package", "helpers"}
    _, over = recipe(params)
    assert not [k for k in over if k.split(".")[0] in NOT_RECIPE]


def test_the_card_shows_the_training_curves_from_the_package(scored, tmp_path):
    """--plots: the run's dvclive curves drawn into curves.svg, which the card (and the
    Hugging Face form's copy of it) links; without it, no picture and no link."""
    from helpers.curves import line_points, write_live

    d = scored
    plots = write_live(tmp_path / "live" / "plots" / "metrics", steps=30)
    args = [str(d / "avg.pt"), str(d / "tokenizer"), str(d / "ev.json")]
    package.main([*args, str(tmp_path / "pkg"), "--params", str(d / "params.yaml")])
    assert not (tmp_path / "pkg" / CURVES).exists()
    assert CURVES not in (tmp_path / "pkg" / "README.md").read_text()
    pkg = tmp_path / "with"
    package.main([*args, str(pkg), "--params", str(d / "params.yaml"), "--plots", str(plots)])
    svg = (pkg / CURVES).read_text()
    assert 30 in line_points(svg, "train/loss.tsv")
    assert f"]({CURVES})" in (pkg / "README.md").read_text()
    assert (pkg / "hf" / CURVES).read_bytes() == (pkg / CURVES).read_bytes()


def test_the_package_records_where_and_how_the_model_was_trained(corpus, tmp_path):
    """A real (tiny) train run records its device, precision, update path, process count and
    torch version in its metrics and checkpoints; average carries them into model.pt, and the
    package into lineage.json and the card's Hardware line."""
    import torch
    from helpers.train import run, write_params

    from transformer import average, evaluate
    from transformer.core import hardware

    params = write_params(tmp_path / "params.yaml", max_steps=4)
    extra = {"package": {"hf": False}, "decode": {"beam_size": 1, "max_len_b": 5}}
    params.write_text(yaml.safe_dump({**yaml.safe_load(params.read_text()), **extra}))
    p = ["--params", str(params)]
    run(corpus, tmp_path / "ckpts", params, "--live", tmp_path / "live")
    summary = json.loads((tmp_path / "live" / "metrics.json").read_text())
    want = {
        "device": hardware.cpu_name(),
        "device_type": "cpu",
        "precision": "fp32",
        "processes": 1,
        "update": "eager",
        "eager_shapes": 0,
        "torch": str(torch.__version__),
    }
    assert summary["trained_on"] == want
    average.main([str(tmp_path / "ckpts"), str(tmp_path / "avg.pt"), *p])
    ev = [str(tmp_path / "avg.pt"), str(corpus / "tok"), str(corpus / "raw"), str(tmp_path / "ev")]
    evaluate.main([*ev, "--metrics", str(tmp_path / "ev.json"), "--no-progress", *p])
    package.main([*ev[:2], str(tmp_path / "ev.json"), str(tmp_path / "pkg"), *p])
    lineage = json.loads((tmp_path / "pkg" / "lineage.json").read_text())
    assert lineage["trained_on"] == want
    card = (tmp_path / "pkg" / "README.md").read_text(encoding="utf-8")
    line = (
        f"- Hardware: {want['device']} (cpu), 1 process, fp32, eager update, torch {want['torch']}"
    )
    assert line in card.splitlines()


def test_the_hardware_line_names_the_shapes_that_fell_back_and_old_records():
    from transformer.core import hardware

    rec = hardware.record("cuda", "NVIDIA H200", "bf16", 1, "captured", 2, "2.7.1")
    assert hardware.text(rec) == (
        "NVIDIA H200 (cuda), 1 process, bf16, captured update "
        "(2 batch shape(s) fell back to eager), torch 2.7.1"
    )
    assert hardware.text(None).startswith("not recorded")
