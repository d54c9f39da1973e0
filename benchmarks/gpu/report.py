"""What benchmarks/gpu/check.py's raw figures say: the ratios, the issue's goals, the decision
rules of its docstring applied, and summary.md. Pure functions of the results dict."""

from __future__ import annotations

PEERS = ("hf_marian", "torch_transformer")
# ours's variants, each against its baseline
VARIANTS = (
    ("ours", "ours_eager"),
    ("ours_unfused_loss", "ours"),
    ("ours_torch_dropout", "ours"),
    ("ours_compiled", "ours"),
)
PRESET_BATCH = "3125"  # the presets' tokens per side per GPU


def _rate(run: dict | None, size: str) -> float | None:
    fig = (run or {}).get(size)
    return fig.get("tokens_per_s") if isinstance(fig, dict) else None


def _div(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def train_ratios(train: dict) -> dict:
    """Per shape and batch size: ours over each peer and the fastest, and ours's variants over
    ours."""
    out: dict = {}
    for shape, runs in train.items():
        ours = runs.get("ours") or {}
        for size in (k for k in ours if k.isdigit()):
            r = {f"ours/{p}": _div(_rate(ours, size), _rate(runs.get(p), size)) for p in PEERS}
            fastest = max((x for p in PEERS if (x := _rate(runs.get(p), size))), default=None)
            r["ours/fastest_peer"] = _div(_rate(ours, size), fastest)
            for variant, base in VARIANTS:
                r[f"{variant}/{base}"] = _div(
                    _rate(runs.get(variant), size), _rate(runs.get(base), size)
                )
            out.setdefault(shape, {})[size] = r
    return out


def decode_ratios(decode: dict) -> dict:
    out = {}
    for shape, runs in decode.items():
        for low in ("bf16", "fp32"):
            a, b = runs.get(f"ours_{low}"), runs.get(f"hf_generate_{low}")
            if a and b:
                out.setdefault(shape, {})[f"ours_{low}/hf_generate_{low}"] = _div(
                    a["sentences_per_s"], b["sentences_per_s"]
                )
    return out


def goals(r: dict, ratios: dict) -> list[dict]:
    """The issue's goals, per measured batch size: value and whether it is met."""
    out = []
    for shape, floor, goal in (("base", 0.25, 0.40), ("big", 0.40, 0.40)):
        runs = (r.get("train") or {}).get(shape) or {}
        x = ratios["train"].get(shape, {}).get(PRESET_BATCH, {}).get("ours/ours_eager")
        if x is not None:
            out.append(
                {
                    "goal": f"{shape} ours >= 3x the eager update, {PRESET_BATCH} tok",
                    "value": x,
                    "met": x >= 3.0,
                }
            )
        for size, fig in (runs.get("ours") or {}).items():
            if isinstance(fig, dict) and fig.get("mfu") is not None:
                out.append(
                    {
                        "goal": f"{shape} MFU >= {goal:.0%} (floor {floor:.0%}), {size} tok",
                        "value": fig["mfu"],
                        "met": fig["mfu"] >= goal,
                        "floor_met": fig["mfu"] >= floor,
                    }
                )
        for size, rs in ratios["train"].get(shape, {}).items():
            x = rs["ours/fastest_peer"]
            out.append(
                {
                    "goal": f"{shape} ours >= 1.3x the fastest peer, {size} tok",
                    "value": x,
                    "met": None if x is None else x >= 1.3,
                }
            )
    for shape, rs in ratios["decode"].items():
        for name, x in rs.items():
            out.append({"goal": f"decode {shape} beam 4: {name} >= 3", "value": x, "met": x >= 3.0})
    return out


RULES = (  # (variant, its baseline, bar at the presets' batch, floor at every size, what)
    ("ours_unfused_loss", "ours", 1.05, 0.98, "Transformer.fused_loss False on CUDA"),
    ("ours_torch_dropout", "ours", 1.03, 0.98, "F.dropout on CUDA (ops.LANE_DROPOUT - cuda)"),
    ("ours_compiled", "ours", 1.10, 0.0, "torch.compile in the train stage"),
)


def rules(r: dict, ratios: dict) -> list[str]:
    """The docstring's decision rules, applied where their figures exist."""
    shapes = [s for s in ("base", "big") if s in ratios["train"]]
    if len(shapes) < 2:
        return ["decision rules: need base and big on a GPU (not this run)"]
    out = []
    for variant, base, bar, floor, what in RULES:
        key = f"{variant}/{base}"
        at = [ratios["train"][s].get(PRESET_BATCH, {}).get(key) for s in shapes]
        every = [x[key] for s in shapes for x in ratios["train"][s].values() if x.get(key)]
        if None in at:
            out.append(f"{what}: not measured")
            continue
        ok = all(x >= bar for x in at) and all(x >= floor for x in every)
        if variant == "ours_compiled":  # compiling (and capturing) must cost < 2 minutes in all
            ok = (
                ok
                and sum(
                    fig.get("prime_s", fig.get("warmup_s", 0.0))
                    for s in shapes
                    for size, fig in r["train"][s][variant].items()
                    if size.isdigit()
                )
                < 120
            )
        out.append(
            f"{what}: {'ADOPT' if ok else 'keep as is'} ({key} at {PRESET_BATCH} tokens: "
            f"{', '.join(f'{s} {x}' for s, x in zip(shapes, at))}; all sizes "
            f"{min(every)}-{max(every)})"
        )
    loss = (r.get("loss") or {}).get("big") or {}
    today = f"fused_chunk_2^{r['meta']['gpu_loss_chunk'].bit_length() - 1}"
    fused = {k: v for k, v in loss.items() if k.startswith("fused") and v}
    if loss.get(today) and fused:
        best = min(fused, key=fused.get)
        change = loss[today] / fused[best] >= 1.05
        out.append(
            f"GPU loss chunk: {'use ' + best if change else 'keep ' + today} ({best} "
            f"{fused[best]} ms, {today} {loss[today]} ms; unfused {loss.get('unfused')} ms)"
        )
    return out


PRESETS = {"base": "wmt14-en-de-base", "big": "wmt14-en-de-big"}


def projection(train: dict) -> list[dict]:
    """Hours of each preset's full run from ours's measured steps, on the preset's nproc GPUs
    (each a max_tokens micro-batch a step) and on one GPU (the same update as update_freq
    micro-batches of the measured size with the highest tokens/s). Assumes perfect data-parallel
    scaling (the gradient all-reduce hidden behind the backward pass): a lower bound."""
    from transformer.core.presets import preset_params

    out = []
    for shape, preset in PRESETS.items():
        ours = (train.get(shape) or {}).get("ours") or {}
        t = preset_params(preset)["train"]
        update = t["max_tokens"] * t["nproc"] * t["update_freq"]  # padded tokens per side
        per_gpu = ours.get(str(t["max_tokens"]))
        if not per_gpu:
            continue
        best = max((k for k in ours if k.isdigit()), key=lambda k: ours[k]["tokens_per_s"])
        step = {
            k: ours[k]["tgt_tokens_per_step"] / ours[k]["tokens_per_s"] for k in ours if k.isdigit()
        }  # seconds per micro-batch
        hours = {
            t["nproc"]: t["max_steps"] * step[str(t["max_tokens"])] / 3600,
            1: t["max_steps"] * update / int(best) * step[best] / 3600,
        }
        for gpus, h in sorted(hours.items()):
            out.append(
                {
                    "preset": preset,
                    "steps": t["max_steps"],
                    "update_tokens": update,
                    "gpus": gpus,
                    "micro_batch": t["max_tokens"] if gpus > 1 else int(best),
                    "hours": round(h, 1),
                }
            )
    return out


def derived(r: dict) -> dict:
    ratios = {
        "train": train_ratios(r.get("train") or {}),
        "decode": decode_ratios(r.get("decode") or {}),
    }
    return {
        "ratios": ratios,
        "goals": goals(r, ratios),
        "rules": rules(r, ratios),
        "projection": projection(r.get("train") or {}),
    }


def _fmt(x, pct: bool = False) -> str:
    if x is None:
        return "–"
    return f"{100 * x:.1f}%" if pct else f"{x:,}"


def summary(r: dict) -> str:
    """summary.md: the device, the command, then a table per section."""
    m, d = r["meta"], derived(r)
    out = [
        f"# GPU check on {m['device_name']} ({m['device']})",
        "",
        (
            f"`{m['command']}`: torch {m['torch']}, CUDA {m['cuda']}, transformers "
            f"{m['transformers']}, {m['precision']}; peak {m['peak_tflops']} TFLOP/s "
            f"({m['peak_source']}); {m.get('elapsed_s')} s of {m['budget_s']}."
        ),
        "",
        f"MFU = {m['mfu']}.",
        "",
    ]
    if r.get("preflight"):
        out += ["Preflight: " + ", ".join(f"{k} {v}" for k, v in r["preflight"].items()), ""]
    if r.get("sections_s"):
        times = ", ".join(f"{k} {v} s" for k, v in r["sections_s"].items())
        out += [f"Section times: {times}.", ""]
    if "tests" in r:
        t = r["tests"]
        out += [f"Tests (`{t['command']}`): exit {t['exit_code']}, {t['summary']}", ""]
    for shape, runs in (r.get("loss") or {}).items():
        out += [
            f"Output loss alone, {shape}, fwd+bwd ms: "
            + ", ".join(f"{k} {v}" for k, v in runs.items()),
            "",
        ]
    for shape, runs in (r.get("train") or {}).items():
        out += [
            f"## Training, {shape} ({runs.get('params_mfu'):,} parameters)",
            "",
            (
                "| contender | tokens/side | target tok/s | cold tok/s | step ms | MFU | peak GiB "
                "| tgt pad eff | prime s | graphs | ours ÷ it |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, run in runs.items():
            if not isinstance(run, dict) or name == "draw":
                continue
            for size, fig in ((k, v) for k, v in run.items() if k.isdigit()):
                if "tokens_per_s" not in fig:
                    continue
                ratio = _div(_rate(runs.get("ours"), size), fig["tokens_per_s"])
                out.append(
                    f"| {name} | {int(size):,} | {_fmt(fig['tokens_per_s'])} | "
                    f"{_fmt(fig.get('tokens_per_s_cold'))} | {_fmt(fig['step_ms_median'])} | "
                    f"{_fmt(fig['mfu'], True)} | {_fmt(fig['peak_mem_gib'])} | "
                    f"{_fmt(fig.get('tgt_pad_efficiency'), True)} | {_fmt(fig.get('prime_s'))} | "
                    f"{_fmt(fig.get('graphs'))} | {_fmt(ratio)} |"
                )
        out.append("")
        draws = [
            f"{int(size):,} tokens {_fmt(d['static']['tgt_pad_efficiency'], True)} static, "
            f"{_fmt(d['any_shape']['tgt_pad_efficiency'], True)} any shape"
            for size, d in (runs.get("draw") or {}).items()
        ]
        if draws:
            pairs = next(iter(runs["draw"].values()))["static"]["pairs"]
            out += [f"Targets' pad efficiency of an epoch ({pairs:,} pairs): {'; '.join(draws)}."]
            out.append("")
    for shape, runs in (r.get("decode") or {}).items():
        w = runs.get("workload", {})
        out += [
            (
                f"## Decoding, {shape}: {w.get('sentences')} sentences, beam {w.get('beam')}, "
                f"same hypotheses as HF: {w.get('same_hypotheses_as_hf', '–')}"
            ),
            "",
            "| contender | sentences/s | tokens/s | seconds |",
            "|---|---|---|---|",
        ]
        out += [
            f"| {k} | {v['sentences_per_s']} | {_fmt(v['tokens_per_s'])} | {v['seconds']} |"
            for k, v in runs.items()
            if k != "workload"
        ]
        out.append("")
    if d["projection"]:
        out += [
            "## Projected wall time of the presets (perfect data-parallel scaling)",
            "",
            "| preset | steps | tokens/update | GPUs | micro-batch | hours |",
            "|---|---|---|---|---|---|",
        ]
        out += [
            f"| {p['preset']} | {p['steps']:,} | {p['update_tokens']:,} | {p['gpus']} | "
            f"{p['micro_batch']:,} | {p['hours']} |"
            for p in d["projection"]
        ]
        out.append("")
    out += ["## Goals", ""] + [
        f"- {g['goal']}: {g['value']} ({'met' if g['met'] else 'not met'})" for g in d["goals"]
    ]
    out += ["", "## Decision rules", ""] + [f"- {x}" for x in d["rules"]]
    for key in ("skipped", "errors"):
        if r.get(key):
            out += ["", f"## {key.capitalize()}", ""] + [f"- {x}" for x in r[key]]
    return "\n".join(out)
