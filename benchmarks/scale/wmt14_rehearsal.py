"""WMT14 en-de at the paper's data size, offline: the preset end to end against a loopback mirror.

    python -m benchmarks.scale.wmt14_rehearsal --workdir /data/rehearsal  # base + big, full size
    python -m benchmarks.scale.wmt14_rehearsal --workdir /data/r --until shard --no-big  # data only
    python -m benchmarks.scale.wmt14_rehearsal --workdir /data/r --until shard --no-big --filters-ab
    python -m benchmarks.scale.wmt14_rehearsal --workdir /tmp/r --pairs 200000 --test-segments 300 \
        --big-set model.d_model=256 model.d_ff=1024       # a quick check of the whole script

Base: builds (or reuses) the mirror (wmt_mirror.py) under WORKDIR/mirror and serves it on
127.0.0.1; copies this checkout into WORKDIR/project (git init); writes the wmt14-en-de-base
preset with `download.mirror` pointing at the mirror and what a small CPU needs (one process,
`--steps` steps, a checkpoint every `--save-every` steps so that keep_last full-size
checkpoints exist, precision auto, average every checkpoint: they are seconds apart, not the
preset's 10 minutes); then runs each stage as `dvc repro --single-item STAGE` (what the Prefect
flow's task per stage runs) and measures it: wall time, DVC's own time before the command
starts and after it ends, peak RSS (the stage's largest process, and the whole process tree
with DVC's own, sampled every 0.25 s), disk in the workspace, in the DVC cache, and what DVC
adds beside the workspace (inodes it does not share: a copy, not a link), and the download
stage's own cache. Then DVC's overhead with
everything present: `dvc status`, a no-op `dvc repro`, and the train stage's start with its
checkpoints present (`--force`: it resumes from the final checkpoint and trains nothing).
The stages run with jemalloc preloaded where it is installed, as `make multi30k` runs them.
`--filters-ab` then runs the download stage twice more (forced, its download cache warm),
the crawl filters off and then on (the preset's CommonCrawl part), for what the filters cost.

Big (artifact only): the wmt14-en-de-big preset's checkpoint volume. `--big-checkpoints` (21)
checkpoints of the big model (213M parameters with the 37k vocabulary: weights plus Adam's two
moments, after a real Adam step on random gradients so that each file differs), 10 training
minutes apart, recorded in dvc.lock by `dvc commit train`, averaged by the real average stage
(average.by: time, last_k 20, as the preset), with the average's peak RSS against one
checkpoint's size. It needs ~56 GB free and refuses to start without it.

Prints a markdown table with the issue's goals and writes WORKDIR/rehearsal.{json,md}.
`--dvc-defaults` runs with DVC's default cache settings (copies, checkpoints cached) instead
of the project's, for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks.common import JEMALLOC, ROOT
from benchmarks.scale import wmt_mirror
from benchmarks.scale.measure import BIN, GiB, disk, row, table
from flows.dag import read_dag
from transformer.core.presets import load_all

# the pipeline's stages, upstream first (as DVC's index orders dvc.yaml), and the data ones
STAGES = tuple(read_dag(ROOT))
DATA = STAGES[: STAGES.index("shard") + 1]


def make_project(project: Path, defaults: bool) -> None:
    """This checkout's files (tracked and untracked, not ignored) as a fresh git repository."""
    if project.exists():
        shutil.rmtree(project)
    project.mkdir(parents=True)
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (project / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, project / f)
    if defaults:  # DVC's defaults: cache.type reflink,copy (a copy on ext4), checkpoints cached
        subprocess.run(
            [str(BIN / "dvc"), "config", "--unset", "cache.type"],
            cwd=project,
            check=False,
            capture_output=True,
        )
        text = (project / "dvc.yaml").read_text()
        assert "          cache: false\n" in text, "dvc.yaml: no uncached output to cache"
        (project / "dvc.yaml").write_text(text.replace("          cache: false\n", ""))
    for cmd in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        [
            "-c",
            "user.name=rehearsal",
            "-c",
            "user.email=r@localhost",
            "commit",
            "-qm",
            "rehearsal checkout",
        ],
    ):
        subprocess.run(["git", *cmd], cwd=project, check=True)


def set_params(project: Path, preset: str, overrides: list[str]) -> None:
    """params.yaml: the preset, then `dvc exp run -S`-style overrides, validated."""
    from dvc.utils.hydra import apply_overrides

    subprocess.run(
        [sys.executable, "-m", "transformer.config", "preset", preset],
        cwd=project,
        check=True,
        capture_output=True,
    )
    apply_overrides(project / "params.yaml", overrides)
    load_all(project / "params.yaml")


def checkpoint_size(project: Path) -> tuple[int, int]:
    """(parameters, bytes of a training checkpoint: fp32 weights + Adam's two moments) of
    params.yaml's model with its tokenizer.vocab_size."""
    from transformer.model.network import Transformer

    cfg = load_all(project / "params.yaml")
    model = Transformer(cfg["model"], cfg["tokenizer"].vocab_size)
    n = sum(p.numel() for p in model.parameters())
    return n, 12 * n


def need_free(path: Path, need: int, what: str) -> None:
    free = shutil.disk_usage(path).free
    if free < need:
        raise SystemExit(
            f"error: {what} needs {need / GiB:.1f} GiB free in {path}, "
            f"there are {free / GiB:.1f} GiB"
        )


def base(args, project: Path, url: str, log: Path) -> list[dict]:
    set_params(
        project,
        "wmt14-en-de-base",
        [
            f"download.mirror={url}",
            "train.nproc=1",
            f"train.max_steps={args.steps}",
            f"train.save_every_steps={args.save_every}",
            "train.save_every_minutes=0",
            "train.valid_every_steps=0",
            "train.log_every_steps=1",
            "train.precision=auto",
            "average.interval_minutes=0",
            "decode.batch_tokens=4096",  # a CPU's batch: the preset's is a GPU's
            *args.set,
        ],
    )
    keep = load_all(project / "params.yaml")["train"].keep_last
    _, size = checkpoint_size(project)
    text = 5 * GiB * args.pairs / sum(wmt_mirror.REAL_PAIRS.values())  # raw, shards, caches
    need_free(
        project,
        int((keep + 2) * size + text * (2 if args.dvc_defaults else 1) + GiB),
        "the base rehearsal",
    )
    rows = []
    for stage in STAGES[: STAGES.index(args.until) + 1]:
        rows.append(row(stage, project, log, "repro", "--single-item", stage))
        wall, rss = rows[-1]["wall_s"], rows[-1]["stage_rss"]
        print(f"{stage}: {wall:.0f} s, peak RSS {rss / GiB:.2f} GiB", flush=True)
    if args.filters_ab:
        rows += filters_ab(project, log)
    checks = [("dvc status", ["status"]), ("dvc status (again)", ["status"])]
    if args.until == STAGES[-1]:
        checks += [
            ("no-op dvc repro", ["repro"]),
            ("train start, checkpoints present", ["repro", "--force", "--single-item", "train"]),
        ]
    for what, cmd in checks:
        rows.append(row(what, project, log, *cmd))
    return rows


def filters_ab(project: Path, log: Path) -> list[dict]:
    """The download stage twice more, forced, its download cache warm: every train part's own
    `clean` (the crawl filters) dropped, then as the preset has it (what is left in place)."""
    params = project / "params.yaml"
    text = params.read_text()
    off = yaml.safe_load(text)
    for part in off["download"]["splits"]["train"]:
        part.pop("clean", None)
    rows = []
    for what, content in (("off", yaml.safe_dump(off, sort_keys=False)), ("on", text)):
        params.write_text(content)
        args = ("repro", "--force", "--single-item", "download")
        rows.append(row(f"download again, crawl filters {what}", project, log, *args))
        print(f"download, filters {what}: {rows[-1]['wall_s']:.0f} s", flush=True)
    return rows


def big_checkpoints(project: Path, n: int) -> int:
    """n big-shaped training checkpoints in data/checkpoints, 10 minutes of training apart (the
    last one 5 minutes after the one before, as a run's final checkpoint); one file's bytes."""
    import dataclasses

    import torch

    from transformer.data.vocab import load_tokenizer, tokenizer_sha256
    from transformer.model import checkpoint
    from transformer.model.network import Transformer

    cfg = load_all(project / "params.yaml")
    tok = project / "data" / "tokenizer"
    vocab, sha = load_tokenizer(tok).size, tokenizer_sha256(tok)
    torch.manual_seed(0)
    model = Transformer(cfg["model"], vocab)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    out = project / "data" / "checkpoints"
    shutil.rmtree(out, ignore_errors=True)
    for i in range(n):
        for p in model.parameters():  # a real Adam step: every file differs, moments exist
            p.grad = torch.randn_like(p) * 1e-3
        opt.step()
        step, final = (i + 1) * 1000, i == n - 1
        seconds = 600.0 * i - (300.0 if final else 0.0) + 600.0
        checkpoint.save(
            checkpoint.step_path(out, step),
            {
                "model": model.state_dict(),
                "model_config": dataclasses.asdict(cfg["model"]),
                "vocab_size": vocab,
                "tokenizer_sha256": sha,
                "step": step,
                "train_seconds": seconds,
                "final": final,
                "optimizer": opt.state_dict(),
                "train_config": dataclasses.asdict(cfg["train"]),
            },
        )
    return checkpoint.step_path(out, step).stat().st_size


def big(args, project: Path, log: Path) -> list[dict]:
    # the base run's mirror URL: the data stages stay as they are (nothing is downloaded)
    url = load_all(project / "params.yaml")["download"].mirror
    set_params(
        project,
        "wmt14-en-de-big",
        [
            f"download.mirror={url}",
            "train.nproc=1",
            "train.precision=auto",
            *args.set,
            *args.big_set,
        ],
    )
    n_params, size = checkpoint_size(project)
    need_free(
        project,
        (args.big_checkpoints + 1) * size * (2 if args.dvc_defaults else 1) + 2 * GiB,
        f"{args.big_checkpoints} checkpoints of {n_params / 1e6:.0f}M parameters",
    )
    t0 = time.monotonic()
    one = big_checkpoints(project, args.big_checkpoints)
    rows = [
        {
            "what": f"write {args.big_checkpoints} big checkpoints ({n_params / 1e6:.0f}M "
            f"parameters, {one / GiB:.2f} GiB each)",
            "wall_s": time.monotonic() - t0,
            "load": os.getloadavg()[0],
            **disk(project),
        }
    ]
    for what, cmd in (
        ("dvc commit train", ["commit", "--force", "train"]),
        ("average (by time, last 20)", ["repro", "--single-item", "average"]),
        ("dvc status", ["status"]),
        ("no-op dvc repro average", ["repro", "--single-item", "average"]),
    ):
        rows.append(row(what, project, log, *cmd))
        rows[-1]["rss_per_checkpoint"] = rows[-1]["stage_rss"] / one
    from transformer.model import checkpoint

    averaged = checkpoint.load(project / "data" / "model.pt", mmap=True)["averaged"]
    rows[-3]["averaged_steps"] = [a["step"] for a in averaged]
    return rows


def goals(rows: list[dict]) -> list[str]:
    """The issue's goals, each with the measured figure."""
    by = {r["what"]: r for r in rows}
    out = []
    ran = [s for s in STAGES if s in by]
    if ran:
        last, rss = by[ran[-1]], max(by[s]["stage_rss"] for s in ran)
        adds = last["dvc_extra"] / last["workspace"]
        out.append(
            f"largest peak RSS of a stage: {rss / GiB:.2f} GiB ({', '.join(ran)}; goal: 2 GiB)"
        )
        out.append(f"DVC adds {adds:.1%} disk over the artifacts (goal: 10%)")
        out.append(f"dvc status {by['dvc status (again)']['wall_s']:.1f} s (goal: 5 s)")
    if all(s in by for s in DATA):
        prep = sum(by[s]["wall_s"] for s in DATA)
        out.append(f"download -> shards: {prep / 60:.1f} min (goal: 30 min at 4.5M pairs)")
    if {"download again, crawl filters off", "download again, crawl filters on"} <= set(by):
        extra = (
            by["download again, crawl filters on"]["wall_s"]
            - by["download again, crawl filters off"]["wall_s"]
        )
        if all(s in by for s in DATA):
            ratio = prep / (prep - extra)
            out.append(f"the crawl filters: +{extra:.0f} s, data stages {ratio:.2f}x (goal: 1.3x)")
    if "no-op dvc repro" in by:
        out.append(f"no-op dvc repro {by['no-op dvc repro']['wall_s']:.1f} s (goal: 5 s)")
    avg = next((r for r in rows if "averaged_steps" in r), None)
    if avg:
        out.append(
            f"average of {len(avg['averaged_steps'])} big checkpoints: peak RSS "
            f"{avg['rss_per_checkpoint']:.2f} x one checkpoint (goal: 2)"
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--pairs", type=int, default=sum(wmt_mirror.REAL_PAIRS.values()))
    p.add_argument("--test-segments", type=int, default=3003, help="newstest2014 size")
    p.add_argument("--steps", type=int, default=12, help="train.max_steps of the base run")
    p.add_argument("--save-every", type=int, default=2, help="train.save_every_steps")
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more params overrides, for both runs (e.g. tokenizer.vocab_size=8000)",
    )
    p.add_argument(
        "--big-set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for the big run only (e.g. a smaller model.d_model)",
    )
    p.add_argument("--big-checkpoints", type=int, default=21)
    p.add_argument(
        "--until",
        choices=STAGES,
        default=STAGES[-1],
        help="the base run's last stage (e.g. shard: the data stages alone)",
    )
    p.add_argument("--no-base", action="store_true", help="reuse WORKDIR/project as it is")
    p.add_argument(
        "--filters-ab",
        action="store_true",
        help="time the download stage again without and with the crawl filters (cache warm)",
    )
    p.add_argument("--no-big", action="store_true")
    p.add_argument("--no-jemalloc", action="store_true", help="glibc's malloc for the stages")
    p.add_argument(
        "--dvc-defaults",
        action="store_true",
        help="DVC's default cache settings instead of the project's (comparison)",
    )
    args = p.parse_args()
    # jemalloc where installed, as `make multi30k` runs: on glibc's malloc the BPE trainer's peak
    # at 4.5M pairs grows by what its threads' arenas keep of their freed word-count maps
    malloc = "glibc" if args.no_jemalloc or JEMALLOC is None else str(JEMALLOC)
    if malloc != "glibc":
        os.environ["LD_PRELOAD"] = malloc  # for the commands run from here on
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    project, log = work / "project", work / "rehearsal.log"
    rows = []
    if not args.no_base:
        t0 = time.monotonic()
        wmt_mirror.build(
            work / "mirror", args.pairs, eval_segments={"valid": 3000, "test": args.test_segments}
        )
        rows.append(
            {
                "what": f"build the mirror ({args.pairs} pairs; not a stage)",
                "wall_s": time.monotonic() - t0,
                "load": os.getloadavg()[0],
            }
        )
        httpd, url = wmt_mirror.serve(work / "mirror")
        try:
            make_project(project, args.dvc_defaults)
            rows += base(args, project, url, log)
        finally:
            httpd.shutdown()
    if not args.no_big:
        rows += big(args, project, log)
    md = "\n\n".join(
        [
            table(rows),
            *goals(rows),
            f"{os.cpu_count()} CPUs; malloc {malloc}; `{' '.join(sys.argv)}`",
        ]
    )
    (work / "rehearsal.md").write_text(md + "\n")
    (work / "rehearsal.json").write_text(
        json.dumps({"argv": sys.argv, "malloc": malloc, "rows": rows}, indent=1)
    )
    print(md)


if __name__ == "__main__":
    main()
