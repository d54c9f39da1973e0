"""Choose settings on val: train variants of a preset side by side and score each on valid.

    python -m benchmarks.quality.multi30k_sweep SWEEP_DIR --variants VARIANTS.yaml [--jobs N]
    python -m benchmarks.quality.multi30k_sweep SWEEP_DIR --prepare    # raw/tokenizer/shards only

VARIANTS.yaml maps a variant's name to dotted params overrides, merged over the preset:

    base:   {}
    lr1.0:  {train.lr_scale: 1.0}
    v6k:    {tokenizer.vocab_size: 6000}

Each variant gets SWEEP_DIR/runs/NAME/params.yaml, trains with `python -m transformer.train`
(one process; CUDA when there is one), averages with `transformer.average` and is scored on
valid by `transformer.evaluate` (last checkpoint and average, greedy and beam 4): never on test.
Variants with the same download/tokenizer/shard sections share their data folder, built once
(the download stage reads local files, so SWEEP_DIR/raw can be made here and carried elsewhere).
The table goes to stdout and SWEEP_DIR/results.md; every run's metrics stay in its folder.

A time-budgeted CPU run can be replayed faster elsewhere (a GPU) as a step budget: set
`train.max_steps` to what the CPU run reaches, `train.time_budget_minutes: 0` (a linear or
cosine `lr_decay` then decays by steps instead of minutes) and `save_every_steps` at the same
spacing as the CPU run's checkpoints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from benchmarks.common import run_stage
from transformer.core import presets

DATA_SECTIONS = ("download", "tokenizer", "shard")


def overrides_to_tree(flat: dict[str, object]) -> dict:
    tree: dict = {}
    for dotted, value in flat.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def prepare(sweep: Path, params: dict, threads: int) -> Path:
    """The data folder (tokenizer + shards) for these data sections; built if missing."""
    key = hashlib.sha256(
        json.dumps({s: params[s] for s in DATA_SECTIONS}, sort_keys=True).encode()
    ).hexdigest()[:10]
    data = sweep / f"data-{key}"
    pfile = data / "params.yaml"
    data.mkdir(parents=True, exist_ok=True)
    pfile.write_text(yaml.safe_dump(params, sort_keys=False))
    py, log = sys.executable, data / "log.txt"
    raw = sweep / "raw"
    if not any(raw.glob("train.*")):  # the download stage, once per sweep
        run_stage(
            [py, "-m", "transformer.download", str(raw), "--params", str(pfile)], log, threads
        )
    if not (data / "tokenizer").exists():
        run_stage(
            [
                py,
                "-m",
                "transformer.tokenizer",
                str(raw),
                str(data / "tokenizer"),
                "--params",
                str(pfile),
            ],
            log,
            threads,
        )
    if not (data / "shards").exists():
        run_stage(
            [
                py,
                "-m",
                "transformer.shard",
                str(raw),
                str(data / "tokenizer"),
                str(data / "shards"),
                "--params",
                str(pfile),
            ],
            log,
            threads,
        )
    return data


def variant(
    sweep: Path,
    data: Path,
    name: str,
    params: dict,
    threads: int,
    beams: list[int],
    models: list[str],
) -> dict:
    out = sweep / "runs" / name
    result = out / "result.json"
    if result.exists():
        return json.loads(result.read_text())
    out.mkdir(parents=True, exist_ok=True)
    pfile, log, py = out / "params.yaml", out / "log.txt", sys.executable
    pfile.write_text(yaml.safe_dump(params, sort_keys=False))
    presets.load_all(pfile)  # a misspelt override fails here, naming the key
    ckpts = out / "checkpoints"
    run_stage(
        [
            py,
            "-m",
            "transformer.train",
            str(data / "shards"),
            str(data / "tokenizer"),
            str(ckpts),
            "--params",
            str(pfile),
            "--no-progress",
            "--resume",
        ],
        log,
        threads,
    )
    if "average" in models:
        run_stage(
            [
                py,
                "-m",
                "transformer.average",
                str(ckpts),
                str(out / "model.pt"),
                "--params",
                str(pfile),
            ],
            log,
            threads,
        )
    res: dict = {"name": name}
    last = max(ckpts.glob("step_*.pt"))
    for tag, model in (("last", last), ("average", out / "model.pt")):
        if tag not in models:
            continue
        mfile = out / f"eval-{tag}.json"
        run_stage(
            [
                py,
                "-m",
                "transformer.evaluate",
                str(model),
                str(data / "tokenizer"),
                str(sweep / "raw"),
                str(out / f"eval-{tag}"),
                "--metrics",
                str(mfile),
                "--params",
                str(pfile),
                "--no-progress",
                "--split",
                "valid",
                "--beam-size",
                *map(str, beams),
            ],
            log,
            threads,
        )
        m = json.loads(mfile.read_text())
        for b in beams:
            res[f"{tag}.beam{b}"] = (m[f"valid.beam{b}"] if len(beams) > 1 else m)["bleu"]
    res["steps"] = int(last.stem[5:])
    result.write_text(json.dumps(res, indent=1))
    return res


def table(results: list[dict], beams: list[int], models: list[str]) -> str:
    cols = [f"{t}.beam{b}" for t in models for b in beams]
    lines = [
        "| variant | steps | " + " | ".join(c.replace(".beam", " beam ") for c in cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for r in sorted(results, key=lambda r: -r.get(cols[-1], -1)):
        cells = [f"{r[c]:.2f}" if c in r else "failed" for c in cols]
        lines.append(f"| {r['name']} | {r.get('steps', '')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("sweep", type=Path, help="working folder (raw/, data-*/, runs/NAME/)")
    ap.add_argument("--preset", default="multi30k-en-de", help="the preset the variants modify")
    ap.add_argument("--variants", type=Path, help="YAML: name -> {dotted.key: value}")
    ap.add_argument("--only", nargs="+", help="run only these variants")
    ap.add_argument("--prepare", action="store_true", help="build the data folders and stop")
    ap.add_argument("--jobs", type=int, default=1, help="variants trained at once")
    ap.add_argument("--threads", type=int, default=1, help="OMP threads per process")
    ap.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    ap.add_argument(
        "--models",
        nargs="+",
        choices=("last", "average"),
        default=["last", "average"],
        help="which models to score",
    )
    args = ap.parse_args(argv)
    base = presets.preset_params(args.preset)
    variants = yaml.safe_load(args.variants.read_text()) if args.variants else {"base": {}}
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only}
    # val BLEU is what the sweep compares; the paper-style tokenized BLEU needs sacremoses
    base = presets.merge(base, {"evaluate": {"tokenized_bleu": False}})
    merged = {n: presets.merge(base, overrides_to_tree(o or {})) for n, o in variants.items()}
    sweep = args.sweep.resolve()
    sweep.mkdir(parents=True, exist_ok=True)
    # one after the other, before any training: variants sharing data must not build it twice
    data = {n: prepare(sweep, p, args.threads) for n, p in merged.items()}
    if args.prepare:
        print("\n".join(sorted({str(d) for d in data.values()})))
        return

    def one(item: tuple[str, dict]) -> dict:
        try:
            return variant(
                sweep, data[item[0]], item[0], item[1], args.threads, args.beams, args.models
            )
        except subprocess.CalledProcessError as e:
            print(f"{item[0]}: failed ({e}); see {args.sweep}/runs/{item[0]}/log.txt")
            return {"name": item[0]}

    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one, merged.items()))
    md = table(results, args.beams, args.models)
    (args.sweep / "results.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
