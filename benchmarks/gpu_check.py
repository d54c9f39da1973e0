"""The GPU check: how fast this project trains and decodes on one GPU, against its peers, in one
command that writes its figures to a folder as it goes (results.json, summary.md, pytest.log,
profile.txt).

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out DIR --budget-s 480   # a GPU
    python benchmarks/gpu_check.py --out DIR --reduced --device cpu              # CI, seconds

Sections (--sections; run in the order loss, train, compile, decode (base), tests, profile,
decode (big); each measurement is skipped when too little of --budget-s is left, and one
running out of it is stopped):
- tests: tests/test_cuda.py under pytest (exact SIGKILL resume in bf16 and in fp16 with
  gradient scaling, decoding and the output loss on the GPU); `--noconftest`, as the GPU
  machine has no Prefect or DVC and these tests need no shared fixture. On a CPU all skip.
- loss: the output projection + label-smoothed loss alone (forward and backward, bf16, 11,000
  target tokens, the 37k vocabulary): ops.output_loss's chunks of 2^22..2^28 elements against
  F.linear + F.cross_entropy.
- train: base and big (Table 3; the presets' dropout), 37k shared vocabulary, bf16 autocast,
  fused Adam, batches as the train stage makes them (BatchSampler) at 3,125 (the presets' per-GPU
  batch), 6,250 and 12,500 padded tokens per side, of realistic WMT lengths (gpu_peers.py);
  the same batches for: ours (model.loss with the host's target count, so no host sync; the
  fused output loss; ops.dropout's 16-bit lanes), ours with F.linear + F.cross_entropy
  (ours_unfused_loss), ours with F.dropout (ours_torch_dropout), HF MarianMTModel with our
  weights and Seq2SeqTrainer's label-smoothed cross-entropy on its logits (hf_marian), and
  torch.nn.Transformer (torch_transformer). Target tokens/s is the median over the timed steps
  (device events; after the warm-up steps and a first, cold pass over the same batches, whose
  rate is kept as tokens_per_s_cold) of each step's non-pad target tokens over its time;
  peak memory is torch.cuda.max_memory_allocated.
- decode: 3,003 sentences of newstest-like lengths, beam 4, translate's batches (16,384 padded
  source tokens), ours (incremental.Decoder, bf16 on a GPU; then fp32) and HF generate with the
  same weights, batches and precision; base here, big at the very end. Random weights emit EOS
  at random, so every sentence of a batch gets exactly that batch's longest reference length
  in tokens (EOS blocked before, length penalty 1): equal work, and a lower bound on ours,
  whose real runs drop finished sentences from the batch.
- profile: torch.profiler over 3 steps of ours at 3,125 tokens (profile.txt, the top ops).
- compile: ours_torch_dropout with encode and decode_features under torch.compile, dynamic
  shapes (ours_compiled; its first, compiling steps timed apart as warmup_s).

MFU = 6 × N × target tokens/s / peak, N the trainable parameters with the shared embedding and
output matrix counted once; attention's own FLOPs are not counted (as in the published
anchors). Peak: the GPU's dense bf16 rate, 989 TFLOP/s for the H100 SXM and the H200, 756 for
the H100 PCIe (others: --peak-tflops, or no MFU).

Decision rules, written before any GPU measured them (summary.md applies them; "a / b" is
a's target tokens/s over b's):
- fused output loss on CUDA: Transformer.fused_loss becomes False on CUDA if ours_unfused_loss
  / ours >= 1.05 at 3,125 tokens in both base and big and >= 0.98 at every measured size; else
  the fused op stays. Its GPU chunk (ops.CHUNK_ELEMENTS_GPU; 2^22 as on the CPU,
  then 2^28 by this rule on an H100) changes to the loss section's fastest if that is >= 1.05x
  faster at d_model 1024.
- dropout on CUDA: F.dropout replaces the 16-bit-lane mask on CUDA (ops.LANE_DROPOUT without
  "cuda") if ours_torch_dropout / ours >= 1.03 at 3,125 tokens in both base and big and >= 0.98
  at every size.
- torch.compile: the train stage compiles encode/decode_features on CUDA if ours_compiled /
  ours_torch_dropout >= 1.10 at 3,125 tokens in both base and big, its compiling steps taking
  < 120 s in all; else eager stays.
The first H100 runs met the first two rules on figures that the order of the contenders had
skewed (each ran on shapes its predecessors had warmed); timed on seen shapes since, they wait
for the next run (docs/experiments/2026-11-26-gpu-h100.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import gpu_peers as peers
import gpu_report

from transformer import ops
from transformer.incremental import Decoder
from transformer.ops import output_loss
from transformer.precision import resolve_precision

SECTIONS = ("tests", "loss", "train", "decode", "profile", "compile")
CONTENDERS = ("ours", "ours_unfused_loss", "ours_torch_dropout", "hf_marian", "torch_transformer")
FULL = {
    "shapes": ("base", "big"),
    "vocab": 37_000,
    "sizes": (3125, 6250, 12500),
    "warmup": 3,
    "steps": 15,
    "sentences": 3003,
    "batch_tokens": 16384,
    "loss_rows": 11000,
}
REDUCED = {
    "shapes": ("tiny",),
    "vocab": 1000,
    "sizes": (256, 512),
    "warmup": 1,
    "steps": 2,
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
                "transformers": _version("transformers"),
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


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _gpu_state() -> str | None:
    """nvidia-smi's name, clocks and power limit (read only), for the record."""
    q = "name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu"
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def build(name: str, shape: str, chk: Check):
    """(model, step kind) of a contender, from the same seed."""
    V, dev = chk.cfg["vocab"], chk.device
    if name == "torch_transformer":
        torch.manual_seed(0)
        return peers.TorchTransformer(shape, V).to(dev), "torch"
    model = peers.ours(shape, V, dev)
    if name == "hf_marian":
        return peers.marian_from(model), "marian"
    model.fused_loss = name != "ours_unfused_loss"
    if name == "ours_compiled":
        # symbolic shapes from the start: every batch has other lengths
        model.encode = torch.compile(model.encode, dynamic=True)
        model.decode_features = torch.compile(model.decode_features, dynamic=True)
    return model, "ours"


def train_contender(name: str, shape: str, work: dict, chk: Check) -> dict:
    """A contender's figures at each batch size; MFU counts our parameters for every one."""
    lanes = set(ops.LANE_DROPOUT)
    if name in ("ours_torch_dropout", "ours_compiled"):  # F.dropout: one kernel, compilable
        ops.LANE_DROPOUT.discard(chk.device.type)
    try:
        model, kind = build(name, shape, chk)
        step = peers.train_step(model, kind, chk.dtype)
        out = {"params": peers.n_params(model)}
        n, peak = peers.mfu_params(shape, chk.cfg["vocab"]), chk.results["meta"]["peak_tflops"]
        for size, batches in work.items():
            out[str(size)] = peers.measure_steps(step, batches, chk.cfg["warmup"], n, peak)
        return out
    finally:
        ops.LANE_DROPOUT.clear()
        ops.LANE_DROPOUT.update(lanes)


def section_train(chk: Check, names=CONTENDERS, need_s: float = 20) -> None:
    for shape in chk.cfg["shapes"]:
        if chk.skip(f"train/{shape}/{','.join(names)}", need_s):
            continue
        n = chk.cfg["warmup"] + chk.cfg["steps"]
        work = {
            size: peers.train_batches(chk.cfg["vocab"], size, n, chk.device)
            for size in chk.cfg["sizes"]
        }
        chk.results.setdefault("train", {}).setdefault(shape, {})["params_mfu"] = peers.mfu_params(
            shape, chk.cfg["vocab"]
        )
        for name in names:
            if name == "hf_marian" and _version("transformers") is None:
                chk.results["skipped"].append(f"train/{shape}/hf_marian: no transformers")
                continue
            chk.run(
                ("train", shape, name),
                need_s,
                lambda name=name, shape=shape, work=work: train_contender(name, shape, work, chk),
            )


def section_loss(chk: Check) -> None:
    for shape in chk.cfg["shapes"]:
        if not chk.skip(f"loss/{shape}", 10):
            loss_variants(chk, shape)


def loss_variants(chk: Check, shape: str) -> None:
    """Forward + backward of the output loss alone, per chunk size and unfused."""
    V, N, D, dev = (
        chk.cfg["vocab"],
        chk.cfg["loss_rows"],
        peers.SHAPES[shape]["d_model"],
        chk.device,
    )
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(N, D, device=dev, generator=g, requires_grad=True)
    w = (torch.randn(V, D, device=dev, generator=g) * D**-0.5).requires_grad_()
    y = torch.randint(4, V, (N,), device=dev, generator=g)
    key = "CHUNK_ELEMENTS_CPU" if dev.type == "cpu" else "CHUNK_ELEMENTS_GPU"

    def once(fused: bool) -> None:
        with torch.autocast(dev.type, dtype=chk.dtype, enabled=chk.dtype != torch.float32):
            loss, _ = output_loss(h, w, y, peers.EPS, fused)
        loss.backward()

    def variant(chunk: int | None) -> float:
        old = getattr(ops, key)
        setattr(ops, key, chunk or old)
        try:
            for _ in range(2):
                once(chunk is not None)
            times, _ = peers.timed(lambda _: once(chunk is not None), range(5), dev)
        finally:
            setattr(ops, key, old)
        return round(1e3 * statistics.median(times), 3)

    for chunk in (1 << 22, 1 << 24, 1 << 26, 1 << 28, None):
        label = "unfused" if chunk is None else f"fused_chunk_2^{chunk.bit_length() - 1}"
        chk.run(("loss", shape, label), 5, lambda chunk=chunk: variant(chunk))


def section_decode(chk: Check, shape: str) -> None:
    if chk.skip(f"decode/{shape}", 30):
        return
    srcs, refs = peers.test_set(chk.cfg["sentences"], chk.cfg["vocab"])
    plan = peers.decode_plan(srcs, refs, chk.cfg["batch_tokens"])
    model = peers.ours(shape, chk.cfg["vocab"], chk.device).eval()
    low = "bf16" if chk.dtype == torch.bfloat16 else "fp32"
    outputs: dict = {}

    def run(name: str, decode) -> dict:
        fig, outputs[name] = peers.time_decode(decode, plan, chk.device)
        return fig

    def ours(precision: str):
        dec = Decoder(model, precision)
        return lambda p: peers.decode_ours(dec, srcs, p, 4)

    meta = {
        "sentences": len(srcs),
        "beam": 4,
        "batches": len(plan),
        "source_tokens": sum(map(len, srcs)),
        "batch_tokens": chk.cfg["batch_tokens"],
    }
    chk.results.setdefault("decode", {})[shape] = {"workload": meta}
    chk.run(("decode", shape, f"ours_{low}"), 30, lambda: run(f"ours_{low}", ours(low)))
    if _version("transformers") is None:
        chk.results["skipped"].append(f"decode/{shape}/hf_generate: no transformers")
    else:

        def hf_generate() -> dict:
            hf = peers.marian_from(model).to(dtype=chk.dtype)
            return run(f"hf_generate_{low}", lambda p: peers.decode_hf(hf, srcs, p, 4))

        chk.run(("decode", shape, f"hf_generate_{low}"), 60, hf_generate)
    if low != "fp32":
        chk.run(("decode", shape, "ours_fp32"), 30, lambda: run("ours_fp32", ours("fp32")))
    a, b = (outputs.get(f"{x}_{low}") for x in ("ours", "hf_generate"))
    if a and b:  # the same weights: mostly the same hypotheses, or the work differs
        meta["same_hypotheses_as_hf"] = round(sum(x == y for x, y in zip(a, b)) / len(a), 3)
    chk.save()


def section_profile(chk: Check) -> None:
    """The top ops of 3 steps of ours at the preset's batch, and the device's busy share."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if chk.device.type == "cuda" else [])
    sort = "device_time_total" if chk.device.type == "cuda" else "cpu_time_total"
    text = []
    for shape in chk.cfg["shapes"]:

        def one(shape=shape) -> dict:
            model, kind = build("ours", shape, chk)
            step = peers.train_step(model, kind, chk.dtype)
            work = peers.train_batches(chk.cfg["vocab"], chk.cfg["sizes"][0], 5, chk.device)
            for b in work[:2]:
                step(b)
            peers.sync(chk.device)
            t = time.perf_counter()
            with profile(activities=acts) as prof:
                for b in work[2:]:
                    step(b)
                peers.sync(chk.device)
            wall = time.perf_counter() - t
            avg = prof.key_averages()
            # kernels alone: an op's self device time repeats its kernels' (the table's total)
            busy = (
                sum(
                    e.self_device_time_total
                    for e in avg
                    if e.device_type != torch.autograd.DeviceType.CPU and not e.is_user_annotation
                )
                / 1e6
            )
            text.append(
                f"## {shape}, 3 steps of {chk.cfg['sizes'][0]} tokens, {wall:.3f} s "
                f"(profiled)\n{avg.table(sort_by=sort, row_limit=30)}\n"
            )
            (chk.args.out / "profile.txt").write_text("\n".join(text))
            return {
                "wall_s": round(wall, 3),
                "device_busy_s": round(busy, 3),
                "device_busy_share": round(busy / wall, 3) if busy else None,
            }

        chk.run(("profile", shape), 20, one)


def section_tests(chk: Check, limit_s: float = 240) -> dict:
    """pytest on tests/test_cuda.py, its output in pytest.log (what it printed if it ran out
    of time, too)."""
    t = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "tests/test_cuda.py",
    ]
    log = chk.args.out / "pytest.log"
    with open(log, "w") as f:
        try:
            code = subprocess.run(
                cmd,
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
                check=False,
                timeout=min(limit_s, chk.remaining() - 30),
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    return {
        "exit_code": code,
        "summary": lines[-1] if lines else "",
        "seconds": round(time.perf_counter() - t, 1),
        "command": " ".join(cmd[2:]),
    }


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
    chk.save()
    shapes = chk.cfg["shapes"]
    # the figures first, the tests after them: a lease is short, and a rerun with --sections
    # can take what the budget left out
    plan = [
        ("loss", lambda: section_loss(chk)),
        ("train", lambda: section_train(chk)),
        ("compile", lambda: section_train(chk, ("ours_compiled",), 5 if args.reduced else 90)),
        ("decode", lambda: section_decode(chk, shapes[0])),
        ("tests", lambda: chk.run(("tests",), 30, lambda: section_tests(chk))),
        ("profile", lambda: section_profile(chk)),
        ("decode", lambda: shapes[1:] and section_decode(chk, shapes[1])),
    ]
    for section, fn in plan:
        if section in sections:
            try:  # a failure outside a measurement (building batches, say) ends the section only
                fn()
            except Exception as e:  # noqa: BLE001
                chk.results["errors"].append(f"{section}: {type(e).__name__}: {e}"[:2000])
    chk.save()
    print(gpu_report.summary(chk.results))


if __name__ == "__main__":
    main()
