"""A distilled student against its teacher (issue 82): quality and speed, one run after the other.

    python -m benchmarks.quality.student WORKDIR [--teacher-preset demo]
        [--student-preset demo-student] [--set KEY=VALUE ...] [--minutes M] [--multi30k]
        [--resamples 1000]

Each model in a fresh clone of this checkout's HEAD under WORKDIR/NAME, with `dvc repro` as
`make demo` or `make multi30k` run it (jemalloc preloaded where installed):

- teacher: `--teacher-preset` (demo: the demo line's recipe, presets/demo.yaml);
- student: `--student-preset` (demo-student), its data the teacher's translations of the train
  sources: the teacher's package is placed in data/helpers/teacher, as the retrain flow's fetch
  places the pinned champion, and the run's own distill and race stages do the rest.

`--minutes M` gives both runs train.time_budget_minutes M (the issue's Multi30k protocol: the
teacher the preset's 60 minutes, the student at most as long); without it each preset's own
budget. `--set KEY=VALUE` (repeatable, VALUE as JSON where it parses, as `flows.run -p`)
changes the student's shape or settings over its preset: another shape in another WORKDIR, with
a copy of the first one's teacher/ and its runs.json entry, trains the student alone.
`--multi30k`: the Multi30k splits by absolute paths (a clone does not sit beside ../shared).
Reports, on the evaluate split: each model's BLEU and the paired bootstrap of the student
against the teacher; the race stage's figures (ours, one thread, each with its served
settings, the fastest of distill.rounds turns: the gate's speed-up); and each package through
benchmarks/cpu/export_bench.py (ours fp32/int8, CTranslate2 float32/int8, one thread, each
with its shipped beam). Writes WORKDIR/results.{json,md}. A run whose evaluate metrics exist is
not trained again (delete WORKDIR/NAME to redo it). Time it on an otherwise idle machine: the
load average before and after each step is recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from benchmarks.quality import noise_clean as nc
from benchmarks.quality.noise_score import package, with_helpers
from flows.run import parameter
from flows.significance import paired_bs

M30K = nc.DATA / "multi30k"


def overrides(minutes: float | None, multi30k: bool) -> dict[str, object]:
    flat: dict[str, object] = {}
    if minutes is not None:
        flat["train.time_budget_minutes"] = minutes
    if multi30k:
        flat["download.splits"] = {
            "train": [{"path": str(M30K / "train.{lang}"), "name": "multi30k-train"}],
            "valid": [{"path": str(M30K / "val.{lang}"), "name": "multi30k-val"}],
            "test": [
                {"path": str(M30K / "test_2016_flickr.{lang}"), "name": "multi30k-test2016-flickr"}
            ],
        }
    return flat


def served(pkg: Path, raw: Path, split: str, src: str, tgt: str, out: Path) -> list[dict]:
    """export_bench's rows for package `pkg` (one thread, its shipped beam and α)."""
    cmd = [sys.executable, "-m", "benchmarks.cpu.export_bench", str(pkg)]
    cmd += [str(raw / f"{split}.{src}"), str(raw / f"{split}.{tgt}"), "--threads", "1"]
    subprocess.run([*cmd, "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
    shipped = yaml.safe_load((pkg / "params.yaml").read_text())["decode"]
    alpha = shipped.get("length_penalty", 0.6)
    return [r for r in json.loads(out.read_text()) if r["alpha"] == alpha]


def report(work: Path, records: dict, resamples: int) -> dict:
    files = {r: nc.outputs(work / r) for r in ("teacher", "student")}
    ev = {r: json.loads(f["evaluate"].read_text()) for r, f in files.items()}
    race = json.loads(files["student"]["race"].read_text())
    dl = yaml.safe_load((work / "student" / "params.yaml").read_text())["download"]
    split, src_lang, lang = race["split"], dl["src_lang"], dl["tgt_lang"]
    raw = files["student"]["raw"]
    refs = nc.read(raw / f"{split}.{lang}")
    hyps = {r: nc.read(f["eval"] / f"hyps.{split}.txt") for r, f in files.items()}
    result: dict = {"runs": records, "split": split, "race": race}
    for r in files:
        live = json.loads(files[r]["live"].read_text())
        records[r].update(bleu=round(ev[r]["bleu"], 2), steps=live.get("step"))
    result["student_vs_teacher"] = paired_bs(
        refs, hyps["teacher"], hyps["student"], lang, resamples, 12345
    )
    for r in files:
        rows = served(package(work / r), raw, split, src_lang, lang, work / f"{r}.export.json")
        records[r]["served"] = {x["system"]: x["sentences_per_s"] for x in rows}
        records[r]["served_bleu"] = {x["system"]: x["bleu"] for x in rows}
    return result


def markdown(result: dict) -> str:
    runs, race = result["runs"], result["race"]
    systems = list(runs["teacher"]["served"])
    head = " | ".join(f"{s} sent/s" for s in systems)
    lines = [
        f"| model | updates | BLEU ({result['split']}) | {head} | `dvc repro` s | load |",
        "|---|---|---|" + "---|" * len(systems) + "---|---|",
    ]
    for r in ("teacher", "student"):
        x = runs[r]
        speeds = " | ".join(str(x["served"][s]) for s in systems)
        lines.append(
            f"| {r} | {x.get('steps')} | {x.get('bleu')} | {speeds} | {x.get('seconds')} "
            f"| {x['load_before']:.2f} / {x['load_after']:.2f} |"
        )
    t, s = runs["teacher"]["served"], runs["student"]["served"]
    ratios = ", ".join(f"{k} {s[k] / t[k]:.2f}x" for k in systems)
    lines += [
        "",
        f"Student / teacher speed, each through the same system: {ratios}.",
        (
            f"Student (ours fp32) / teacher through CTranslate2 float32: "
            f"{s['ours fp32'] / t['CTranslate2 float32']:.2f}x."
        ),
        "",
        (
            f"The race stage (the gate's figures, one thread, each as served, fastest of "
            f"{race.get('rounds')}): student {race['student']['sentences_per_second']} sent/s, "
            f"teacher {race['teacher']['sentences_per_second']}: {race['speedup']}x, BLEU gap "
            f"{race['bleu_gap']}."
        ),
        *nc.comparisons({"student_vs_teacher": result["student_vs_teacher"]}, "_vs_teacher"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.student",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--teacher-preset", default="demo")
    ap.add_argument("--student-preset", default="demo-student")
    ap.add_argument("--minutes", type=float, help="both runs' train.time_budget_minutes")
    ap.add_argument(
        "--set",
        type=parameter,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a student override",
    )
    ap.add_argument("--multi30k", action="store_true", help="Multi30k's splits, absolute paths")
    ap.add_argument("--resamples", type=int, default=1000, help="paired bootstrap resamples")
    args = ap.parse_args(argv)
    if args.multi30k and not M30K.is_dir():
        raise SystemExit(f"error: {M30K} not found (../shared beside the checkout)")
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    state = work / "runs.json"
    records = json.loads(state.read_text()) if state.exists() else {}
    flat = overrides(args.minutes, args.multi30k)
    pin = f"{args.teacher_preset}@v1.0.0"  # a label: the teacher's package is copied, no registry
    for run, preset in (("teacher", args.teacher_preset), ("student", args.student_preset)):
        if run in records and nc.outputs(work / run)["evaluate"].exists():
            continue
        extra = {}
        if run == "student":
            with_helpers(work, run, {"teacher": "teacher"})
            extra["helpers.teacher"] = pin
            extra.update(args.set)
        print(f"{run}: training ({preset}) in {work / run}", flush=True)
        records[run] = nc.train(work, run, {**flat, **extra}, preset)
        state.write_text(json.dumps(records, indent=1))
    before = nc.load_avg()
    result = report(work, records, args.resamples)
    result["served_load"] = [before, nc.load_avg()]
    (work / "results.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (work / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
