"""The download stage's settings (params.yaml `download`): the corpus, its parts, its clean-up."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from transformer.core.settings import ConfigError, at_least, choice


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
    # filters for web-crawled text (transformer/data/crawl.py): train pairs dropped and counted
    # by reason; valid / test only counted ("flagged"), never changed, whatever filter_eval says
    langid: bool = False  # both sides identified (py3langid) as download.src_lang / tgt_lang
    langid_min_prob: float = 0.9  # a side is wrong only when another language is this likely
    langid_min_words: int = 3  # a side of fewer words is too short to judge
    copies: bool = False  # the target a copy of the source (or nearly)
    copy_overlap: float = 0.8  # word-set Jaccard of the two sides (lowercased letters) >= this
    script: bool = False  # a side mostly digits, punctuation or another script
    min_script_ratio: float = 0.4  # letters of the side's script / its non-space characters
    # a crawl filter removing more than this share of a split's pairs stops the stage (a wrong
    # language code must not silently empty a corpus); 1.0 disables the guard
    max_drop: float = 0.5

    def __post_init__(self) -> None:
        at_least("download.clean", self, 0, "langid_min_words")
        for k in ("langid_min_prob", "copy_overlap", "min_script_ratio", "max_drop"):
            if not 0.0 <= getattr(self, k) <= 1.0:
                raise ConfigError(f"download.clean.{k} must be in [0, 1], got {getattr(self, k)}")

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
    # only these lines (rows) of the part, "FIRST-LAST" counted from 1, either end may be left
    # out ("14501-"): e.g. half of a corpus; "": all (text, tsv, jsonl, hf)
    lines: str = ""
    # this part's own crawl-filter settings over download.clean's (PART_KEYS), e.g. the crawl
    # filtered while Europarl keeps the general rules: {langid: true, copies: true}
    clean: dict[str, Any] = field(default_factory=dict)


MONO_FORMATS = ("text", "newscrawl", "hf")
MONO_FILE = "mono.{lang}"  # the monolingual text in the download stage's --mono folder


@dataclass
class MonoSpec:
    """One monolingual part: text in the target language, one sentence a line, for the
    backtranslate stage to turn into synthetic pairs.

    text: `path` is a file or an http(s) URL (.gz read as gzip; "{lang}" is the target
    language). newscrawl: `path` is the folder (or base URL) of WMT's News Crawl for the
    language, files news.YEAR.LANG.shuffled.deduped(.gz), e.g.
    https://data.statmt.org/news-crawl/{lang}; `years` picks them (a folder: every year there
    by default). hf: `path` is a `datasets` Hub id or local copy, `hf_column` a text column or a
    translation column (its target-language side).
    """

    path: str = ""
    format: str = "text"  # text | newscrawl | hf
    years: list[int] = field(default_factory=list)  # newscrawl: which files, oldest first
    lines: str = ""  # "FIRST-LAST" (from 1, either end open): only these lines; "": all
    max_lines: int = 0  # at most this many lines read from the part; 0: all
    sha256: str = ""  # text: of the file; checked when given
    name: str = ""  # the part's name in the manifest; default: from the path
    hf_name: str = ""  # hf: the dataset config
    hf_split: str = "train"  # hf: the dataset split
    hf_revision: str = ""  # hf: a Hub commit / tag; empty: the default branch
    hf_column: str = "text"  # hf: a column of text, or "translation"
    clean: dict[str, Any] = field(default_factory=dict)  # as a parallel part's (copies: no)


def line_range(lines: str, key: str) -> tuple[int, int | None]:
    """A part's `lines` ("FIRST-LAST", from 1, either end open) as (first, last or None)."""
    if not lines:
        return 1, None
    first, sep, last = lines.partition("-")
    try:
        a, b = int(first or 1), int(last) if last else None
    except ValueError:
        a = b = 0
    if not sep or a < 1 or (b is not None and b < a):
        raise ConfigError(
            f"{key} must be FIRST-LAST (line numbers from 1, FIRST <= LAST, either may be "
            f"left out: '14501-'), got {lines!r}"
        )
    return a, b


# the download.clean keys a part may set for itself
PART_KEYS = (
    "langid",
    "langid_min_prob",
    "langid_min_words",
    "copies",
    "copy_overlap",
    "script",
    "min_script_ratio",
)


def part_clean(clean: CleanConfig, spec: SourceSpec, key: str) -> CleanConfig:
    """download.clean with the part's own settings (`spec.clean`, at dotted `key`) over it."""
    for k, v in spec.clean.items():
        if k not in PART_KEYS:
            raise ConfigError(f"unknown key {key}.{k} (a part may set: {', '.join(PART_KEYS)})")
        want = type(getattr(clean, k))
        if isinstance(v, bool) != (want is bool) or not isinstance(v, (want, int)):
            raise ConfigError(f"{key}.{k} must be {want.__name__}, got {v!r}")
    try:
        return dataclasses.replace(clean, **spec.clean)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}") from None


SOURCES = ("synthetic", "local", "wmt", "hf")
SYNTHETIC_PAIRS = (("en", "de"), ("de", "en"))  # the one corpus, read either way


@dataclass
class DownloadConfig:
    source: str = "synthetic"  # synthetic | local | wmt | hf
    src_lang: str = "en"
    tgt_lang: str = "de"
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    # split -> list of parts, used by the local / hf / wmt sources
    splits: dict[str, list[SourceSpec]] = field(default_factory=dict)
    # target-language text (any source setting) for the backtranslate stage; cleaned by the
    # same rules as a side of train (download.clean): data/mono
    monolingual: list[MonoSpec] = field(default_factory=list)
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
        choice("download.source", self.source, SOURCES)
        pair = (self.src_lang, self.tgt_lang)
        if self.source == "synthetic" and pair not in SYNTHETIC_PAIRS:
            raise ConfigError(
                f"download.src_lang / download.tgt_lang: the synthetic source makes en -> de or "
                f"de -> en, got {pair[0]} -> {pair[1]} (other pairs: download.source local, "
                "wmt or hf; docs/data.md)"
            )
        at_least("download", self, 0, "retries", "backoff")
        if self.timeout <= 0:
            raise ConfigError(f"download.timeout must be > 0 seconds, got {self.timeout}")
        for split, specs in self.splits.items():
            for i, spec in enumerate(specs):
                part_clean(self.clean, spec, f"download.splits.{split}[{i}].clean")
                line_range(spec.lines, f"download.splits.{split}[{i}].lines")
        for i, mono in enumerate(self.monolingual):
            choice(f"download.monolingual[{i}].format", mono.format, MONO_FORMATS)
            at_least(f"download.monolingual[{i}]", mono, 0, "max_lines")
            part_clean(self.clean, SourceSpec(clean=mono.clean), f"download.monolingual[{i}].clean")
            line_range(mono.lines, f"download.monolingual[{i}].lines")
        mirror = urlparse(self.mirror)
        if self.mirror and (mirror.scheme not in ("http", "https") or not mirror.netloc):
            raise ConfigError(
                f"download.mirror must be an http(s)://host[:port] URL, got {self.mirror!r}"
            )
