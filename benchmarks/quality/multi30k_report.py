"""The Multi30k results table and BLEU-over-time curve of finished training runs.

    python -m benchmarks.quality.multi30k_report RUN_DIR [RUN_DIR ...] [--curve MINUTES] [--int8]
        [--length-penalty ALPHA ...] [--average K ...]

RUN_DIR is a checkout after `python -m transformer.config preset multi30k-en-de && dvc repro`:
its params.yaml, data/tokenizer, data/raw, data/checkpoints (the newest is "last") and
data/model.pt (the average). Each model is scored by `python -m transformer.evaluate` on valid and
test, greedy and beam 4. --curve adds greedy val BLEU for every checkpoint in RUN_DIR/curve
(hard links to data/checkpoints/step_*.pt taken while training ran, since the train stage keeps
only the last few), the first past each multiple of MINUTES, against its training minutes. --int8 adds the average decoded in int8.
--average K adds beam 4 for the average of the last K checkpoints of RUN_DIR/curve (the preset
averages average.last_k of those the train stage kept).
Prints markdown; the JSON of every evaluation stays in RUN_DIR/report/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from transformer.average import average_checkpoints, save, select_checkpoints
from transformer.core.sections.average import AverageConfig

STEP_GLOB = "step_*.pt"


def evaluate(
    run: Path,
    model: Path,
    splits: list[str],
    beams: list[int],
    tag: str,
    precision: str = "fp32",
    length_penalty: float | None = None,
) -> dict:
    out = run / "report" / (tag if length_penalty is None else f"{tag}-lp{length_penalty}")
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "transformer.evaluate",
        str(model),
        "data/tokenizer",
        "data/raw",
        str(out),
        "--metrics",
        str(out / "metrics.json"),
        "--no-progress",
        "--split",
        *splits,
        "--beam-size",
        *map(str, beams),
        "--precision",
        precision,
    ]
    if length_penalty is not None:
        cmd += ["--length-penalty", str(length_penalty)]
    subprocess.run(cmd, cwd=run, check=True)
    return json.loads((out / "metrics.json").read_text())


def minutes(path: Path) -> float:
    return torch.load(path, map_location="cpu", weights_only=True)["train_seconds"] / 60


def row(name: str, m: dict) -> str:
    cells = [
        m[f"{s}.beam{b}"][k]
        for s in ("valid", "test")
        for b, k in ((1, "bleu"), (4, "bleu"), (4, "chrf"))
    ]
    return f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |"


def beam4_row(name: str, m: dict) -> str:
    """A row of one beam-4 evaluation of both splits (its metrics keyed by split)."""
    v, t = m["valid"], m["test"]
    return f"| {name} | | {v['bleu']:.1f} | {v['chrf']:.1f} | | {t['bleu']:.1f} | {t['chrf']:.1f} |"


def report(
    run: Path, curve: float, int8: bool, length_penalties: list[float], averages: list[int]
) -> None:
    last = max((run / "data" / "checkpoints").glob(STEP_GLOB))
    avg = run / "data" / "model.pt"
    print(f"\n### {run}  (last: {last.name}, {minutes(last):.1f} training minutes)\n")
    print(
        "| model | val greedy | val beam 4 | val chrF (beam 4) | test greedy | test beam 4 "
        "| test chrF (beam 4) |"
    )
    print("|---|---|---|---|---|---|---|")
    both = ["valid", "test"]
    sig = None
    for name, model in (("last checkpoint", last), ("average", avg)):
        m = evaluate(run, model, both, [1, 4], name.split()[0])
        sig = m["test.beam4"]["bleu_signature"]
        print(row(name, m))
    if int8:
        print(
            beam4_row(
                "average, int8", evaluate(run, avg, both, [4], "average-int8", precision="int8")
            )
        )
    for lp in length_penalties:  # beam 4 with another alpha (choose it on val)
        for name, model in (("last checkpoint", last), ("average", avg)):
            m = evaluate(run, model, both, [4], name.split()[0], length_penalty=lp)
            print(beam4_row(f"{name}, α {lp}", m))
    for k in averages:
        model = run / "report" / f"average-last{k}.pt"
        save(average_checkpoints(select_checkpoints(run / "curve", AverageConfig(last_k=k))), model)
        print(
            beam4_row(
                f"average of the last {k}", evaluate(run, model, both, [4], f"average-last{k}")
            )
        )
    print(f"\nsacreBLEU {sig}")
    if curve:
        print("\n| training minutes | update | val greedy BLEU |\n|---|---|---|")
        mark = curve
        for ckpt in sorted((run / "curve").glob(STEP_GLOB)):
            mins = minutes(ckpt)  # loads the whole training checkpoint: once each
            if mins < mark:
                continue
            mark = (mins // curve + 1) * curve  # the first checkpoint past each mark
            m = evaluate(run, ckpt.resolve(), ["valid"], [1], f"curve-{ckpt.stem}")
            print(f"| {mins:.1f} | {int(ckpt.stem[5:])} | {m['bleu']:.1f} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", type=Path, help="checkouts that ran the preset")
    ap.add_argument(
        "--curve",
        type=float,
        default=0.0,
        metavar="MINUTES",
        help="val BLEU of the RUN_DIR/curve/step_*.pt nearest each multiple of this",
    )
    ap.add_argument("--int8", action="store_true", help="also the average in int8 (beam 4)")
    ap.add_argument(
        "--length-penalty",
        type=float,
        nargs="+",
        default=[],
        metavar="ALPHA",
        help="also beam 4 with these length penalties (params: decode.length_penalty)",
    )
    ap.add_argument(
        "--average",
        type=int,
        nargs="+",
        default=[],
        metavar="K",
        help="also beam 4 for the average of the last K checkpoints in RUN_DIR/curve",
    )
    args = ap.parse_args(argv)
    for run in args.runs:
        report(run.resolve(), args.curve, args.int8, args.length_penalty, args.average)


if __name__ == "__main__":
    main()
