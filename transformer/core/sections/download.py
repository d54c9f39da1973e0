"""The download stage's settings (params.yaml `download`): the corpus, its parts, its clean-up."""

from __future__ import annotations

from dataclasses import dataclass, field
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
        mirror = urlparse(self.mirror)
        if self.mirror and (mirror.scheme not in ("http", "https") or not mirror.netloc):
            raise ConfigError(
                f"download.mirror must be an http(s)://host[:port] URL, got {self.mirror!r}"
            )
