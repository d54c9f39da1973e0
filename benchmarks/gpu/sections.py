"""The GPU check's sections beside the training contenders: the output loss alone, decoding
(ours against HF generate), the profile of ours's update, and tests/test_cuda.py. See
benchmarks/gpu/check.py."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import torch

from benchmarks.common import ROOT, version
from benchmarks.gpu import peers
from benchmarks.gpu import train as gpu_train
from transformer.model import ops
from transformer.model.incremental import Decoder
from transformer.model.ops import output_loss


def section_loss(chk) -> None:
    for shape in chk.cfg["shapes"]:
        if not chk.skip(f"loss/{shape}", 10):
            loss_variants(chk, shape)


def loss_variants(chk, shape: str) -> None:
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


def section_decode(chk, shape: str) -> None:
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
    if version("transformers") is None:
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


def section_profile(chk) -> None:
    """The top ops of 3 updates of ours and of ours_eager at the presets' batch: ATen ops the
    host dispatches per update (nested ones too) and the device's busy share."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if chk.device.type == "cuda" else [])
    sort = "device_time_total" if chk.device.type == "cuda" else "cpu_time_total"
    text, size = [], chk.cfg["sizes"][0]
    for shape in chk.cfg["shapes"]:

        def one(shape=shape, name="ours") -> dict:
            le = gpu_train.learner(name, shape, chk.cfg["vocab"], chk.device, chk.dtype)
            step = gpu_train.learner_step(le)
            work = peers.train_batches(
                chk.cfg["vocab"], size, 3, None, static=le.static, pairs=chk.cfg["pairs"]
            )
            for _ in range(gpu_train.PRIME if le.graphs is not None else 1):
                for b in work:
                    step(b)
            peers.sync(chk.device)
            t = time.perf_counter()
            with profile(activities=acts) as prof:
                for b in work:
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
                f"## {shape}, {name}, 3 updates of {size} tokens, {wall:.3f} s "
                f"(profiled)\n{avg.table(sort_by=sort, row_limit=30)}\n"
            )
            (chk.args.out / "profile.txt").write_text("\n".join(text))
            return {
                "wall_s": round(wall, 3),
                "aten_ops_per_update": round(
                    sum(e.count for e in avg if e.key.startswith("aten::")) / len(work)
                ),
                "device_busy_s": round(busy, 3),
                "device_busy_share": round(busy / wall, 3) if busy else None,
            }

        for name in ("ours", "ours_eager"):
            chk.run(("profile", shape, name), 20, lambda shape=shape, name=name: one(shape, name))


def preflight(device: torch.device) -> dict:
    """What the sections need, found in a few seconds: the device, its driver and free memory,
    torch's and Triton's versions, and the C compiler and Python.h with which Triton builds
    its launchers at run time (inductor: the compiled contender and test); `inductor` False
    says those cannot run."""
    out: dict = {"torch": torch.__version__, "cuda": torch.version.cuda}
    out["triton"] = version("triton")
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        out["gpu_free_gib"], out["gpu_total_gib"] = round(free / 2**30, 1), round(total / 2**30, 1)
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        out["driver"] = smi("driver_version")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    out["c_compiler"], out["python_h"] = cc, str(header) if header.exists() else None
    missing = [
        what
        for what, ok in (
            ("a C compiler (cc, gcc or clang; or $CC)", cc),
            (f"Python.h ({header})", header.exists()),
            ("triton", device.type != "cuda" or out["triton"]),
        )
        if not ok
    ]
    out["inductor"] = not missing
    out["inductor_missing"] = missing
    return out


def smi(field: str) -> str | None:
    """nvidia-smi's answer for the fields asked (read only), or None without a driver."""
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def section_tests(chk, limit_s: float = 300, per_test_s: int = 150) -> dict:
    """pytest on tests/test_cuda.py, each test stopped after per_test_s (failing by its name),
    its output in pytest.log (what it printed if it ran out of time, too). Without what
    inductor needs (the preflight), the compiled test is left out."""
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"]
    cmd += ["-p", "benchmarks.gpu.test_limit", "--noconftest", "tests/test_cuda.py"]
    if not chk.results.get("preflight", {}).get("inductor", True):
        cmd += ["-k", "not compiled"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPU_TEST_LIMIT_S": str(per_test_s)}
    log = chk.args.out / "pytest.log"
    with open(log, "w") as f:
        try:
            code = subprocess.run(
                cmd,
                cwd=ROOT,
                env=env,
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
        "failed": [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))],
        "seconds": round(time.perf_counter() - t, 1),
        "per_test_limit_s": per_test_s,
        "command": " ".join(cmd[2:]),
    }
