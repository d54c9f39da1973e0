"""Training curves as pictures: dvclive's metrics drawn by DVC's own Vega-Lite templates (the
ones `dvc plots show` fills) and rendered offline to SVG by vl-convert (no browser, no network).

FIGURES are dvc.yaml's top-level `plots` (tests/test_curves.py checks that they are the same),
with the files relative to dvclive's plots folder: the package stage draws the model card's
curves.svg from them, and flows/curves.py draws the Prefect artifact's pictures from dvc.yaml
through DVC's API (there with the champion's curves too). Both go through render().
Torch-free: the flows import it.
"""

from __future__ import annotations

import base64
import csv
import re
from pathlib import Path
from typing import Any

# what each picture shows: DVC's plot definitions (x, y: {file: column}), files relative to
# dvclive's plots/metrics folder (dvclive writes metric "valid/bleu" to valid/bleu.tsv)
FIGURES: dict[str, dict[str, Any]] = {
    "loss": {
        "title": "train and valid loss",
        "x": "step",
        "y": {"train/loss.tsv": "loss", "valid/loss.tsv": "loss"},
        "y_label": "loss",
    },
    "quality": {
        "title": "valid BLEU and chrF",
        "x": "step",
        "y": {"valid/bleu.tsv": "bleu", "valid/chrf.tsv": "chrf"},
        "y_label": "score",
    },
}
# above this an SVG (whose size grows with the points: each one is a path vertex and a hover
# cell) is rendered as a PNG instead, whose size does not
MAX_SVG_BYTES = 200_000
WORKSPACE = "workspace"  # DVC's name for the files as they are on disk


def read_tsv(path: Path) -> list[dict[str, str]]:
    """A dvclive metrics file's rows ({column: text}), as DVC's plots loader reads them."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def plots_data(
    plots_dir: Path, figures: dict[str, dict[str, Any]] = FIGURES, rev: str = WORKSPACE
) -> dict[str, Any]:
    """`figures` over the files in `plots_dir`, in the shape `Repo.plots.show()` returns (the
    figures' files that are not there are left out, as DVC leaves out a missing source)."""
    plots_dir, used = Path(plots_dir), {f for d in figures.values() for f in d["y"]}
    sources = {
        f: {"data": read_tsv(plots_dir / f)} for f in sorted(used) if (plots_dir / f).is_file()
    }
    definitions = {"data": {"dvc.yaml": {"data": figures}}}
    return {rev: {"definitions": definitions, "sources": {"data": sources}}}


def specs(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{plot id: its Vega-Lite spec, data filled in} from `Repo.plots.show()`'s result, as
    `dvc plots show` fills its templates (revisions told apart by colour); only plots with
    points."""
    from dvc.render.match import match_defs_renderers

    out = {}
    for r in match_defs_renderers(data):
        spec = r.renderer.get_filled_template()
        if r.renderer.TYPE == "vega" and spec.get("data", {}).get("values"):
            out[r.renderer.name] = spec
    return out


def picture(spec: dict[str, Any]) -> tuple[str, bytes]:
    """(MIME type, bytes) of a Vega-Lite spec drawn: SVG, or PNG past MAX_SVG_BYTES."""
    import vl_convert as vlc

    svg = vlc.vegalite_to_svg(spec).encode()
    if len(svg) <= MAX_SVG_BYTES:
        return "image/svg+xml", svg
    return "image/png", vlc.vegalite_to_png(spec)


def data_uri(mime: str, blob: bytes) -> str:
    """A picture as a data URI: Prefect's markdown artifacts show these (not inline <svg>)."""
    return f"data:{mime};base64,{base64.b64encode(blob).decode()}"


def side_by_side(svgs: list[str]) -> str:
    """One SVG holding `svgs` left to right (each keeps its own size)."""
    sizes = [tuple(float(_attr(s, k)) for k in ("width", "height")) for s in svgs]
    x, parts = 0.0, []
    for s, (w, _) in zip(svgs, sizes, strict=True):
        inner = re.sub(r"^<\?xml[^>]*>\s*", "", s.strip())
        parts.append(inner.replace("<svg", f'<svg x="{x:g}"', 1))
        x += w
    h = max((h for _, h in sizes), default=0.0)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{x:g}" height="{h:g}" '
        f'viewBox="0 0 {x:g} {h:g}">' + "".join(parts) + "</svg>\n"
    )


def _attr(svg: str, name: str) -> str:
    m = re.search(rf'<svg[^>]*\s{name}="([0-9.]+)', svg)
    if not m:
        raise ValueError(f"an SVG without a numeric {name}: {svg[:80]!r}")
    return m.group(1)


def card_svg(plots_dir: Path) -> str | None:
    """The model card's picture: FIGURES over the run's dvclive files, side by side, as SVG
    (None when none of their files has points)."""
    import vl_convert as vlc

    drawn = [vlc.vegalite_to_svg(s) for s in specs(plots_data(Path(plots_dir))).values()]
    return side_by_side(drawn) if drawn else None
