"""What back-translation buys, measured the standard way (issue 81): Multi30k's training pairs split
in halves, A (lines 1-14500) and B (14501-29000), English -> German.

    python -m benchmarks.quality.bt_halves WORKDIR [--minutes 10] [--helper-minutes 10]
        [--seed 1] [--resamples 1000] [--runs ...]

One after the other, each in a fresh clone of this checkout's HEAD with `dvc repro` as `make
multi30k` runs it (jemalloc preloaded where installed), the 20-minute settings of docs/results.md
at `--minutes` each:

- helper-de-en-a: German -> English on A alone (presets/multi30k-de-en-a.yaml), the backward
  model, `--helper-minutes`;
- a: English -> German on A alone (presets/multi30k-en-de-bt.yaml without its monolingual part);
- bt-beam: A plus B's German back-translated by helper-de-en-a with beam search, tagged `<BT>`
  (presets/multi30k-en-de-bt.yaml as shipped);
- bt-sample: the same with `backtranslate.search: sample` (Edunov et al. 2018);
- ab: A plus B, both real (the most B's German can give).

B's English is never read by the bt runs. valid and test are Multi30k's, untouched. Reports test
BLEU (sacreBLEU, and the Multi30k literature's lowercased Moses-tokenized BLEU), sacreBLEU's
paired bootstrap against `a`, the share of the gap each bt run recovers, `(bt - a) / (ab - a)`
(issue 81 asks for >= 0.5), the back-translation speed (pairs per second) and the helper's
training time; writes WORKDIR/results.{json,md}. A run whose evaluate metrics exist is not
trained again (delete WORKDIR/NAME to redo it). Time it on an otherwise idle machine: the load
average before and after each run is recorded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.quality import noise_clean as nc
from benchmarks.quality.noise_score import with_helpers
from benchmarks.quality.pool import share
from flows.significance import paired_bs

RUNS = ("helper-de-en-a", "a", "bt-beam", "bt-sample", "ab")
PIN = "multi30k-de-en-a@v1.0.0"  # a label: the helper's package is copied, no registry
M30K = nc.DATA / "multi30k"
MONO_LINES = "14501-29000"  # B's German


def params_for(
    run: str, minutes: float, seed: int, mono_lines: str = MONO_LINES
) -> tuple[str, dict]:
    """The run's preset and dotted overrides (absolute data paths: the clone does not sit beside
    ../shared)."""
    lines = "1-29000" if run == "ab" else "1-14500"
    flat: dict[str, object] = {
        **nc.SHORT,
        "train.time_budget_minutes": minutes,
        "train.seed": seed,
        "download.splits": {
            "train": [
                {"path": str(M30K / "train.{lang}"), "name": "multi30k-train-a", "lines": lines}
            ],
            "valid": [{"path": str(M30K / "val.{lang}"), "name": "multi30k-val"}],
            "test": [
                {"path": str(M30K / "test_2016_flickr.{lang}"), "name": "multi30k-test2016-flickr"}
            ],
        },
    }
    if run == "helper-de-en-a":
        return "multi30k-de-en-a", flat
    if run in ("a", "ab"):  # no monolingual part, no tag: the preset's plain English -> German
        flat.update({"download.monolingual": [], "backtranslate.tag": ""})
        return "multi30k-en-de-bt", flat
    mono = {
        "path": str(M30K / "train.{lang}"),
        "name": "multi30k-train-b-de",
        "lines": mono_lines,
    }
    # the preset scores nothing (score.drop_fraction 0): A is the same pairs in every run
    flat.update({"download.monolingual": [mono], "helpers.backward": PIN})
    if run == "bt-sample":
        flat["backtranslate.search"] = "sample"
    return "multi30k-en-de-bt", flat


def report(work: Path, records: dict, resamples: int) -> dict:
    refs = nc.read(M30K / "test_2016_flickr.de")
    result: dict = {"runs": records}
    hyps = {}
    for r, rec in records.items():
        files = nc.outputs(work / r)
        ev = json.loads(files["evaluate"].read_text())
        live = json.loads(files["live"].read_text())
        manifest = json.loads(files["manifest"].read_text())
        rec.update(
            bleu=round(ev["bleu"], 2),
            bleu_moses_lc=ev.get("bleu_moses_lc"),
            chrf=round(ev["chrf"], 2),
            steps=live.get("step"),
            train_pairs=manifest["splits"]["train"]["kept"],
        )
        if r.startswith("bt"):
            rec["backtranslate"] = json.loads(files["backtranslate"].read_text())
        if r == "helper-de-en-a":  # German -> English: not compared with the others
            continue
        shard = json.loads(files["shard"].read_text())
        if shard.get("synthetic"):
            rec["synthetic"] = shard["synthetic"]
        hyps[r] = nc.read(files["eval"] / "hyps.test.txt")
    for r in (x for x in hyps if x != "a"):
        if "a" in hyps:
            result[f"{r}_vs_a"] = paired_bs(refs, hyps["a"], hyps[r], "de", resamples, 12345)
    b = {r: x["bleu"] for r, x in records.items()}
    if {"a", "ab"} <= set(b) and b["ab"] != b["a"]:
        for r in ("bt-beam", "bt-sample"):
            if r in b:
                records[r]["recovered_of_gap"] = share(b["a"], b[r], b["ab"])
    return result


def markdown(result: dict) -> str:
    lines = [
        "| run | updates | train pairs | test BLEU | Moses lc BLEU | chrF | `dvc repro` s | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r, x in result["runs"].items():
        lines.append(
            f"| {r} | {x.get('steps')} | {x.get('train_pairs')} | {x.get('bleu')} "
            f"| {x.get('bleu_moses_lc')} | {x.get('chrf')} | {x.get('seconds')} "
            f"| {x.get('load_before'):.2f} / {x.get('load_after'):.2f} |"
        )
    lines += nc.comparisons(result, "_vs_a")
    for r, x in result["runs"].items():
        if "recovered_of_gap" in x:
            lines.append(
                f"\n{r}: share of the gap between a and ab recovered: {x['recovered_of_gap']}"
            )
        if "backtranslate" in x:
            lines.append(f"{r}: backtranslate metrics: {json.dumps(x['backtranslate'])}")
        if "synthetic" in x:
            lines.append(f"{r}: synthetic pairs mixed: {json.dumps(x['synthetic'])}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.bt_halves",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--minutes", type=float, default=10, help="each en-de run's training budget")
    ap.add_argument("--helper-minutes", type=float, default=10, help="helper-de-en-a's budget")
    ap.add_argument("--seed", type=int, default=1, help="train.seed")
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    ap.add_argument("--resamples", type=int, default=1000, help="paired bootstrap resamples")
    ap.add_argument(
        "--mono-lines", default=MONO_LINES, help="the lines of B back-translated (a quick check)"
    )
    args = ap.parse_args(argv)
    if not M30K.is_dir():
        raise SystemExit(f"error: {M30K} not found (../shared beside the checkout)")
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    state = work / "runs.json"
    records = json.loads(state.read_text()) if state.exists() else {}
    for run in args.runs:
        if run in records and nc.outputs(work / run)["evaluate"].exists():
            continue
        if run.startswith("bt"):
            with_helpers(work, run, {"backward": "helper-de-en-a"})
        minutes = args.helper_minutes if run == "helper-de-en-a" else args.minutes
        print(f"{run}: training ({minutes} min) in {work / run}", flush=True)
        preset, flat = params_for(run, minutes, args.seed, args.mono_lines)
        records[run] = nc.train(work, run, flat, preset)
        state.write_text(json.dumps(records, indent=1))
    records = {r: records[r] for r in RUNS if r in records}
    result = report(work, records, args.resamples)
    (work / "results.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (work / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
