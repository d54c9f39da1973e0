"""params.yaml as typed dataclasses: one section per stage; unknown keys, bad values are errors.

`load(TrainConfig, "train")` reads one section. Defaults are the offline demo; a preset
(presets/NAME.yaml) overrides some of them and `python -m transformer.config preset NAME`
writes the merged result to params.yaml, which stays the one config every stage reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import yaml

from transformer.files import atomic_write

PARAMS = Path("params.yaml")
PRESETS = Path(__file__).resolve().parent.parent / "presets"
T = TypeVar("T")


class ConfigError(ValueError):
    """A params.yaml problem, always naming the file and the dotted key."""


def _choice(key: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ConfigError(f"{key} must be one of {', '.join(options)}, got {value!r}")


def _at_least(section: str, obj: Any, low: float, *keys: str) -> None:
    for k in keys:
        if getattr(obj, k) < low:
            raise ConfigError(f"{section}.{k} must be >= {low}, got {getattr(obj, k)}")


def _fraction(section: str, obj: Any, *keys: str) -> None:
    for k in keys:
        if not 0.0 <= getattr(obj, k) < 1.0:
            raise ConfigError(f"{section}.{k} must be in [0, 1), got {getattr(obj, k)}")


# ----------------------------------------------------------------------------- download
@dataclass
class CleanConfig:
    nfc: bool = True  # Unicode NFC
    normalize_whitespace: bool = True  # collapse runs of whitespace, strip ends
    remove_control: bool = True  # drop control characters (C0/C1 except tab)
    min_words: int = 1  # pairs with fewer words on either side are dropped
    max_words: int = 250  # ... or more (fairseq clean-corpus-n)
    max_ratio: float = 1.5  # word-count ratio bound; 0 disables
    dedup: bool = True  # drop exact duplicate pairs in train
    drop_eval_overlap: bool = True  # drop train pairs whose src or tgt is in valid/test
    # valid / test: off, they stay as released (as sacreBLEU reads them); on, the filters above
    # and the normalisation (control, NFC, whitespace) apply to them too, labelled in the metrics
    filter_eval: bool = False
    normalize_eval: bool = False

    def eval_cleanup(self) -> str:
        """What the download stage changes in valid and test, in words: the label the manifest
        and the evaluate metrics carry ("none": as released, as sacreBLEU reads the file)."""
        done = []
        if self.normalize_eval:
            steps = [
                k for k in ("remove_control", "nfc", "normalize_whitespace") if getattr(self, k)
            ]
            done.append(f"normalized ({', '.join(['line breaks', *steps])})")
        if self.filter_eval:
            done.append("filtered (empty, length, ratio, duplicates)")
        return "; ".join(done) or "none"


@dataclass
class SyntheticConfig:
    train: int = 20000
    valid: int = 500
    test: int = 500
    seed: int = 1


@dataclass
class SourceSpec:
    """One corpus part: local file(s), a URL or an archive, or a Hugging Face split.

    `path` (and `src` / `tgt`) may hold "{lang}", replaced by each side's language. For an
    archive (.tgz, .tar.gz, .tar, .tar.bz2, .tar.xz) `src` / `tgt` name the members inside it.
    """

    path: str = ""  # file, archive or http(s) URL; hf: the dataset path (default download.hf_path)
    format: str = "text"  # text (two files) | sgm (two files) | tsv | jsonl | hf
    src: str = ""  # source-side file or archive member; default: path with {lang}
    tgt: str = ""  # target-side file or archive member
    sha256: str = ""  # of the downloaded file; checked when given
    name: str = ""  # the part's name in the manifest; default: from the file names
    hf_split: str = ""  # hf: the dataset split (train / validation / test)


SOURCES = ("synthetic", "local", "wmt", "hf")


@dataclass
class DownloadConfig:
    source: str = "synthetic"  # synthetic | local | wmt | hf
    src_lang: str = "en"
    tgt_lang: str = "de"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    # split -> list of parts, used by the local / hf / wmt sources
    splits: dict[str, list[SourceSpec]] = field(default_factory=dict)
    hf_path: str = "wmt/wmt14"  # a Hub id or a local folder with the Hub layout
    hf_name: str = "de-en"
    hf_revision: str = ""  # a Hub commit / tag; empty: the default branch
    hf_cache_dir: str = ""  # datasets' cache; empty: its default ($HF_DATASETS_CACHE or ~/.cache)
    cache_dir: str = ".cache/download"  # downloads (resumable .part files) and extracted archives
    # an http(s) URL whose scheme and host (and path, put first) replace those of every part URL:
    # a local copy of www.statmt.org, e.g. http://127.0.0.1:8000; empty: the URLs as written
    mirror: str = ""
    retries: int = 5  # HTTP attempts after the first, with exponential backoff
    backoff: float = 2.0  # seconds before the first retry, doubled each time
    timeout: float = 60.0  # seconds without data before an HTTP attempt fails

    def __post_init__(self) -> None:
        _choice("download.source", self.source, SOURCES)
        _at_least("download", self, 0, "retries", "backoff")
        if self.timeout <= 0:
            raise ConfigError(f"download.timeout must be > 0 seconds, got {self.timeout}")
        mirror = urlparse(self.mirror)
        if self.mirror and (mirror.scheme not in ("http", "https") or not mirror.netloc):
            raise ConfigError(
                f"download.mirror must be an http(s)://host[:port] URL, got {self.mirror!r}"
            )


# ----------------------------------------------------------------------------- tokenizer
@dataclass
class TokenizerConfig:
    type: str = "bpe"  # bpe (joint, paper en-de) | wordpiece (paper en-fr)
    vocab_size: int = 2000  # all units: 4 specials + 256 bytes (x2 for wordpiece) + merges
    min_frequency: int = 2  # a merge must occur this often in the train split

    def __post_init__(self) -> None:
        if self.type not in ("bpe", "wordpiece"):
            raise ConfigError(f"tokenizer.type must be bpe or wordpiece, got {self.type!r}")


# ----------------------------------------------------------------------------- shard
@dataclass
class ShardConfig:
    max_len: int = 256  # tokens per side, EOS included; longer pairs are dropped and counted
    shard_pairs: int = 1_000_000  # pairs per shard file at most (bounds the stage's memory)
    # BPE-dropout (Provilkov et al. 2020; not in the paper): the train split is encoded
    # `train_copies` times, each time skipping every merge with probability `bpe_dropout`, so
    # the model sees the same sentence cut into different units. Valid / test are never dropped.
    bpe_dropout: float = 0.0
    train_copies: int = 1

    def __post_init__(self) -> None:
        _at_least("shard", self, 2, "max_len")
        _at_least("shard", self, 1, "shard_pairs", "train_copies")
        _fraction("shard", self, "bpe_dropout")
        if self.train_copies > 1 and not self.bpe_dropout:
            raise ConfigError(
                f"shard.train_copies is {self.train_copies} but shard.bpe_dropout is 0: the "
                "copies would be identical (set bpe_dropout, e.g. 0.1, or train_copies: 1)"
            )


# ----------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    d_model: int = 128
    d_ff: int = 512
    n_heads: int = 4
    n_layers: int = 2  # N in the paper, for encoder and decoder alike
    dropout: float = 0.1  # §5.4 P_drop: sub-layer outputs and embeddings + positions
    attention_dropout: float = 0.0  # on attention weights (not in the paper; tensor2tensor's)
    activation_dropout: float = 0.0  # after the FFN's ReLU (not in the paper)
    pre_ln: bool = False  # post-LN is the paper's; pre-LN is offered as an option
    tie_embeddings: bool = True  # §3.4: one matrix for source, target and output (joint vocab)
    # shared: the softmax spans the whole joint vocabulary (§3.4). target: only the units that
    # occur in the training targets (5.4k of 8k on Multi30k de), fewer FLOPs, the same weights
    output_vocab: str = "shared"
    max_positions: int = 1024

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.d_model % 2:
            raise ConfigError(f"model.d_model ({self.d_model}) must be even (sin/cos pairs, §3.5)")
        _at_least("model", self, 1, "d_model", "d_ff", "n_heads", "n_layers", "max_positions")
        _fraction("model", self, "dropout", "attention_dropout", "activation_dropout")
        _choice("model.output_vocab", self.output_vocab, ("shared", "target"))


# ----------------------------------------------------------------------------- train
@dataclass
class TrainConfig:
    nproc: int = 1  # torchrun --nproc_per_node
    seed: int = 1
    max_tokens: int = 4096  # per process and micro-batch, padded positions, each side
    update_freq: int = 1  # gradient accumulation: micro-batches per update
    max_steps: int = 600
    time_budget_minutes: float = 0.0  # stop after this much training wall time; 0 = none
    warmup_steps: int = 4000  # §5.3
    lr_scale: float = 1.0  # multiplies the §5.3 rate
    label_smoothing: float = 0.1  # §5.4
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # §5.3
    adam_eps: float = 1e-9
    clip_norm: float = 0.0  # 0 = no clipping (the paper does not clip)
    precision: str = "fp32"  # fp32 | bf16 | fp16 (CUDA only) | auto (bf16 where native, else fp32)
    save_every_steps: int = 100
    save_every_minutes: float = 10.0  # §6.1: checkpoints at 10-minute intervals
    keep_last: int = 5
    valid_every_steps: int = 100
    log_every_steps: int = 10
    threads: int = 0  # torch.set_num_threads; 0 = torch's default
    lr_decay: str = "none"  # none (§5.3) | linear | cosine: x(1 - progress) to 0 at the end
    fused_adam: bool = True  # one fused kernel for Adam (CPU and CUDA); False = foreach
    static_shapes: str = "auto"  # on | off | auto (on with CUDA): a bounded set of batch shapes
    graphs: str = "auto"  # auto (CUDA, static shapes, one process, not fp16) | off: CUDA graphs
    compile: bool = False  # torch.compile the loss (fullgraph, dynamic shapes)

    def __post_init__(self) -> None:
        _choice("train.precision", self.precision, ("fp32", "bf16", "fp16", "auto"))
        _choice("train.static_shapes", self.static_shapes, ("auto", "on", "off"))
        _choice("train.graphs", self.graphs, ("auto", "off"))
        _choice("train.lr_decay", self.lr_decay, ("none", "linear", "cosine"))
        _at_least(
            "train",
            self,
            1,
            "nproc",
            "max_tokens",
            "update_freq",
            "warmup_steps",
            "log_every_steps",
        )
        _at_least(
            "train",
            self,
            0,
            "max_steps",
            "time_budget_minutes",
            "clip_norm",
            "save_every_steps",
            "save_every_minutes",
            "keep_last",
            "valid_every_steps",
            "threads",
        )
        if self.lr_scale <= 0:
            raise ConfigError(f"train.lr_scale must be > 0, got {self.lr_scale}")
        if self.max_steps < 1 and self.time_budget_minutes <= 0:
            raise ConfigError("train.max_steps must be >= 1 unless time_budget_minutes is set")
        _fraction("train", self, "label_smoothing")
        if len(self.adam_betas) != 2:
            raise ConfigError(f"train.adam_betas must be two numbers, got {self.adam_betas}")


# ----------------------------------------------------------------------------- average
@dataclass
class AverageConfig:
    last_k: int = 5  # §6.1: 5 for base, 20 for big
    by: str = "steps"  # steps | time (pick checkpoints at least interval_minutes apart)
    interval_minutes: float = 10.0

    def __post_init__(self) -> None:
        _choice("average.by", self.by, ("steps", "time"))
        _at_least("average", self, 1, "last_k")
        _at_least("average", self, 0, "interval_minutes")


# ----------------------------------------------------------------------------- decode
MAX_ALPHA = 10.0  # GNMT used 0.6-1, the Multi30k preset 2.0; ((5+|Y|)/6)^1e6 overflows


@dataclass
class DecodeConfig:
    beam_size: int = 4  # §6.1
    length_penalty: float = 0.6  # §6.1 alpha
    max_len_a: float = 1.0  # max output length = a * src_len + b (§6.1: src + 50)
    max_len_b: int = 50
    batch_tokens: int = 4096  # source tokens per batch, padding included (x beam_size rows)
    precision: str = "fp32"  # fp32 | bf16 (autocast) | int8 (dynamic quantization of Linears)

    def __post_init__(self) -> None:
        _choice("decode.precision", self.precision, ("fp32", "bf16", "int8"))
        _at_least("decode", self, 1, "beam_size", "batch_tokens")
        _at_least("decode", self, 0, "max_len_a", "max_len_b")
        if not 0 <= self.length_penalty <= MAX_ALPHA:  # NaN and inf too
            raise ConfigError(
                f"decode.length_penalty must be in [0, {MAX_ALPHA:g}], got {self.length_penalty}"
            )
        if self.max_len_a == 0 and self.max_len_b < 1:
            raise ConfigError(
                "decode.max_len_a and decode.max_len_b are both 0: no output "
                "could be longer than 0 tokens"
            )


# ----------------------------------------------------------------------------- evaluate
@dataclass
class EvaluateConfig:
    split: str = "test"
    tokenized_bleu: bool = True  # also the paper's tokenized, compound-split BLEU

    def __post_init__(self) -> None:
        _choice("evaluate.split", self.split, ("train", "valid", "test"))


# ----------------------------------------------------------------------------- retrain
@dataclass
class RetrainConfig:
    """Read by flows/ only (the promotion gate); no stage depends on it. The champion is a git
    tag (flows/registry.py), not a setting."""

    margin: float = 0.0  # promote a candidate only if its BLEU beats the champion's by more

    def __post_init__(self) -> None:
        if not 0 <= self.margin < float("inf"):  # NaN too: it would never promote
            raise ConfigError(f"retrain.margin must be a number >= 0, got {self.margin}")


SECTIONS: dict[str, type] = {
    "download": DownloadConfig,
    "tokenizer": TokenizerConfig,
    "shard": ShardConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "average": AverageConfig,
    "decode": DecodeConfig,
    "evaluate": EvaluateConfig,
    "retrain": RetrainConfig,
}


def _build(tp: Any, value: Any, key: str, src: str) -> Any:
    """Convert `value` to type `tp`, recursing into dataclasses, lists and dicts."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{src}: {key} must be a mapping, got {value!r}")
        hints = typing.get_type_hints(tp)
        _known_keys(tp, value, key, src)
        kwargs = {k: _build(hints[k], v, f"{key}.{k}", src) for k, v in value.items()}
        try:
            return tp(**kwargs)
        except ConfigError as e:
            raise ConfigError(f"{src}: {e}") from None
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{src}: {key} must be a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_build(item, v, f"{key}[{i}]", src) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{src}: {key} must be a mapping, got {value!r}")
        _, item = typing.get_args(tp)
        return {k: _build(item, v, f"{key}.{k}", src) for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and (
        not isinstance(value, tp) or (isinstance(value, bool) and tp is not bool)
    ):
        raise ConfigError(f"{src}: {key} must be {tp.__name__}, got {value!r}")
    return value


def read_yaml(path: Path) -> Any:
    """`path` parsed, or a ConfigError naming the file, line and column of a syntax error."""
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{path}: not valid YAML: {where}{getattr(e, 'problem', e)}") from None


def read_params(path: Path = PARAMS) -> dict[str, Any]:
    """The raw params mapping, with unknown sections rejected."""
    if not path.exists():
        raise ConfigError(f"{path}: no such params file (run from the project root)")
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections")
    _known_sections(data, str(path))
    return data


def check_key(dotted: str, src: str) -> None:
    """ConfigError unless `section.key.subkey` is in the schema (under a mapping such as
    download.splits any key is allowed): a key checked before it is written anywhere."""
    section, *path = dotted.split(".")
    _known_sections([section], src)
    tp, key = SECTIONS[section], section
    for name in path:
        if not dataclasses.is_dataclass(tp):
            return
        _known_keys(tp, [name], key, src)
        tp, key = typing.get_type_hints(tp)[name], f"{key}.{name}"


def _known_sections(names: Any, src: str) -> None:
    unknown = [k for k in names if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"{src}: unknown section {unknown[0]} (valid: {', '.join(SECTIONS)})")


def _known_keys(tp: Any, keys: Any, key: str, src: str) -> None:
    names = [f.name for f in dataclasses.fields(tp)]
    unknown = [k for k in keys if k not in names]
    if unknown:
        raise ConfigError(f"{src}: unknown key {key}.{unknown[0]} (valid keys: {', '.join(names)})")


def load(cls: type[T], section: str, path: Path = PARAMS) -> T:
    """Section `section` of params.yaml as a `cls`; a missing section gives the defaults."""
    return _build(cls, read_params(path).get(section) or {}, section, str(path))


def load_all(path: Path = PARAMS) -> dict[str, Any]:
    """Every section, validated: {name: dataclass instance}."""
    data = read_params(path)
    return {
        name: _build(cls, data.get(name) or {}, name, str(path)) for name, cls in SECTIONS.items()
    }


def merge(base: dict, over: dict) -> dict:
    """`over` laid over `base`, nested mappings merged key by key (neither is modified)."""
    out = dict(base)
    for k, v in over.items():
        if v is None and isinstance(out.get(k), dict):
            continue  # an empty section (comments only): the defaults, as load() reads it
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def preset_params(name: str) -> dict[str, Any]:
    """The full params mapping of preset `name`: the defaults with the preset's overrides."""
    path = PRESETS / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"no preset {name!r} (available: {', '.join(presets())})")
    over = read_yaml(path)
    defaults = {n: dataclasses.asdict(cls()) for n, cls in SECTIONS.items()}
    merged = merge(defaults, over)
    for name_, cls in SECTIONS.items():  # validate before anything is written
        _build(cls, merged[name_], name_, str(path))
    return merged


def write_preset(name: str, out: Path = PARAMS) -> None:
    """Replace `out` with preset `name`, atomically."""
    merged = preset_params(name)
    header = f"# Written by `python -m transformer.config preset {name}`; edit freely.\n"
    with atomic_write(out, "w") as f:
        f.write(header + yaml.safe_dump(merged, sort_keys=False, default_flow_style=False))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m transformer.config", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("preset", help="write presets/NAME.yaml over the defaults to params.yaml")
    p.add_argument("name", help="one of: " + ", ".join(presets()))
    p.add_argument("--out", type=Path, default=PARAMS)
    sub.add_parser("list", help="list the presets")
    sub.add_parser("check", help="validate params.yaml")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "preset":
            write_preset(args.name, args.out)
            print(f"{args.out}: now preset {args.name}")
        elif args.cmd == "list":
            print("\n".join(presets()))
        else:
            load_all()
            print(f"{PARAMS}: ok")
    except ConfigError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
