"""Filters for web-crawled pairs: language identification, copies, script ratio (issue 72).

Each is a switch in `CleanConfig` (or a part's own `clean:`) with its own drop reason. They run
after the length and ratio rules, cheapest first, so the language model sees only pairs that
every other rule kept. Language ID is py3langid (its model is in its wheel: offline), chosen by
accuracy on short lines (docs/experiments/2026-11-29-crawl-cleaning.md); a side is judged only
when it has `langid_min_words` words and another language reaches `langid_min_prob`, because
short lines of names and numbers ("Born 1958 in Obernberg am Inn / Austria .") are ambiguous.
"""

from __future__ import annotations

import functools
import re

from transformer.core.sections.download import CleanConfig
from transformer.core.settings import ConfigError

CRAWL_REASONS = ("wrong_language", "copy", "script")
_LATIN = "A-Za-z\u00aa\u00b5\u00ba\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u1e00-\u1eff"
# the letters of each script, as regex classes; a language not listed counts every letter
_SCRIPTS = {
    "latin": _LATIN,
    "cyrillic": "\u0400-\u052f",
    "greek": "\u0370-\u03ff\u1f00-\u1fff",
    "arabic": "\u0600-\u06ff\u0750-\u077f",
    "hebrew": "\u0590-\u05ff",
    "devanagari": "\u0900-\u097f",
    "cjk": "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af",
}
_NOT_LATIN = {
    **dict.fromkeys(("ru", "uk", "bg", "be", "kk", "mk", "sr", "mn", "ky", "tg"), "cyrillic"),
    **dict.fromkeys(("ar", "fa", "ur", "ps"), "arabic"),
    **dict.fromkeys(("hi", "mr", "ne"), "devanagari"),
    **dict.fromkeys(("zh", "ja", "ko"), "cjk"),
    "el": "greek",
    "he": "hebrew",
}
# languages written in Latin letters (the rest of py3langid's that are not above are counted
# with every letter: a filter that knows less, never one that drops a good line)
_LATIN_CODES = (
    "af an az br bs ca cs cy da de en eo es et eu fi fo fr ga gl hr ht hu id is it jv la lb lt "
    "lv mg ms mt nb nl nn no oc pl pt qu ro rw se sk sl sq sv sw tl tr vo wa xh zu"
)
_LATIN_LANGS = frozenset(_LATIN_CODES.split())
_WORD = re.compile(r"[^\W\d_]+")  # a run of letters: what a copy is compared on


@functools.cache
def _identifier():
    """py3langid's model, loaded once per process (~0.5 s), with normalised probabilities."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def script_letters(lang: str) -> re.Pattern:
    """A pattern matching one letter of `lang`'s script (any letter for a language not known)."""
    script = _NOT_LATIN.get(lang) or ("latin" if lang in _LATIN_LANGS else None)
    return re.compile(f"[{_SCRIPTS[script]}]" if script else r"[^\W\d_]")


class CrawlFilter:
    """The crawl filters of one part: `reason(src, tgt)` names why a pair goes, or None."""

    def __init__(self, cc: CleanConfig, src_lang: str, tgt_lang: str) -> None:
        self.cc, self.langs = cc, (src_lang, tgt_lang)
        self.letters = tuple(script_letters(lang) for lang in self.langs)
        if cc.langid:
            known = set(_identifier().labels)
            for key, lang in zip(("src_lang", "tgt_lang"), self.langs):
                if lang not in known:
                    raise ConfigError(
                        f"download.{key}: {lang!r} is not a language py3langid knows, so "
                        "download.clean.langid cannot check it (switch it off for this pair)"
                    )

    @property
    def active(self) -> bool:
        return self.cc.langid or self.cc.copies or self.cc.script

    def reason(self, src: str, tgt: str) -> str | None:
        """The first crawl filter that rejects the normalised pair, or None."""
        cc = self.cc
        if cc.copies and is_copy(src, tgt, cc.copy_overlap):
            return "copy"
        if cc.script and (
            script_ratio(src, self.letters[0]) < cc.min_script_ratio
            or script_ratio(tgt, self.letters[1]) < cc.min_script_ratio
        ):
            return "script"
        if cc.langid and (self.wrong_language(src, 0) or self.wrong_language(tgt, 1)):
            return "wrong_language"
        return None

    def wrong_language(self, text: str, side: int) -> bool:
        """Whether `text` is, with enough words and confidence, not in its side's language."""
        if len(text.split()) < self.cc.langid_min_words:
            return False
        lang, prob = _identifier().classify(text)
        return lang != self.langs[side] and prob >= self.cc.langid_min_prob


def words(text: str) -> set[str]:
    """The lowercased letter runs of `text`: digits, punctuation and spacing left out."""
    return set(_WORD.findall(text.lower()))


def is_copy(src: str, tgt: str, overlap: float) -> bool:
    """Source and target equal, or their word sets overlapping by Jaccard >= `overlap`.

    Sides without a letter (numbers, punctuation) are the script filter's, not copies."""
    a, b = words(src), words(tgt)
    if not a or not b:
        return False
    return len(a & b) >= overlap * len(a | b)


def script_ratio(text: str, letters: re.Pattern) -> float:
    """The share of `text`'s non-space characters that are letters of the expected script."""
    chars = len(text) - text.count(" ")
    return len(letters.findall(text)) / chars if chars else 0.0
