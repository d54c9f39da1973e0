"""Retrain from scratch or continue from the champion, when the data grows (Multi30k en-de).

    python -m benchmarks.quality.continue_bench WORKDIR [--minutes 12] [--continue-minutes 3]
        [--continue-steps N] [--patience N --valid-every STEPS --valid-bleu-sentences N]

A champion is trained on a share (`--share`, 0.8) of Multi30k's training pairs, drawn at random
(`--seed`); then the data grows to all of them, and two candidates are trained on it:

- scratch: a new tokenizer and a new model, for as long as the champion (`--minutes`);
- continued: `retrain.mode: continue`, the champion's tokenizer kept and its weights trained on
  for `--continue-minutes` (retrain.continuation's defaults: the champion's own rate schedule
  continued from its update count after a short re-warmup, a fresh Adam), ended early by
  `--patience` validations without a better valid BLEU (greedy, the first
  `--valid-bleu-sentences` of valid, every `--valid-every` updates); `--continue-minutes` is
  then a cap. `--patience 0`: the fixed budget alone.

Each is averaged and scored on test2016 as the pipeline does (the multi30k-en-de preset's
settings otherwise: model, batching, decoding). The stages run as their CLIs, as dvc.yaml runs
them, each with its own params.yaml under WORKDIR. The table goes to stdout and
WORKDIR/results.md; the valid loss against training wall time of the three runs is a DVC plot
(WORKDIR/dvc.yaml's top-level `plots`, rendered to WORKDIR/plots/index.html).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks.common import run_stage
from transformer.core import presets

PY = sys.executable
PLOTS_YAML = """plots:
  - valid_loss_vs_time:
      title: valid loss (label-smoothed, per target token) against training wall time
      x: seconds
      y:
        curves/champion.csv: valid_loss
        curves/scratch.csv: valid_loss
        curves/continued.csv: valid_loss
"""


def write_params(path: Path, params: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    presets.load_all(path)  # a bad setting fails here, naming the key
    return path


def grow(raw: Path, part: Path, share: float, seed: int, langs: tuple[str, str]) -> int:
    """part/: raw/ with only `share` of the training pairs (a random draw, order kept)."""
    part.mkdir(parents=True, exist_ok=True)
    for f in raw.iterdir():
        if f.is_file() and not f.name.startswith("train."):
            (part / f.name).write_bytes(f.read_bytes())
    lines = {lang: (raw / f"train.{lang}").read_text().splitlines(keepends=True) for lang in langs}
    n = len(lines[langs[0]])
    keep = sorted(random.Random(seed).sample(range(n), round(share * n)))
    for lang in langs:
        (part / f"train.{lang}").write_text("".join(lines[lang][i] for i in keep))
    return len(keep)


def train_run(name: str, work: Path, raw: Path, params: dict, parent: Path | None) -> dict:
    """tokenizer (or the parent's), shard, train, average, evaluate, package; the figures."""
    out = work / name
    done = out / "result.json"
    if done.exists():
        return json.loads(done.read_text())
    pfile, log = write_params(out / "params.yaml", params), out / "log.txt"
    p = ["--params", str(pfile)]
    tok, shards, ckpts, live = out / "tokenizer", out / "shards", out / "checkpoints", out / "live"
    model, metrics = out / "model.pt", out / "metrics"
    parent_args = ["--parent", str(parent)] if parent else []
    if parent:
        run_stage(
            [
                PY,
                "-m",
                "transformer.parent",
                str(parent),
                "--metrics",
                f"{metrics}/parent.json",
                *p,
            ],
            log,
        )
    run_stage([PY, "-m", "transformer.tokenizer", str(raw), str(tok), *parent_args, *p], log)
    run_stage(
        [
            PY,
            "-m",
            "transformer.shard",
            str(raw),
            str(tok),
            str(shards),
            "--metrics",
            f"{metrics}/shard.json",
            *p,
        ],
        log,
    )
    t0 = time.perf_counter()
    run_stage(
        [
            PY,
            "-m",
            "transformer.train",
            str(shards),
            str(tok),
            str(ckpts),
            "--live",
            str(live),
            "--no-progress",
            "--raw",
            str(raw),
            *parent_args,
            *p,
        ],
        log,
    )
    wall = time.perf_counter() - t0
    run_stage([PY, "-m", "transformer.average", str(ckpts), str(model), *p], log)
    run_stage(
        [
            PY,
            "-m",
            "transformer.evaluate",
            str(model),
            str(tok),
            str(raw),
            str(out / "eval"),
            "--metrics",
            f"{metrics}/evaluate.json",
            "--no-progress",
            *p,
        ],
        log,
    )
    pkg = out / "package"
    run_stage(
        [
            PY,
            "-m",
            "transformer.package",
            str(model),
            str(tok),
            f"{metrics}/evaluate.json",
            str(pkg),
            *(["--parent", f"{metrics}/parent.json"] if parent else []),
            *p,
        ],
        log,
    )
    ev = json.loads((metrics / "evaluate.json").read_text())
    lm = json.loads((live / "metrics.json").read_text())
    shard = json.loads((metrics / "shard.json").read_text())
    result = {
        "run": name,
        "bleu": ev["bleu"],
        "chrf": ev.get("chrf"),
        "steps": lm.get("step"),
        "train_seconds": lm.get("train", {}).get("seconds"),
        "stage_wall_s": round(wall, 1),
        "valid_loss": lm.get("valid", {}).get("loss"),
        "stopped": lm.get("stopped"),
        "stopped_at": lm.get("stopped_at"),
        "valid_bleu_share": lm.get("valid_bleu_share"),
        "oov_rate": shard["vocabulary"]["oov_rate"],
        "cpu_others": lm.get("train", {}).get("cpu_others"),
        "package": str(pkg),
    }
    curve(live, work / "curves" / f"{name}.csv")
    done.write_text(json.dumps(result, indent=1))
    return result


def curve(live: Path, out: Path) -> None:
    """seconds,valid_loss at each validation point that also logged the training time."""

    def tsv(name: str) -> dict[int, float]:
        path = live / "plots" / "metrics" / f"{name}.tsv"
        rows = [r.split("\t") for r in path.read_text().splitlines()[1:]] if path.exists() else []
        return {int(r[0]): float(r[1]) for r in rows}  # dvclive's columns: step, value

    seconds, loss = tsv("train/seconds"), tsv("valid/loss")
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ["seconds,valid_loss,step"] + [
        f"{seconds[s]:.1f},{loss[s]:.4f},{s}" for s in sorted(loss) if s in seconds
    ]
    out.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--minutes", type=float, default=12.0, help="champion and scratch training")
    parser.add_argument("--continue-minutes", type=float, default=3.0)
    parser.add_argument(
        "--continue-steps",
        type=int,
        default=0,
        help="the continuation's updates instead of --continue-minutes (a load-free budget)",
    )
    parser.add_argument("--share", type=float, default=0.8, help="the champion's share of train")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--lr-factor", type=float, help="retrain.continuation.lr_factor (default: its default)"
    )
    parser.add_argument(
        "--patience",
        type=int,
        help="retrain.continuation.patience (default: its default; 0: the fixed budget alone)",
    )
    parser.add_argument("--valid-every", type=int, default=25, help="the continuation's")
    parser.add_argument(
        "--valid-bleu-sentences", type=int, default=300, help="the first N of valid (0: all)"
    )
    args = parser.parse_args(argv)
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    base = presets.preset_params("multi30k-en-de")
    # sized for minutes on a shared 2-core CPU: the demo's model, one thread (OpenMP's second
    # thread costs more than it gives on busy cores), the 20-minute recipe's dropout and average
    base["model"].update(
        d_model=128, d_ff=512, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0
    )
    base["train"].update(
        time_budget_minutes=args.minutes,
        threads=1,
        warmup_steps=100,
        lr_scale=0.35,  # peak 128^-0.5 * 100^-0.5 * 0.35 = 3.1e-3, the demo's
        save_every_minutes=args.minutes / 12,
        valid_every_steps=50,
        log_every_steps=25,
        valid_bleu=False,  # the champion and scratch: the valid loss only, as before
    )
    base["average"]["last_k"] = 5
    langs = (base["download"]["src_lang"], base["download"]["tgt_lang"])
    raw = work / "raw"
    if not (raw / f"train.{langs[0]}").exists():
        run_stage(
            [
                PY,
                "-m",
                "transformer.download",
                str(raw),
                "--params",
                str(write_params(work / "download.yaml", base)),
            ],
            work / "log.txt",
        )
    n = grow(raw, work / "raw-part", args.share, args.seed, langs)
    print(f"champion's data: {n} pairs; grown: all of {raw}", flush=True)
    champion = train_run("champion", work, work / "raw-part", base, None)
    print(json.dumps(champion), flush=True)
    scratch = train_run("scratch", work, raw, base, None)
    print(json.dumps(scratch), flush=True)
    cont = json.loads(json.dumps(base))
    cont["retrain"].update(mode="continue", parent="champion")
    cont["retrain"]["continuation"] = {
        "max_steps": args.continue_steps,
        "time_budget_minutes": 0.0 if args.continue_steps else args.continue_minutes,
        **({"lr_factor": args.lr_factor} if args.lr_factor else {}),
        **({"patience": args.patience} if args.patience is not None else {}),
    }
    if args.patience != 0:  # early stopping on greedy valid BLEU (train.best_metric's default)
        cont["train"].update(
            valid_bleu=True,
            valid_bleu_sentences=args.valid_bleu_sentences,
            valid_bleu_beam_size=1,
            valid_every_steps=args.valid_every,
        )
    # checkpoints as often, relative to the run's length, as the champion's
    cont["train"]["save_every_minutes"] = args.continue_minutes / 12
    continued = train_run("continued", work, raw, cont, Path(champion["package"]))
    print(json.dumps(continued), flush=True)
    rows = [champion, scratch, continued]
    table = [
        "| run | data | train s | steps | test2016 BLEU | chrF | valid loss | OOV rate | time / scratch's |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r, data in zip(rows, (f"{args.share:.0%}", "100%", "100%")):
        table.append(
            f"| {r['run']} | {data} | {r['train_seconds']:.0f} | {r['steps']} | {r['bleu']:.2f} | "
            f"{r['chrf']:.2f} | {r['valid_loss']:.3f} | {r['oov_rate']:.2%} | "
            f"{r['train_seconds'] / scratch['train_seconds']:.2f} |"
        )
    verdict = (
        f"continued - scratch: {continued['bleu'] - scratch['bleu']:+.2f} BLEU at "
        f"{continued['train_seconds'] / scratch['train_seconds']:.2f}x the training time; "
        f"continued - champion: {continued['bleu'] - champion['bleu']:+.2f}"
    )
    text = "\n".join(table + ["", verdict]) + "\n"
    (work / "results.md").write_text(text)
    print(text)
    (work / "dvc.yaml").write_text(PLOTS_YAML)
    if not (work / ".dvc").exists():
        subprocess.run([PY, "-m", "dvc", "init", "--no-scm", "-q"], cwd=work, check=True)
    subprocess.run([PY, "-m", "dvc", "plots", "show", "-o", "plots"], cwd=work, check=True)


if __name__ == "__main__":
    main()
