"""The training curves as pictures (transformer/core/curves.py): dvc.yaml's plots drawn by
DVC's templates and vl-convert, offline, with every logged point."""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml
from helpers.curves import line_points, write_live

from transformer.core import curves

ROOT = Path(__file__).resolve().parents[1]


def test_dvc_yaml_plots_are_the_figures_the_pictures_draw():
    """`dvc plots show` and the pictures draw the same: dvc.yaml's top-level plots are FIGURES
    with the train stage's dvclive plots folder in front of each file."""
    dvc_yaml = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    (live,) = [p for p in dvc_yaml["stages"]["train"]["plots"]]
    folder = next(iter(live)) if isinstance(live, dict) else live
    defs = {k: v for d in dvc_yaml["plots"] for k, v in d.items()}
    assert defs == {
        name: {**fig, "y": {f"{folder}/{f}": col for f, col in fig["y"].items()}}
        for name, fig in curves.FIGURES.items()
    }


def test_the_card_picture_holds_every_logged_point(tmp_path):
    plots = write_live(tmp_path / "plots" / "metrics", steps=40)
    svg = curves.card_svg(plots)
    root = ET.fromstring(svg)  # well-formed XML
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert len(root.findall("{http://www.w3.org/2000/svg}svg")) == 2  # loss | quality
    assert 40 in line_points(svg, "train/loss.tsv")  # one vertex per row of the metrics file
    assert 4 in line_points(svg, "valid/loss.tsv")
    assert "valid BLEU and chrF" in svg


def test_missing_files_are_left_out_and_none_is_no_picture(tmp_path):
    plots = write_live(tmp_path / "m", steps=20)
    for name in ("valid/bleu.tsv", "valid/chrf.tsv"):
        (plots / name).unlink()
    svg = curves.card_svg(plots)
    assert len(ET.fromstring(svg).findall("{http://www.w3.org/2000/svg}svg")) == 1
    assert curves.card_svg(tmp_path / "nothing") is None


def test_a_picture_past_the_svg_bound_is_a_png(tmp_path, monkeypatch):
    plots = write_live(tmp_path / "m", steps=30)
    spec = curves.specs(curves.plots_data(plots))["loss"]
    mime, blob = curves.picture(spec)
    assert mime == "image/svg+xml" and blob.startswith(b"<svg")
    monkeypatch.setattr(curves, "MAX_SVG_BYTES", 1000)
    mime, blob = curves.picture(spec)
    assert mime == "image/png" and blob.startswith(b"\x89PNG\r\n\x1a\n")
    uri = curves.data_uri(mime, blob)
    assert base64.b64decode(uri.split(",", 1)[1]) == blob
