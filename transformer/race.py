"""A student against its teacher (issue 82): both decode the test set on this machine, in this
run, one thread each, each with the settings it is served with; their speeds and scores.

    python -m transformer.race data/model.pt data/tokenizer data/raw data/helpers/teacher \\
        data/race --metrics data/metrics/race.json

The student is the run's model with params.yaml `decode` (the evaluate stage's settings, so its
hypotheses are the evaluate stage's); the teacher is the champion the helpers stage left in
data/helpers/teacher, with the `decode` section of the params.yaml its package carries. They
take turns (distill.rounds rounds of student then teacher) and the fastest round of each counts:
the others were slowed by whatever else ran, and the turns spread such slowdowns over both.
Speed is sentences per second of the whole split (transformer.model.translator.timed, as
evaluate's), on the CPU. The teacher's hypotheses go to OUT/hyps.teacher.txt: the promotion
gate's paired bootstrap of the student against its teacher reads them (flows/distilled.py).
A line without a teacher (not a student) decodes nothing: the metrics say why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from transformer.core import allocator, failure, settings
from transformer.core.files import atomic_dir, sha256_file, write_json
from transformer.core.layout import MODEL, PARAMS, TOKENIZER
from transformer.core.sections import helpers as roles
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.distill import DistillConfig
from transformer.core.sections.download import DownloadConfig
from transformer.core.sections.evaluate import EvaluateConfig
from transformer.core.sections.helpers import HelpersConfig
from transformer.core.settings import ConfigError, build, read_yaml
from transformer.data.vocab import TokenizerError

THREADS = 1  # the rule: what one user's request costs, on one core
TEACHER_HYPS = "hyps.teacher.txt"  # the teacher's translations of the split, in OUT
NONE = "NONE"  # the helpers stage's file saying why a role holds no model


class RaceError(RuntimeError):
    """A missing or mismatched input (model, teacher, split); the message names it."""


def served(teacher: Path) -> DecodeConfig:
    """The teacher's serving settings: the `decode` section of its package's params.yaml."""
    path = teacher / PARAMS
    if not path.is_file():
        raise RaceError(f"{path}: missing (a package carries its params; fetch it again)")
    return build(DecodeConfig, read_yaml(path).get("decode") or {}, "decode", str(path))


def race(translators: dict[str, Any], src: list[str], rounds: int) -> dict[str, Any]:
    """{name: (its hypotheses, its fastest seconds)}: each decodes `src` in turn, `rounds`
    times, all on one thread."""
    from transformer.model.translator import timed

    best: dict[str, Any] = {}
    for _ in range(rounds):
        for name, tr in translators.items():
            hyps, seconds = timed(tr, src)
            if name not in best or seconds < best[name][1]:
                best[name] = (hyps, seconds)
    return best


def figures(tr: Any, hyps: list[str], seconds: float, refs: list[str], lang: str) -> dict:
    from sacrebleu.metrics import BLEU

    return {
        "sentences_per_second": round(len(hyps) / max(seconds, 1e-9), 2),
        "seconds": round(seconds, 3),
        "bleu": round(BLEU(trg_lang=lang).corpus_score(hyps, [refs]).score, 4),
        "beam_size": tr.cfg.beam_size,
        "precision": tr.cfg.precision,
    }


def run(
    model: Path,
    tokenizer: Path,
    raw: Path,
    teacher: Path,
    out_dir: Path,
    decode: DecodeConfig,
    cfg: DistillConfig,
    split: str,
    langs: tuple[str, str],
    pin: str,
) -> dict[str, Any]:
    """The stage: the race, its hypotheses into out_dir; the metrics."""
    record: dict[str, Any] = {"split": split, "threads": THREADS, "rounds": cfg.rounds}
    if not (Path(teacher) / MODEL).is_file():  # not a student: the helpers stage says why
        none = Path(teacher) / NONE
        why = none.read_text().strip() if none.is_file() else f"no {MODEL} in {teacher}"
        with atomic_dir(out_dir) as tmp:
            (tmp / NONE).write_text(why + "\n")
        return {**record, "teacher": None, "skipped": why}
    import torch

    from transformer.model.checkpoint import CheckpointError
    from transformer.model.scoring import read_split
    from transformer.model.translator import DecodeError, load_translator

    torch.set_num_threads(THREADS)
    cpu = torch.device("cpu")
    try:
        src, refs = (read_split(raw, split, lang) for lang in langs)
        tcfg = served(Path(teacher))
        translators = {
            "student": load_translator(model, tokenizer, decode, decode.precision, device=cpu),
            "teacher": load_translator(
                Path(teacher) / MODEL, Path(teacher) / TOKENIZER, tcfg, tcfg.precision, device=cpu
            ),
        }
        best = race(translators, src, cfg.rounds)
    except (CheckpointError, DecodeError) as e:
        raise RaceError(str(e)) from None
    out = {n: figures(translators[n], *best[n], refs, langs[1]) for n in translators}
    line, version = roles.parse_pin(pin)
    out["teacher"].update(line=line, version=version, model_sha256=sha256_file(teacher / MODEL))
    with atomic_dir(out_dir) as tmp:
        (tmp / TEACHER_HYPS).write_text("".join(h + "\n" for h in best["teacher"][0]))
    speedup = out["student"]["sentences_per_second"] / max(
        out["teacher"]["sentences_per_second"], 1e-9
    )
    return {
        **record,
        "sentences": len(src),
        **out,
        "speedup": round(speedup, 3),
        "bleu_gap": round(out["teacher"]["bleu"] - out["student"]["bleu"], 4),
        "hyps": TEACHER_HYPS,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.race",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", type=Path, help="the student: the averaged checkpoint")
    parser.add_argument("tokenizer", type=Path, help="its tokenizer folder")
    parser.add_argument("raw", type=Path, help="folder with {split}.{src_lang,tgt_lang}")
    parser.add_argument("teacher", type=Path, help="the teacher's package folder")
    parser.add_argument("out", type=Path, help="output folder: the teacher's hypotheses")
    parser.add_argument("--metrics", type=Path, help="write the figures here (JSON)")
    parser.add_argument("--params", type=Path, default=settings.PARAMS, help="params.yaml")
    args = parser.parse_args(argv)
    allocator.keep_freed_memory()  # see there: 2x decoding speed on glibc
    try:
        load = settings.load
        dl = load(DownloadConfig, "download", args.params)
        metrics = run(
            *(args.model, args.tokenizer, args.raw, args.teacher, args.out),
            load(DecodeConfig, "decode", args.params),
            load(DistillConfig, "distill", args.params),
            load(EvaluateConfig, "evaluate", args.params).split,
            (dl.src_lang, dl.tgt_lang),
            load(HelpersConfig, "helpers", args.params).teacher,
        )
    except (RaceError, ConfigError, TokenizerError, OSError, UnicodeDecodeError) as e:
        sys.exit(f"error: {e}")
    if args.metrics:
        write_json(args.metrics, metrics)
    if metrics["teacher"] is None:
        print(f"race: no teacher ({metrics['skipped']})")
        return
    s, t = metrics["student"], metrics["teacher"]
    print(
        f"race: student {s['sentences_per_second']:.1f} sentences/s, BLEU {s['bleu']:.2f}; "
        f"teacher {t['sentences_per_second']:.1f}, BLEU {t['bleu']:.2f}: "
        f"{metrics['speedup']:.2f}x, gap {metrics['bleu_gap']:+.2f}"
    )


if __name__ == "__main__":
    failure.recorded("race", main)()
