"""The distill stage's settings (params.yaml `distill`): how a student's teacher translates the
train sources (read by that stage), whether the originals join the teacher's pairs (read by the
shard stage, so that changing it translates nothing again) and how the race stage times the
student against its teacher (`rounds`)."""

from __future__ import annotations

from dataclasses import dataclass

from transformer.core.settings import ConfigError, at_least, choice

# decode.length_penalty's bound, repeated rather than imported (as backtranslate's): the shard
# stage reads this section (mix_originals) and must not depend on the decode settings' module
MAX_ALPHA = 10.0
SEARCHES = ("beam", "nbest")
METRICS = ("chrf", "bleu")  # sacreBLEU's sentence-level chrF, or BLEU with effective order
DISTILLED = "distilled.{lang}"  # the stage's pairs: the train sources and the teacher's outputs
# the keys the distill stage reads (dvc.yaml lists these, not mix_originals and rounds)
STAGE_KEYS = (
    "search",
    "beam_size",
    "nbest",
    "metric",
    "length_penalty",
    "max_len_a",
    "max_len_b",
    "batch_tokens",
    "precision",
    "chunk_lines",
)


@dataclass
class DistillConfig:
    # beam: the teacher's best beam-search output (Kim & Rush 2016, sequence-level KD). nbest:
    # its `nbest` best outputs, of which the one closest to the reference by `metric` is kept
    # (mozilla/translations' n-best selection by sentence-level chrF)
    search: str = "beam"
    beam_size: int = 4
    nbest: int = 4  # at most beam_size
    metric: str = "chrf"
    length_penalty: float = 0.6
    max_len_a: float = 1.0  # max output length = a * input length + b, as decode's
    max_len_b: int = 50
    batch_tokens: int = 4096  # input tokens per batch, padding included (as decode's)
    precision: str = "fp32"  # fp32 | bf16 | int8 (CPU only), as decode's
    # lines translated, and saved, at a time: a killed run resumes after the last whole chunk
    chunk_lines: int = 5000
    # train on the teacher's pairs and the original ones (true), or on the teacher's alone
    # (Kim & Rush's and the Bergamot students' recipe)
    mix_originals: bool = False
    # the race stage: decodings of the test set per model, student and teacher in turn; the
    # fastest of each counts (the others were slowed by what else ran)
    rounds: int = 3

    def __post_init__(self) -> None:
        choice("distill.search", self.search, SEARCHES)
        choice("distill.metric", self.metric, METRICS)
        choice("distill.precision", self.precision, ("fp32", "bf16", "int8"))
        at_least("distill", self, 1, "beam_size", "nbest", "batch_tokens", "chunk_lines", "rounds")
        at_least("distill", self, 0, "max_len_a", "max_len_b")
        if self.search == "nbest" and self.nbest > self.beam_size:
            raise ConfigError(
                f"distill.nbest ({self.nbest}) must be at most distill.beam_size "
                f"({self.beam_size}): the n-best list is the beam's finished hypotheses"
            )
        if not 0 <= self.length_penalty <= MAX_ALPHA:  # NaN and inf too
            raise ConfigError(
                f"distill.length_penalty must be in [0, {MAX_ALPHA:g}], got {self.length_penalty}"
            )
        if self.max_len_a == 0 and self.max_len_b < 1:
            raise ConfigError("distill.max_len_a and max_len_b are both 0: no output")
