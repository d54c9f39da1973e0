"""The GPU check: how fast this project trains and decodes on one GPU, against its peers, in one
command that writes its figures to a folder as it goes (results.json, summary.md, pytest.log,
profile.txt).

    PYTHONUNBUFFERED=1 python3 -m benchmarks.gpu.check --out DIR --budget-s 480   # a GPU
    python -m benchmarks.gpu.check --out DIR --reduced --device cpu              # CI, seconds

Sections (--sections; run in the order train, tests, stage, decode (base), compile, profile,
variants, loss, decode (big); each measurement is skipped when too little of --budget-s is
left, and one running out of it is stopped):
- train: base and big (Table 3; the presets' dropout), 37k shared vocabulary, bf16 autocast,
  at 3,125 (the presets' per-GPU batch), 12,500 and 25,000 padded tokens per side, pairs of
  realistic WMT lengths (peers.py). Ours is the train stage's own update (learner.Learner,
  train.py) on batches as the train stage makes them: "ours" its default on the device
  (CUDA: static-shape batches, each shape's update a replayed CUDA graph), "ours_eager" the
  eager update on batches of any shape (the update before graphs). The peers, on today's
  sampler's batches: HF MarianMTModel with our weights and Seq2SeqTrainer's label-smoothed
  cross-entropy on its logits (hf_marian), torch.nn.Transformer (torch_transformer). Target
  tokens/s (non-pad targets only) is the median over the timed steps (device events; after the
  warm-up steps and a first, cold pass over the same batches, kept as tokens_per_s_cold) of
  each step's targets over its time. Ours runs each size on a Learner of its own, built after
  the last was freed. A captured contender first runs its batches 3 times (2 eager updates
  and the capture per shape: prime_s, capture_s, graphs; its cold rate is the first of
  them). Peak memory: torch.cuda.max_memory_allocated, for ours from its Learner's build (its
  graphs included). Lengths are drawn for 2^20 pairs (a real corpus's long buckets), the
  targets' pad efficiency printed per size. Each size is recorded as it finishes.
- stage: `python -m transformer.train` itself for 60 s of training (base, 3,125 tokens, a
  synthetic corpus of 50,000 pairs through the real tokenizer (8,000 units) and shard stages):
  its own logged tokens/s, so that its loader, clock and logging are seen not to be the limit.
- compile: ours with the loss under torch.compile (inductor, one dynamic-shape compile) inside
  the graphs (ours_compiled; compiling and capturing in prime_s), at 3,125 tokens.
- tests: tests/test_cuda.py under pytest (exact SIGKILL resume in bf16 on the captured path
  and in fp16, the captured update = the eager one, decoding and the output loss on the GPU);
  `--noconftest`, as the GPU machine has no Prefect or DVC. On a CPU all skip.
- decode: 3,003 sentences of newstest-like lengths, beam 4, translate's batches (16,384 padded
  source tokens), ours (incremental.Decoder, bf16 on a GPU; then fp32) and HF generate with the
  same weights, batches and precision; base here, big at the very end. Random weights emit EOS
  at random, so every sentence of a batch gets exactly that batch's longest reference length
  in tokens (EOS blocked before, length penalty 1): equal work, and a lower bound on ours,
  whose real runs drop finished sentences from the batch.
- profile: torch.profiler over 3 updates of ours and of ours_eager at 3,125 tokens
  (profile.txt): ATen ops the host dispatches per update, and the GPU's busy share.
- variants: ours with F.linear + F.cross_entropy (ours_unfused_loss), with F.dropout
  (ours_torch_dropout).
- loss: the output projection + label-smoothed loss alone (forward and backward, bf16, 11,000
  target tokens, the 37k vocabulary): ops.output_loss's chunks of 2^22..2^28 elements against
  F.linear + F.cross_entropy.

MFU = 6 × N × target tokens/s / peak, N the trainable parameters with the shared embedding and
output matrix counted once; attention's own FLOPs are not counted (as in the published
anchors). Peak: the GPU's dense bf16 rate, 989 TFLOP/s for the H100 SXM and the H200, 756 for
the H100 PCIe (others: --peak-tflops, or no MFU).

A preflight (device, driver, free memory, torch and Triton, a C compiler and Python.h for
Triton) runs first: what cannot run is skipped, with the reason, under "skipped". The CUDA tests
run each under a limit (GPU_TEST_LIMIT_S, benchmarks/gpu/test_limit.py), failing by name.

Decision rules, written before any GPU measured them (summary.md applies them; "a / b" is
a's target tokens/s over b's):
- fused output loss on CUDA: Transformer.fused_loss becomes False on CUDA if ours_unfused_loss
  / ours >= 1.05 at 3,125 tokens in both base and big and >= 0.98 at every measured size; else
  the fused op stays. Its GPU chunk (ops.CHUNK_ELEMENTS_GPU; 2^28 since an H100 run) changes
  to the loss section's fastest if that is >= 1.05x faster at d_model 1024.
- dropout on CUDA: F.dropout replaces the 16-bit-lane mask on CUDA (ops.LANE_DROPOUT without
  "cuda") if ours_torch_dropout / ours >= 1.03 at 3,125 tokens in both base and big and >= 0.98
  at every size.
- torch.compile: train.compile's default becomes true if ours_compiled / ours >= 1.10 at 3,125
  tokens in both base and big, its compiling and capturing taking < 120 s in all; else off.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import version
from benchmarks.gpu import peers
from benchmarks.gpu import report as gpu_report
from benchmarks.gpu import sections as gpu_sections
from benchmarks.gpu import train as gpu_train
from transformer.model import ops
from transformer.model.precision import resolve_precision

SECTIONS = ("tests", "loss", "train", "stage", "decode", "profile", "compile", "variants")
CONTENDERS = ("ours", "ours_eager", "hf_marian", "torch_transformer")
FULL = {
    "shapes": ("base", "big"),
    "vocab": 37_000,
    "sizes": (3125, 12500, 25000),
    "pairs": peers.PAIRS,
    "warmup": 2,
    "steps": 12,
    "stage": {"seconds": 60, "vocab": 8000, "pairs": 50_000, "max_tokens": 3125, "threads": 0},
    "sentences": 3003,
    "batch_tokens": 16384,
    "loss_rows": 11000,
}
REDUCED = {
    "shapes": ("tiny",),
    "vocab": 1000,
    "sizes": (256, 512),
    "pairs": 20_000,
    "warmup": 1,
    "steps": 2,
    "stage": {"seconds": 3, "vocab": 300, "pairs": 300, "max_tokens": 256, "threads": 1},
    "sentences": 24,
    "batch_tokens": 128,
    "loss_rows": 300,
}


class Check:
    """The results so far, saved after every measurement, and the time budget."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.t0 = args, time.monotonic()
        self.device = torch.device(args.device)
        self.cfg = REDUCED if args.reduced else FULL
        self.dtype = (
            torch.bfloat16
            if resolve_precision("auto", self.device, "--device") == "bf16"
            else torch.float32
        )
        name = (
            torch.cuda.get_device_name(self.device)
            if self.device.type == "cuda"
            else platform.processor() or platform.machine()
        )
        peak = peers.peak_tflops(name)
        source = "dense bf16, by the device's name" if peak else "not known: --peak-tflops"
        if args.peak_tflops:
            peak, source = args.peak_tflops, "--peak-tflops"
        self.results: dict = {
            "meta": {
                "command": " ".join(sys.argv),
                "device": str(self.device),
                "device_name": name,
                "torch": torch.__version__,
                "cuda": torch.version.cuda,
                "python": sys.version.split()[0],
                "transformers": version("transformers"),
                "reduced": args.reduced,
                "precision": str(self.dtype).removeprefix("torch."),
                "peak_tflops": peak,
                "peak_source": source,
                "budget_s": args.budget_s,
                "gpu_state": _gpu_state(),
                "gpu_loss_chunk": ops.CHUNK_ELEMENTS_GPU,
                "mfu": "6 x trainable parameters (shared embedding once) x target tokens/s / peak",
            },
            "skipped": [],
            "errors": [],
        }

    def remaining(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def skip(self, name: str, need_s: float) -> bool:
        """Whether fewer than need_s seconds are left for `name` (then recorded as skipped)."""
        if self.remaining() >= need_s:
            return False
        self.results["skipped"].append(f"{name}: {self.remaining():.0f} s left, needs {need_s}")
        return True

    def run(self, where: tuple[str, ...], need_s: float, fn) -> None:
        """results[where] = fn(), unless fewer than need_s seconds are left; an exception or the
        budget running out inside it is recorded and the check goes on."""
        name = "/".join(where)
        if self.skip(name, need_s):
            return
        print(f"[{time.monotonic() - self.t0:5.0f} s] {name}", flush=True)
        signal.signal(signal.SIGALRM, _out_of_time)
        signal.alarm(max(1, int(self.remaining())))
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 (a failed measurement is a result too)
            self.results["errors"].append(f"{name}: {type(e).__name__}: {e}"[:2000])
            value = None
        finally:
            signal.alarm(0)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        if value is not None:
            node = self.results
            for key in where[:-1]:
                node = node.setdefault(key, {})
            node[where[-1]] = value
        self.save()

    def save(self) -> None:
        self.results["meta"]["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.results.update(gpu_report.derived(self.results))
        out = self.args.out
        for name, text in (
            ("results.json", json.dumps(self.results, indent=1)),
            ("summary.md", gpu_report.summary(self.results)),
        ):
            (out / f".{name}").write_text(text + "\n")
            os.replace(out / f".{name}", out / name)


def _out_of_time(signum, frame):
    raise TimeoutError("the check's --budget-s ran out")


def _gpu_state() -> str | None:
    """nvidia-smi's name, clocks and power limit (read only), for the record."""
    return gpu_sections.smi(
        "name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu"
    )


def peer_step(name: str, shape: str, chk: Check):
    """A peer's training step (its model built once for every size)."""
    V, dev = chk.cfg["vocab"], chk.device
    if name == "torch_transformer":
        torch.manual_seed(0)
        model, kind = peers.TorchTransformer(shape, V).to(dev), "torch"
    else:
        model, kind = peers.marian_from(peers.ours(shape, V, dev)), "marian"
    return peers.train_step(model, kind, chk.dtype), peers.n_params(model)


def train_size(name: str, shape: str, size: int, chk: Check, peer: list) -> dict:
    """A contender's figures at one batch size; MFU counts our parameters for every one."""
    if name in gpu_train.OURS:  # the train stage's own update, on batches as it makes them
        return gpu_train.contender(name, shape, size, chk.cfg, chk)
    if not peer:
        peer.extend(peer_step(name, shape, chk))
    step, params = peer
    n = chk.cfg["warmup"] + chk.cfg["steps"]
    work = peers.train_batches(chk.cfg["vocab"], size, n, chk.device, pairs=chk.cfg["pairs"])
    toks = sum(w.n_tgt for w in work)
    fig = {
        "params": params,
        "tgt_pad_efficiency": round(toks / sum(w.tgt_out.numel() for w in work), 4),
    }
    n_mfu, peak = peers.mfu_params(shape, chk.cfg["vocab"]), chk.results["meta"]["peak_tflops"]
    return {**fig, **peers.measure_steps(step, work, chk.cfg["warmup"], n_mfu, peak)}


def section_train(chk: Check, names=CONTENDERS, need_s: float = 20) -> None:
    """Each contender at each size, recorded (and saved) as it finishes: a failure or the budget
    running out loses that size's figures only."""
    for shape in chk.cfg["shapes"]:
        runs = chk.results.setdefault("train", {}).setdefault(shape, {})
        runs["params_mfu"] = peers.mfu_params(shape, chk.cfg["vocab"])
        for size in chk.cfg["sizes"]:  # the check's batches: their padding, printed per size
            stats = {
                k: peers.draw_stats(size, k == "static", chk.cfg["pairs"])
                for k in ("static", "any_shape")
            }
            runs.setdefault("draw", {})[str(size)] = stats
            print(f"{shape} {size:,} tokens: {stats}", flush=True)
        for name in names:
            if name == "hf_marian" and version("transformers") is None:
                chk.results["skipped"].append(f"train/{shape}/hf_marian: no transformers")
                continue
            peer: list = []  # a peer's model, built at its first size
            for size in chk.cfg["sizes"]:
                chk.run(
                    ("train", shape, name, str(size)),
                    need_s,
                    lambda name=name, size=size, peer=peer, shape=shape: train_size(
                        name, shape, size, chk, peer
                    ),
                )
            peer.clear()


def section_compile(chk: Check) -> None:
    """ours_compiled at the presets' batch (what its rule reads): one inductor compile a model."""
    sizes = chk.cfg["sizes"]
    chk.cfg = {**chk.cfg, "sizes": sizes[:1]}
    try:
        section_train(chk, ("ours_compiled",), 5 if chk.args.reduced else 90)
    finally:
        chk.cfg = {**chk.cfg, "sizes": sizes}


def section_stage(chk: Check) -> None:
    """The train stage itself (the first shape, the first size) for a minute, end to end."""
    c = chk.cfg["stage"]
    chk.run(
        ("stage", chk.cfg["shapes"][0]),
        c["seconds"] + 60,
        lambda: gpu_train.train_stage(
            chk.cfg["shapes"][0],
            c["max_tokens"],
            c["seconds"],
            c["vocab"],
            c["pairs"],
            c["threads"],
        ),
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for the figures")
    ap.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu")
    )
    ap.add_argument(
        "--reduced",
        action="store_true",
        help="tiny shapes, few steps and sentences: checks that the check works",
    )
    ap.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma list from {','.join(SECTIONS)}"
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="wall seconds for everything; what would start after it is skipped",
    )
    ap.add_argument("--peak-tflops", type=float, help="the device's peak, for MFU")
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    if unknown := set(sections) - set(SECTIONS):
        ap.error(f"unknown sections {sorted(unknown)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reduced and args.device == "cpu":
        torch.set_num_threads(1)  # tiny tensors gain nothing from threads; shared cores lose
    chk = Check(args)
    chk.results["preflight"] = pre = gpu_sections.preflight(chk.device)
    print(f"preflight: {pre}", flush=True)
    if not pre["inductor"] and "compile" in sections:  # and the compiled test (section_tests)
        sections.remove("compile")
        why = ", ".join(pre["inductor_missing"])
        chk.results["skipped"].append(f"compile (and the compiled CUDA test): no {why}")
    chk.save()
    shapes = chk.cfg["shapes"]
    # the figures first, the tests after them: a lease is short, and a rerun with --sections
    # can take what the budget left out
    plan = [
        ("train", lambda: section_train(chk)),
        ("tests", lambda: chk.run(("tests",), 30, lambda: gpu_sections.section_tests(chk))),
        ("stage", lambda: section_stage(chk)),
        ("decode", lambda: gpu_sections.section_decode(chk, shapes[0])),
        ("compile", lambda: section_compile(chk)),
        ("profile", lambda: gpu_sections.section_profile(chk)),
        ("variants", lambda: section_train(chk, ("ours_unfused_loss", "ours_torch_dropout"))),
        ("loss", lambda: gpu_sections.section_loss(chk)),
        ("decode", lambda: shapes[1:] and gpu_sections.section_decode(chk, shapes[1])),
    ]
    times = chk.results.setdefault("sections_s", {})
    for section, fn in plan:
        if section in sections:
            t = time.monotonic()
            try:  # a failure outside a measurement (building batches, say) ends the section only
                fn()
            except Exception as e:  # noqa: BLE001
                chk.results["errors"].append(f"{section}: {type(e).__name__}: {e}"[:2000])
            times[section] = round(times.get(section, 0.0) + time.monotonic() - t, 1)
            chk.save()
    chk.save()
    print(gpu_report.summary(chk.results))


if __name__ == "__main__":
    main()
