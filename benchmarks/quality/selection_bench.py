"""Which weights to ship from one run: last-k average, best-k average, EMA, EMA + average.

    python -m benchmarks.quality.selection_bench RUN_DIR OUT_DIR [--k 10]

RUN_DIR is a project folder whose train stage has run (data/checkpoints with every checkpoint
kept, train.ema_decay > 0, data/tokenizer, data/raw, params.yaml). Each checkpoint's val BLEU is
scored with the evaluate stage's own decoding (params `decode`, `transformer.evaluate`'s
evaluate_split); then four models are built with the average stage's averaging:

- last-k: the last k checkpoints averaged (the pipeline's model with `average.by: steps`);
- best-k: the k checkpoints of highest val BLEU averaged (a tie: the later one);
- ema: the last checkpoint's EMA (train.ema_decay);
- ema+average: the last k checkpoints' EMAs averaged (`average.weights: ema`).

Each is decoded on val and test and compared with last-k by sacreBLEU's paired bootstrap
(1,000 resamples, seed 12345: sacreBLEU's defaults). Everything decoded is kept under OUT_DIR
(a rerun skips what was decoded from the same checkpoints; `--valid-only` scores the
checkpoints there are so far, e.g. while the run still trains: OUT_DIR/valid_bleu.json); the table goes to
stdout and OUT_DIR/results.md, the figures to OUT_DIR/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from transformer.average import average_checkpoints, save
from transformer.core import settings
from transformer.core.files import atomic_write
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.evaluate import EvaluateConfig
from transformer.decode import read_lines
from transformer.evaluate import evaluate_split
from transformer.model import checkpoint
from transformer.model.translator import load_translator, pick_device

SPLITS = ("test", "valid")
BASE = "last-k"
N_SAMPLES = 1000  # paired bootstrap resamples (sacreBLEU's default)
ALPHA = 0.05  # the rule: docs/experiments/2026-11-27-selection-60min.md


class Scorer:
    """The evaluate stage's decoding and scoring of a model on a split, cached under `out`."""

    def __init__(self, run: Path, out: Path):
        params = run / "params.yaml"
        self.cfg = settings.load(DecodeConfig, "decode", params)
        self.ev = settings.load(EvaluateConfig, "evaluate", params)
        dl = settings.load(DownloadConfig, "download", params)
        self.langs, self.cleanup = (dl.src_lang, dl.tgt_lang), dl.clean.eval_cleanup()
        self.tok, self.raw, self.out = run / "data" / "tokenizer", run / "data" / "raw", out

    def score(self, model: Path, split: str, name: str, made_of: list[str]) -> dict:
        """{bleu, chrf, decode_seconds, hyps}: of OUT/name.split.json if it is there and
        scored a model `made_of` the same checkpoints and weights."""
        record = self.out / f"{name}.{split}.json"
        if record.is_file() and json.loads(record.read_text())["made_of"] == made_of:
            return json.loads(record.read_text())
        tr = load_translator(model, self.tok, self.cfg, self.cfg.precision, (), pick_device("cpu"))
        hyps = f"hyps.{name}.{split}.txt"
        r = evaluate_split(tr, self.raw, self.out, split, self.langs, self.ev, hyps, False)
        keep = {k: r[k] for k in ("bleu", "chrf", "decode_seconds", "hyps", "bleu_signature")}
        keep["made_of"] = made_of
        write_json(record, keep)
        return keep

    def refs(self, split: str) -> list[str]:
        return read_lines(self.raw / f"{split}.{self.langs[1]}")

    def hyps(self, name: str, split: str) -> list[str]:
        return read_lines(self.out / f"hyps.{name}.{split}.txt")


def write_json(path: Path, obj) -> None:
    with atomic_write(path, "w") as f:
        f.write(json.dumps(obj, indent=1) + "\n")


def valid_bleu(scorer: Scorer, paths: list[Path]) -> dict[str, dict]:
    """Each checkpoint's val BLEU and chrF, decoded as the evaluate stage does."""
    table = {}
    for i, p in enumerate(paths):
        r = scorer.score(p, "valid", f"ckpt.{p.stem}", [p.name])
        table[p.name] = {"step": int(checkpoint.STEP_RE.search(p.name).group(1)), **r}
        print(f"[{i + 1}/{len(paths)}] {p.name}: val BLEU {r['bleu']:.2f}", file=sys.stderr)
    write_json(scorer.out / "valid_bleu.json", table)
    return table


def best_k(paths: list[Path], table: dict[str, dict], k: int) -> list[Path]:
    """The k checkpoints of highest val BLEU (a tie: the later), in step order."""
    ranked = sorted(paths, key=lambda p: (table[p.name]["bleu"], table[p.name]["step"]))
    chosen = set(ranked[-k:])
    return [p for p in paths if p in chosen]


def models(paths: list[Path], table: dict[str, dict], k: int, out: Path) -> dict[str, dict]:
    """The four models, written to OUT/name.pt: name -> the checkpoints and weights used."""
    recipes = {
        BASE: (paths[-k:], "model"),
        "best-k": (best_k(paths, table, k), "model"),
        "ema": (paths[-1:], "ema"),
        "ema+average": (paths[-k:], "ema"),
    }
    made = {}
    for name, (chosen, weights) in recipes.items():
        save(average_checkpoints(chosen, weights), out / f"{name}.pt")
        made[name] = {"checkpoints": [p.name for p in chosen], "weights": weights}
    return made


def paired(scorer: Scorer, names: list[str], split: str) -> dict[str, dict]:
    """sacreBLEU's paired bootstrap of each model against the first: BLEU and chrF, p-values."""
    systems = [(n, scorer.hyps(n, split)) for n in names]
    metrics = {"BLEU": BLEU(trg_lang=scorer.langs[1]), "chrF": CHRF()}
    test = PairedTest(systems, metrics, [scorer.refs(split)], "bs", N_SAMPLES)
    _, scores = test()  # {"System": names, "BLEU": results, "chrF2": results}
    bleu, chrf = (scores[k] for k in scores if k != "System")
    out = {}
    for i, name in enumerate(scores["System"]):
        name = name.removeprefix("Baseline: ")
        b, c = bleu[i], chrf[i]
        out[name] = {"bleu": b.score, "chrf": c.score, "p_bleu": b.p_value, "p_chrf": c.p_value}
    return out


def decide(result: dict[str, dict[str, dict]]) -> tuple[str, list[str]]:
    """The rule: above last-k on every split with p < ALPHA; several: the higher val BLEU."""
    wins = [
        name
        for name in result["test"]
        if name != BASE
        and all(
            result[s][name]["bleu"] > result[s][BASE]["bleu"] and result[s][name]["p_bleu"] < ALPHA
            for s in SPLITS
        )
    ]
    if not wins:
        return BASE, wins
    return max(wins, key=lambda n: result["valid"][n]["bleu"]), wins


def table_md(result: dict, made: dict) -> str:
    rows = [
        "| model | weights of | test2016 BLEU | p | chrF | val BLEU | p | chrF |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in made.items():
        steps = ", ".join(
            c.removeprefix("step_").removesuffix(".pt").lstrip("0") for c in m["checkpoints"]
        )
        cells = []
        for s in SPLITS:
            r = result[s][name]
            p = "—" if name == BASE else f"{r['p_bleu']:.4f}"
            cells += [f"{r['bleu']:.2f}", p, f"{r['chrf']:.2f}"]
        rows.append(f"| {name} | {m['weights']} of steps {steps} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.selection_bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", type=Path, help="the project folder whose train stage has run")
    parser.add_argument("out", type=Path, help="where models, hypotheses and results go")
    parser.add_argument("--k", type=int, default=10, help="checkpoints per average (10)")
    parser.add_argument(
        "--valid-only",
        action="store_true",
        help="only score the checkpoints there are on val (while the run still trains)",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    paths = checkpoint.list_checkpoints(args.run / "data" / "checkpoints")
    if len(paths) < args.k and not args.valid_only:
        sys.exit(f"error: {args.run}/data/checkpoints: {len(paths)} checkpoints, fewer than --k")
    scorer = Scorer(args.run, args.out)
    table = valid_bleu(scorer, paths)
    if args.valid_only:
        return
    made = models(paths, table, args.k, args.out)
    for name in made:
        for split in SPLITS:
            made_of = [*made[name]["checkpoints"], made[name]["weights"]]
            r = scorer.score(args.out / f"{name}.pt", split, name, made_of)
            print(f"{name} {split}: BLEU {r['bleu']:.2f}", file=sys.stderr)
    result = {s: paired(scorer, list(made), s) for s in SPLITS}
    chosen, wins = decide(result)
    text = table_md(result, made) + f"\nDecision: {chosen} (won by the rule: {wins or 'none'})\n"
    (args.out / "results.md").write_text(text)
    write_json(args.out / "results.json", {"models": made, "paired": result, "chosen": chosen})
    print(text)


if __name__ == "__main__":
    main()
