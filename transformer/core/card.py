"""The model card: README.md in the package and in each export, with HF's YAML front matter.

Everything in it comes from the stage files: the download manifest (data and its counts),
params.yaml (the recipe: the nearest preset and what differs from it), the evaluate stage's
metrics (BLEU, chrF and their sacreBLEU signatures, the lineage and its hashes) and the
checkpoint (steps, training time) and the train stage's record of where and how it trained
(hardware.py, in lineage.json).
"""

from __future__ import annotations

from typing import Any

import yaml

from transformer.core import hardware, presets
from transformer.core.layout import CURVES, NOT_PACKAGED
from transformer.core.sections import helpers as roles

LICENSE = "mit"  # the code's (pyproject.toml); the data's own terms are the user's to check
# the recipe compared with the presets: what trained the model, not how it is retrained
# (NOT_PACKAGED, not in the package's params) nor shipped (`package`, which is), nor the other
# lines' champions it used (`helpers`: the card's lineage names them)
NOT_RECIPE = (*NOT_PACKAGED, "package", "helpers")


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def recipe(params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(the preset nearest to `params`, the settings that differ from it)."""
    mine = _flat({k: v for k, v in params.items() if k not in NOT_RECIPE})
    best: tuple[str, dict[str, Any]] | None = None
    for name in presets.presets():
        base = _flat(presets.preset_params(name))
        diff = {k: v for k, v in mine.items() if base.get(k, object()) != v}
        if best is None or len(diff) < len(best[1]):
            best = (name, diff)
    return best or ("none", mine)


def _scores(lineage: dict[str, Any]) -> list[dict[str, Any]]:
    """The scored runs of an evaluate metrics file: one flat record, or one per tag."""
    if "bleu" in lineage:
        return [lineage]
    return [dict(v, tag=k) for k, v in lineage.items() if isinstance(v, dict) and "bleu" in v]


def front_matter(params: dict[str, Any], manifest: dict[str, Any] | None, runs: list) -> str:
    dl = params.get("download") or {}
    langs = [dl.get("src_lang", "en"), dl.get("tgt_lang", "de")]
    source = (manifest or {}).get("source") or dl.get("source", "unknown")
    dataset = dl.get("hf_path") if source == "hf" else source
    meta = {
        "language": langs,
        "license": LICENSE,
        "library_name": "transformers",
        "pipeline_tag": "translation",
        "tags": ["translation", "marian", "transformer", f"{langs[0]}-{langs[1]}"],
        "datasets": [dataset],
        "metrics": ["bleu", "chrf"],
        "model-index": [
            {
                "name": f"transformer-{langs[0]}-{langs[1]}",
                "results": [
                    {
                        "task": {"type": "translation", "name": f"{langs[0]}-{langs[1]}"},
                        "dataset": {"type": dataset, "name": dataset, "split": r.get("split")},
                        "metrics": [
                            {"type": "bleu", "value": r["bleu"], "name": "BLEU"},
                            {"type": "chrf", "value": r.get("chrf"), "name": "chrF"},
                        ],
                    }
                    for r in runs
                ],
            }
        ],
    }
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n"


def _data(manifest: dict[str, Any] | None, dl: dict[str, Any]) -> list[str]:
    if not manifest:
        return ["The download manifest was not given to the package stage: no counts."]
    crawl = "crawl filters (wrong language / copy / script)"
    rows = [
        f"| split / part | pairs read | pairs kept | {crawl} | files (sha256) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for split, s in (manifest.get("splits") or {}).items():
        files = ", ".join(f"{n} `{f['sha256'][:12]}`" for n, f in (s.get("files") or {}).items())
        rows.append(f"| {split} | {s.get('read')} | {s.get('kept')} | {_crawl(s)} | {files} |")
        for name, part in (s.get("parts") or {}).items():
            rows.append(
                f"| {split}: {name} | {part.get('read')} | {part.get('kept')} | {_crawl(part)} | |"
            )
    src = manifest.get("source", dl.get("source"))
    where = f" (`{dl.get('hf_path')}` {dl.get('hf_name')})" if src == "hf" else ""
    head = f"Source: `{src}`{where}; references cleaned: {manifest.get('eval_cleanup')}."
    return [head, "", *rows]


def _crawl(counts: dict[str, Any]) -> str:
    """The crawl filters' counts: pairs dropped (train) or only flagged (valid / test)."""
    keys = ("wrong_language", "copy", "script")
    if counts.get("flagged"):
        return "flagged, kept: " + " / ".join(str(counts["flagged"].get(k, 0)) for k in keys)
    dropped = counts.get("dropped") or {}
    return " / ".join(str(dropped.get(k, 0)) for k in keys)


def model_card(
    lineage: dict[str, Any],
    params: dict[str, Any],
    manifest: dict[str, Any] | None,
    trained: dict[str, Any],
    revision: str,
    curves: bool = False,
) -> str:
    """README.md's text. `lineage`: the package's lineage.json; `trained`: the checkpoint's
    step and train_seconds; `revision`: the code's git commit; `curves`: the package holds
    CURVES, the training curves, which the card shows."""
    dl, model = (params.get(k) or {} for k in ("download", "model"))
    runs = _scores(lineage)
    preset, over = recipe(params)
    src, tgt = dl.get("src_lang", "en"), dl.get("tgt_lang", "de")
    lin = lineage.get("lineage") or next((r.get("lineage") for r in runs if "lineage" in r), {})
    parent = lineage.get("parent") or {}
    hours = float(trained.get("train_seconds", 0.0)) / 3600
    n_dec = model.get("n_decoder_layers") or model.get("n_layers")
    d_ff = f"d_ff {model.get('d_ff')}"
    if model.get("d_ff_decoder") and model["d_ff_decoder"] != model.get("d_ff"):
        d_ff += f" (decoder {model['d_ff_decoder']})"
    lines = [
        front_matter(params, manifest, runs),
        f"# Transformer {src}→{tgt}",
        "",
        (
            f'The Transformer of "Attention Is All You Need" (post-LN, d_model {model.get("d_model")}'
            f", {model.get('n_layers')}+{n_dec} layers, {model.get('n_heads')} heads,"
            f" {d_ff}, one shared {params.get('tokenizer', {}).get('type')} "
            f"vocabulary of {params.get('tokenizer', {}).get('vocab_size')} units), trained and "
            "packaged by this project's pipeline. How to serve it: docs/export.md."
        ),
        "",
        "## Scores",
        "",
        "| split | beam | α (GNMT) | BLEU | chrF | sacreBLEU signature |",
        "| --- | --- | --- | --- | --- | --- |",
        *(
            f"| {r.get('split')} | {r.get('beam_size')} | {r.get('length_penalty')} | "
            f"{r['bleu']} | {r.get('chrf')} | {_code(r.get('bleu_signature'))} / "
            f"{_code(r.get('chrf_signature'))} |"
            for r in runs
        ),
        "",
        *_distilled(lineage.get("race")),
        *_curves(curves),
        "## Data",
        "",
        *_data(manifest, dl),
        "",
        *_scoring(lineage.get("score")),
        "## Recipe",
        "",
        f"Preset `{preset}`"
        + (" with: " + ", ".join(f"`{k}={v}`" for k, v in over.items()) if over else " as is")
        + ". The full settings are the package's params.yaml.",
        "",
        "## Lineage and training",
        "",
        f"- code revision: `{revision}`",
        (
            f"- model sha256: `{lin.get('model_sha256')}`; tokenizer sha256: "
            f"`{lin.get('tokenizer_sha256')}`; test set sha256: `{runs[0].get('set_sha256')}`"
        ),
        f"- averaged checkpoints: steps {lin.get('averaged_steps')}",
        f"- parent: {_parent(parent)}",
        f"- other lines' champions used: {_helpers(lineage.get('helpers'))}",
        f"- training: {trained.get('step')} updates, {hours:.2f} h",
        f"- Hardware: {hardware.text(lineage.get(hardware.KEY))}",
        "",
        "## Limits",
        "",
        (
            f"- One direction ({src}→{tgt}), one sentence per input; longer inputs than "
            f"{model.get('max_positions')} tokens are cut."
        ),
        (
            f"- Trained on `{dl.get('source')}` data only: text unlike it (other domains, styles, "
            "very long sentences) translates worse, and the scores above say nothing about it."
        ),
        (
            "- Hugging Face's and CTranslate2's beam searches normalise by length^α, not GNMT's "
            "((5+len)/6)^α used for the scores above: their beam outputs can differ slightly "
            "(greedy outputs are the same; docs/export.md)."
        ),
        "",
    ]
    return "\n".join(lines)


def _distilled(raced: dict[str, Any] | None) -> list[str]:
    """A student's section: its teacher and version, the BLEU gap and the speed-up as the race
    stage measured them (the same machine and run, one thread, each as it is served)."""
    if not raced or not raced.get("teacher"):
        return []
    t, s = raced["teacher"], raced["student"]

    def how(x: dict[str, Any]) -> str:
        search = "greedy" if x.get("beam_size") == 1 else f"beam {x.get('beam_size')}"
        return f"{search}, {x.get('precision')}"

    return [
        "## Distilled from its teacher",
        "",
        (
            f"A student (sequence-level knowledge distillation, Kim & Rush 2016): trained on the "
            f"translations of its train sources by its teacher, line `{t.get('line')}` version "
            f"`{t.get('version')}` (model sha256 `{t.get('model_sha256')}`)."
        ),
        "",
        "| model | search | BLEU | sentences/s (1 thread) |",
        "| --- | --- | --- | --- |",
        f"| student | {how(s)} | {s.get('bleu')} | {s.get('sentences_per_second')} |",
        f"| teacher | {how(t)} | {t.get('bleu')} | {t.get('sentences_per_second')} |",
        "",
        (
            f"BLEU gap {raced.get('bleu_gap')} below the teacher, {raced.get('speedup')}x its "
            f"speed: {raced.get('split')} ({raced.get('sentences')} sentences), both on this "
            f"machine in the same run, {raced.get('threads')} thread, fastest of "
            f"{raced.get('rounds')} rounds each."
        ),
        "",
    ]


def _curves(shown: bool) -> list[str]:
    """The card's training curves section: the picture, a relative link (Hugging Face shows it
    from the model's repository, as any Markdown viewer does from the folder)."""
    if not shown:
        return []
    return [
        "## Training curves",
        "",
        f"![train and valid loss, valid BLEU and chrF against the update step]({CURVES})",
        "",
        (
            "Drawn from the run's dvclive metrics by the same definitions as `dvc plots show` "
            "(dvc.yaml's `plots`)."
        ),
        "",
    ]


def _code(text: Any) -> str:
    """`text` as code in a table cell: its pipes escaped, or they would split the cell."""
    return "`" + str(text).replace("|", "\\|") + "`"


def _parent(parent: dict[str, Any]) -> str:
    if parent.get("mode") != "continue":
        return "none (trained from scratch)"
    fields = ("version", "model_sha256", "step", "bleu", "chain")
    return ", ".join(f"{k} `{parent[k]}`" for k in fields if k in parent)


def _helpers(used: dict[str, Any] | None) -> str:
    """The champions of other lines the run used (the helpers stage's record), with versions."""
    out = []
    for role, u in (used or {}).items():
        for text in roles.describe({role: u}):
            sha = u.get("model_sha256")
            out.append(f"{text} (model sha256 `{sha}`)" if sha else text)
    return "; ".join(out) or "none"


def _scoring(scored: dict[str, Any] | None) -> list[str]:
    """What scoring the corpus with other lines' models dropped (the score stage's record)."""
    if not scored:
        return []
    if not scored.get("scored"):
        return [f"Train pairs not scored: {scored.get('why')}.", ""]
    parts = "; ".join(
        f"{name}: {p.get('dropped')} of {p.get('read')}"
        for name, p in (scored.get("parts") or {}).items()
        if p.get("scored")
    )
    return [
        (
            f"Train pairs scored by {scored.get('method')}: {scored.get('dropped')} of "
            f"{scored.get('read')} dropped ({parts}); the highest costs are listed in the "
            "run's worst-pairs TSV."
        ),
        "",
    ]
