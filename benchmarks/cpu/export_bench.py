"""One package served three ways, on one test set, in one run: speed, BLEU, same outputs.

    python -m benchmarks.cpu.export_bench data/package data/raw/test.en data/raw/test.de --threads 1

Ours (transformer-translate's Translator, fp32 and int8), the HF export (MarianMTModel.generate)
and the CTranslate2 export (float32 and int8) translate the same sources with the package's
beam size; each prints sentences/s, BLEU and how many outputs equal ours. Two penalties: the
shipped one (ours GNMT ((5+len)/6)^α, theirs len^α with the same α) and α = 0 (no length
normalisation: the one penalty all three share). Every system gets the same threads, batches
of 32 sentences sorted by length and the per-batch length cap a·|src| + b of the decode
section (HF and CTranslate2 take one cap per batch, ours one per sentence). The exports are
written to a temporary folder. Nothing is asserted: it prints a table (--json for the rows).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import yaml
from sacrebleu.metrics import BLEU

from transformer import export
from transformer.core.sections.decode import DecodeConfig
from transformer.model.translator import load_translator

BATCH = 32


def batches(tok, lines: list[str]) -> list[list[int]]:
    """Indices of `lines` sorted by tokenized length, in batches of BATCH."""
    lens = [len(ids) for ids in tok(lines)["input_ids"]]
    order = sorted(range(len(lines)), key=lens.__getitem__)
    return [order[i : i + BATCH] for i in range(0, len(order), BATCH)]


def cap(cfg: DecodeConfig, n_src: int) -> int:
    return int(cfg.max_len_a * n_src) + cfg.max_len_b


def run_ours(pkg: Path, lines: list[str], cfg: DecodeConfig, precision: str) -> list[str]:
    tr = load_translator(
        pkg / "model.pt", pkg / "tokenizer", cfg, precision, (), torch.device("cpu")
    )
    return tr.translate(lines)


def run_hf(hf_dir: Path, lines: list[str], cfg: DecodeConfig) -> list[str]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    out = [""] * len(lines)
    for b in batches(tok, lines):
        enc = tok([lines[i] for i in b], return_tensors="pt", padding=True)
        with torch.inference_mode():
            ids = model.generate(
                **enc,
                num_beams=cfg.beam_size,
                length_penalty=cfg.length_penalty,
                max_new_tokens=cap(cfg, enc.input_ids.size(1)),
            )
        for i, text in zip(b, tok.batch_decode(ids, skip_special_tokens=True)):
            out[i] = text
    return out


def run_ct2(ct2_dir: Path, lines: list[str], cfg: DecodeConfig, threads: int) -> list[str]:
    import ctranslate2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ct2_dir)
    tr = ctranslate2.Translator(str(ct2_dir), device="cpu", intra_threads=threads)
    out = [""] * len(lines)
    for b in batches(tok, lines):
        src = [tok.convert_ids_to_tokens(tok.encode(lines[i])) for i in b]
        res = tr.translate_batch(
            src,
            beam_size=cfg.beam_size,
            length_penalty=cfg.length_penalty,
            max_decoding_length=cap(cfg, max(map(len, src))),
        )
        for i, r in zip(b, res):
            out[i] = tok.decode(
                tok.convert_tokens_to_ids(r.hypotheses[0]), skip_special_tokens=True
            )
    return out


def measure(fn, n: int) -> tuple[list[str], float]:
    t0 = time.perf_counter()
    out = fn()
    return out, n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cpu.export_bench", description=__doc__
    )
    parser.add_argument("package", type=Path)
    parser.add_argument("src", type=Path)
    parser.add_argument("ref", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=0, help="the first N lines only")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lines = args.src.read_text(encoding="utf-8").splitlines()
    refs = args.ref.read_text(encoding="utf-8").splitlines()
    if args.limit:
        lines, refs = lines[: args.limit], refs[: args.limit]
    params = yaml.safe_load((args.package / "params.yaml").read_text()) or {}
    shipped = DecodeConfig(**(params.get("decode") or {}))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hf, ct2, ct2_int8 = (Path(tmp) / n for n in ("hf", "ct2", "ct2_int8"))
        export.export(args.package, "hf", hf)
        export.export(args.package, "ctranslate2", ct2, "float32")
        export.export(args.package, "ctranslate2", ct2_int8, "int8")
        for penalty in (shipped.length_penalty, 0.0):
            cfg = replace(shipped, length_penalty=penalty)
            systems = {
                "ours fp32": partial(run_ours, args.package, lines, cfg, "fp32"),
                "ours int8": partial(run_ours, args.package, lines, cfg, "int8"),
                "HF MarianMTModel fp32": partial(run_hf, hf, lines, cfg),
                "CTranslate2 float32": partial(run_ct2, ct2, lines, cfg, args.threads),
                "CTranslate2 int8": partial(run_ct2, ct2_int8, lines, cfg, args.threads),
            }
            base = None
            for name, fn in systems.items():
                out, speed = measure(fn, len(lines))
                base = base or out
                rows.append(
                    {
                        "system": name,
                        "alpha": penalty,
                        "beam": cfg.beam_size,
                        "sentences_per_s": round(speed, 1),
                        "bleu": round(BLEU().corpus_score(out, [refs]).score, 2),
                        "same_as_ours_fp32": sum(a == b for a, b in zip(out, base)),
                        "n": len(lines),
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr)
    print("| system | α | beam | sentences/s | BLEU | outputs = ours fp32 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['system']} | {r['alpha']} | {r['beam']} | {r['sentences_per_s']} | "
            f"{r['bleu']} | {r['same_as_ours_fp32']}/{r['n']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
