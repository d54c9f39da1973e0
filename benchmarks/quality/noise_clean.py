"""What the crawl filters buy in BLEU: Multi30k with crawl-like noise, trained with and without them.

    python -m benchmarks.quality.noise_clean WORKDIR [--rate 0.2] [--minutes 20] [--seed 1]
        [--runs clean noisy filtered oracle] [--resamples 1000]

Replaces `--rate` of Multi30k's train pairs (../shared/data/multi30k) with noise of four kinds in
equal parts (`KINDS`), written to WORKDIR/corpus/train.{en,de} with WORKDIR/corpus/noise.tsv (line,
kind). Then trains the multi30k-en-de preset with docs/results.md's 20-minute settings four
times, each in a fresh clone of this checkout's HEAD under WORKDIR/NAME, with `dvc repro` as
`make multi30k` runs it (jemalloc preloaded where installed), one after the other:

- clean: Multi30k as released;
- noisy: the noisy train files, today's clean-up (the preset's);
- filtered: the noisy train files with `download.clean` langid, copies and script on;
- oracle: the untouched pairs alone (corpus/oracle/): what a perfect filter would keep,
  the most any filter can win back.

valid and test are Multi30k's, untouched, in every run. Reports test BLEU and chrF with sacreBLEU's
paired bootstrap (noisy the baseline), the share of the noise's BLEU loss that the filters win back
(of the clean run's loss, and of what the oracle wins back), which injected pairs each run's
download stage kept (per kind) and what it removed of the clean pairs; writes
WORKDIR/results.{json,md}. A run whose evaluate metrics exist is not trained again (delete
WORKDIR/NAME to redo it). Time it on an otherwise idle machine: the load average before and after
each run is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks.common import JEMALLOC, ROOT, SHARED
from benchmarks.quality.multi30k_sweep import overrides_to_tree
from benchmarks.quality.pool import share
from flows.significance import paired_bs
from transformer.core.presets import merge
from transformer.core.sections.download import CleanConfig
from transformer.data.clean import normalize

DATA = SHARED / "data"
KINDS = ("french", "wmt", "copy", "misaligned")
# the 20-minute settings of docs/results.md ("Multi30k, 20 minutes")
SHORT = {
    "model.dropout": 0.1,
    "model.activation_dropout": 0.0,
    "model.attention_dropout": 0.0,
    "train.save_every_minutes": 1,
    "average.last_k": 5,
}
FILTERS = {
    "download.clean.langid": True,
    "download.clean.copies": True,
    "download.clean.script": True,
}
RUNS = ("clean", "noisy", "filtered", "oracle")


def read(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def build(out: Path, rate: float, seed: int, data: Path = DATA) -> dict[str, int]:
    """Write out/train.{en,de}: Multi30k's train with `rate` of its pairs replaced by noise, the
    kinds in equal parts on distinct lines drawn with `seed`, and out/noise.tsv. Returns the
    count per kind.

    french: the German side replaced by the pair's own French (Multi30k's train.fr);
    wmt: the German side replaced by an English line of wmt-sample (crawled news, unrelated);
    copy: the German side a copy of the English;
    misaligned: the German sides of these pairs shuffled among themselves (a derangement).
    """
    m30k = data / "multi30k"
    en, de, fr = (read(m30k / f"train.{lang}") for lang in ("en", "de", "fr"))
    wmt = [line for line in read(data / "wmt-sample" / "train.tok.en") if len(line.split()) >= 3]
    if not len(en) == len(de) == len(fr):
        raise SystemExit(f"error: {m30k}: train.en/de/fr differ in length")
    rng = random.Random(seed)
    picked = rng.sample(range(len(en)), round(rate * len(en)))
    per = len(picked) // len(KINDS)
    groups = {k: sorted(picked[i * per : (i + 1) * per]) for i, k in enumerate(KINDS)}
    noisy = list(de)
    for i in groups["french"]:
        noisy[i] = fr[i]
    for i, line in zip(groups["wmt"], rng.sample(wmt, len(groups["wmt"]))):
        noisy[i] = line
    for i in groups["copy"]:
        noisy[i] = en[i]
    mis = groups["misaligned"]
    for i, j in zip(mis, mis[1:] + mis[:1]):  # a rotation: no line keeps its own target
        noisy[i] = de[j]
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.en").write_text("".join(s + "\n" for s in en), encoding="utf-8")
    (out / "train.de").write_text("".join(s + "\n" for s in noisy), encoding="utf-8")
    rows = sorted((i, k) for k, idx in groups.items() for i in idx)
    (out / "noise.tsv").write_text("".join(f"{i + 1}\t{k}\n" for i, k in rows), encoding="utf-8")
    noise = {i for i, _ in rows}  # oracle/: the untouched pairs alone, what a perfect filter keeps
    (out / "oracle").mkdir(exist_ok=True)
    for lang, side in (("en", en), ("de", de)):
        text = "".join(x + "\n" for i, x in enumerate(side) if i not in noise)
        (out / "oracle" / f"train.{lang}").write_text(text, encoding="utf-8")
    return {k: len(v) for k, v in groups.items()}


def params_for(run: str, corpus: Path, minutes: float, seed: int) -> dict[str, object]:
    """The dotted overrides of one run over the multi30k-en-de preset (absolute data paths: the
    run's clone does not sit beside ../shared)."""
    m30k = DATA / "multi30k"
    train = {"clean": m30k, "oracle": corpus / "oracle"}.get(run, corpus) / "train.{lang}"
    flat: dict[str, object] = {
        **SHORT,
        "train.time_budget_minutes": minutes,
        "train.seed": seed,
        "download.splits": {
            "train": [{"path": str(train), "name": f"multi30k-train-{run}"}],
            "valid": [{"path": str(m30k / "val.{lang}"), "name": "multi30k-val"}],
            "test": [
                {"path": str(m30k / "test_2016_flickr.{lang}"), "name": "multi30k-test2016-flickr"}
            ],
        },
    }
    if run == "filtered":
        flat.update(FILTERS)
    return flat


def load_avg() -> float:
    return os.getloadavg()[0]


def train(
    work: Path, run: str, overrides: dict[str, object], preset: str = "multi30k-en-de"
) -> dict:
    """Clone, write the preset with the overrides, `dvc repro`; the run's record."""
    proj = work / run
    py = sys.executable
    if not proj.exists():
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(proj)], check=True)
    subprocess.run([py, "-m", "transformer.config", "preset", preset], cwd=proj, check=True)
    params = yaml.safe_load((proj / "params.yaml").read_text())
    params = merge(params, overrides_to_tree(overrides))
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run([py, "-m", "transformer.config", "check"], cwd=proj, check=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PATH"] = f"{Path(py).parent}{os.pathsep}{env['PATH']}"
    if JEMALLOC:
        env["LD_PRELOAD"] = str(JEMALLOC)
    before, t0 = load_avg(), time.monotonic()
    with open(work / f"{run}.log", "a") as log:
        subprocess.run(
            ["dvc", "repro"], cwd=proj, env=env, stdout=log, stderr=subprocess.STDOUT, check=True
        )
    return {
        "seconds": round(time.monotonic() - t0),
        "load_before": before,
        "load_after": load_avg(),
    }


def outputs(proj: Path) -> dict[str, Path]:
    """The run's files, by the paths dvc.yaml names."""
    stages = yaml.safe_load((proj / "dvc.yaml").read_text())["stages"]

    def first(stage: str, key: str) -> Path:
        item = stages[stage][key][0]
        return proj / (item if isinstance(item, str) else next(iter(item)))

    return {
        "raw": first("download", "outs"),
        "manifest": first("download", "metrics"),
        "eval": first("evaluate", "outs"),
        "evaluate": first("evaluate", "metrics"),
        "live": first("train", "metrics"),
        # (a clone made before a stage existed lacks it)
        **{
            stage: first(stage, "metrics")
            for stage in ("score", "backtranslate", "shard", "distill", "race")
            if stage in stages
        },
    }


def kept(raw: Path, corpus: Path, data: Path = DATA) -> dict[str, dict[str, int]]:
    """Of each injected kind (and of the untouched pairs): how many the download stage kept."""
    pairs = set(zip(read(raw / "train.en"), read(raw / "train.de")))
    cc = CleanConfig()  # the stage writes normalised text: compare like with like
    en, de = ([normalize(x, cc) for x in read(corpus / f"train.{s}")] for s in ("en", "de"))
    kind = {int(i) - 1: k for i, k in (r.split("\t") for r in read(corpus / "noise.tsv"))}
    out: dict[str, dict[str, int]] = {}
    for i, pair in enumerate(zip(en, de)):
        row = out.setdefault(kind.get(i, "clean pairs"), {"injected": 0, "kept": 0})
        row["injected"] += 1
        row["kept"] += pair in pairs
    return out


def report(work: Path, corpus: Path, records: dict[str, dict], resamples: int) -> dict:
    refs = read(DATA / "multi30k" / "test_2016_flickr.de")
    hyps: dict[str, list[str]] = {}
    result: dict = {"runs": records}
    for r, rec in records.items():
        files = outputs(work / r)
        hyps[r] = read(files["eval"] / "hyps.test.txt")
        ev = json.loads(files["evaluate"].read_text())
        live = json.loads(files["live"].read_text())
        manifest = json.loads(files["manifest"].read_text())
        rec.update(
            bleu=round(ev["bleu"], 2),
            chrf=round(ev["chrf"], 2),
            steps=live.get("step"),
            train_pairs=manifest["splits"]["train"]["kept"],
        )
        if r in ("noisy", "filtered"):
            rec["kept"] = kept(files["raw"], corpus)
    if "noisy" in hyps:
        for r in (x for x in hyps if x != "noisy"):
            result[f"{r}_vs_noisy"] = paired_bs(
                refs, hyps["noisy"], hyps[r], "de", resamples, 12345
            )
    if {"clean", "noisy", "filtered"} <= set(records):
        b = {r: records[r]["bleu"] for r in records}
        lost = b["clean"] - b["noisy"]
        result["recovered"] = round((b["filtered"] - b["noisy"]) / lost, 3) if lost else None
        if (share := share_of_oracle(b, "filtered")) is not None:
            result["recovered_of_oracle"] = share
    return result


def share_of_oracle(bleu: dict[str, float], run: str) -> float | None:
    """What `run` wins back over noisy, as a share of what a perfect filter (the oracle) wins
    back; None without both runs or where the oracle won nothing."""
    if not {"noisy", "oracle"} <= set(bleu):
        return None
    return share(bleu["noisy"], bleu[run], bleu["oracle"])


def comparisons(result: dict, suffix: str) -> list[str]:
    """A line per paired bootstrap in `result` (its keys ending in `suffix`)."""
    return [
        f"\n{key}: BLEU {t['champion_bleu']} ± {t['champion_bleu_ci']} -> {t['bleu']} ± "
        f"{t['bleu_ci']} (delta {t['bleu_delta']:+.2f}, p = {t['p']}); chrF delta "
        f"{t['chrf_delta']:+.2f} (p = {t['chrf_p']})"
        for key, t in result.items()
        if key.endswith(suffix)
    ]


def markdown(result: dict) -> str:
    runs = result["runs"]
    lines = [
        "| run | updates | train pairs | test BLEU | chrF | `dvc repro` s | load before / after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, x in runs.items():
        lines.append(
            f"| {r} | {x.get('steps')} | {x.get('train_pairs')} | {x.get('bleu')} | {x.get('chrf')} "
            f"| {x.get('seconds')} | {x.get('load_before'):.2f} / {x.get('load_after'):.2f} |"
        )
    lines += comparisons(result, "_vs_noisy")
    if "recovered" in result:
        lines.append(
            f"\nshare of the noise's BLEU loss recovered by the filters: {result['recovered']}"
        )
    if "recovered_of_oracle" in result:
        lines.append(
            "share of what a perfect filter (the untouched pairs alone) wins back: "
            f"{result['recovered_of_oracle']}"
        )
    for r, x in runs.items():
        if "kept" in x:
            kinds = ", ".join(f"{k} {v['kept']}/{v['injected']}" for k, v in x["kept"].items())
            lines.append(f"\n{r}: kept by the download stage: {kinds}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.noise_clean",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--rate", type=float, default=0.2, help="share of train pairs made noise")
    ap.add_argument("--minutes", type=float, default=20, help="each run's training time budget")
    ap.add_argument("--seed", type=int, default=1, help="train.seed (and the noise's draw)")
    ap.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    ap.add_argument("--resamples", type=int, default=1000, help="paired bootstrap resamples")
    args = ap.parse_args(argv)
    if not (DATA / "multi30k").is_dir():
        raise SystemExit(f"error: {DATA / 'multi30k'} not found (../shared beside the checkout)")
    work = args.workdir.resolve()
    corpus = work / "corpus"
    counts = build(corpus, args.rate, args.seed)
    print(f"noise: {counts} of {len(read(corpus / 'train.en'))} pairs -> {corpus}", flush=True)
    state = work / "runs.json"
    records = json.loads(state.read_text()) if state.exists() else {}
    for run in args.runs:
        if run in records and outputs(work / run)["evaluate"].exists():
            continue
        print(f"{run}: training ({args.minutes} min) in {work / run}", flush=True)
        records[run] = train(work, run, params_for(run, corpus, args.minutes, args.seed))
        state.write_text(json.dumps(records, indent=1))
    records = {r: records[r] for r in RUNS if r in records}
    result = report(work, corpus, records, args.resamples)
    (work / "results.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (work / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
