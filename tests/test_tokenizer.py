"""The tokenizer stage: fixed special ids, exact round trips, determinism, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from transformer import tokenizer as T
from transformer.core.files import read_lines
from transformer.core.ids import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID
from transformer.core.sections.download import SyntheticConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.data import vocab
from transformer.data.synthetic import generate

LINES = [
    "Zwei junge Männer stehen im Freien, nahe bei vielen Büschen.",
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "The price is 3,50 € (about $4) — cheap!",
    "L'été dernier, j'ai vu « la mer » à Nice.",
    "Größe: 42; Straße Nr. 7/8 & 9 #tag @user 100%",
]
TRICKY = [
    "",
    "a",
    "  two leading spaces and two  inside",
    "tab\there",
    "unseen: 日本語 🙂 𝄞 ½ ø Ω",
    "specials as text: <pad> <s> </s> <unk> ▸ ## Ġ ▁",
    "##hash at start and mid##dle",
    "x" * 300,  # one very long word (WordPiece's default would give <unk>)
    "trailing space ",
]


def _files(tmp_path: Path, lines: list[str], name: str = "train") -> list[Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    paths = []
    for lang in ("en", "de"):
        p = tmp_path / f"{name}.{lang}"
        p.write_text("".join(line + "\n" for line in lines * 5), encoding="utf-8")
        paths.append(p)
    return paths


@pytest.fixture(scope="module", params=list(T.TYPES))
def trained(request, tmp_path_factory):
    kind = request.param
    files = _files(tmp_path_factory.mktemp(kind), LINES)
    cfg = TokenizerConfig(type=kind, vocab_size=T.min_vocab_size(kind) + 60, min_frequency=1)
    return kind, files, cfg, T.train_tokenizer(files, cfg)


def test_special_ids_are_fixed(trained):
    _, _, _, tok = trained
    assert [tok.token_to_id(s) for s in SPECIALS] == [PAD_ID, BOS_ID, EOS_ID, UNK_ID]
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)


def test_vocab_size_is_exact(trained):
    kind, _, cfg, tok = trained
    if kind == "unigram":  # pruned from its seed vocabulary: at most the size, on little text
        assert T.min_vocab_size(kind) < tok.get_vocab_size() <= cfg.vocab_size
    else:
        assert tok.get_vocab_size() == cfg.vocab_size


def test_exact_roundtrip_and_no_unk(trained):
    _, _, _, tok = trained
    for line in LINES + TRICKY:
        ids = tok.encode(line).ids
        assert UNK_ID not in ids and EOS_ID not in ids, line
        assert tok.decode(ids) == line


def test_training_is_deterministic(trained):
    _, files, cfg, tok = trained
    assert T.train_tokenizer(files, cfg).to_str() == tok.to_str()


def test_save_load_and_hash(trained, tmp_path):
    kind, _, _, tok = trained
    T.save_tokenizer(tok, tmp_path, {"type": kind, "src_lang": "en", "tgt_lang": "de"})
    back = vocab.load_tokenizer(tmp_path, expect={"type": kind})
    assert back.kind == kind and back.size == tok.get_vocab_size()
    assert back.encode([TRICKY[5]]) == [tok.encode(TRICKY[5]).ids]  # specials stay text
    assert back.decode(back.encode(TRICKY)) == TRICKY
    assert vocab.tokenizer_sha256(tmp_path) == vocab.read_meta(tmp_path)["tokenizer_sha256"]
    with pytest.raises(vocab.TokenizerError, match="type is"):
        vocab.load_tokenizer(tmp_path, expect={"type": "other"})


def test_tokenizer_from_another_run_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for out, lines in ((a, LINES), (b, LINES[:3])):
        files = _files(out, lines)
        tok = T.train_tokenizer(files, TokenizerConfig(vocab_size=300, min_frequency=1))
        T.save_tokenizer(tok, out, {"type": "bpe"})
    (a / "tokenizer.json").write_bytes((b / "tokenizer.json").read_bytes())
    with pytest.raises(vocab.TokenizerError, match="another run"):
        vocab.load_tokenizer(a)
    with pytest.raises(vocab.TokenizerError, match="meta.json: missing"):
        vocab.load_tokenizer(tmp_path)


def test_empty_training_split_is_an_error(tmp_path):
    (tmp_path / "train.en").write_text("")
    with pytest.raises(vocab.TokenizerError, match="train.en: the training split is empty"):
        T.train_tokenizer([tmp_path / "train.en"], TokenizerConfig())


@pytest.mark.parametrize("kind", T.TYPES)
def test_vocab_smaller_than_alphabet_is_an_error(tmp_path, kind):
    files = _files(tmp_path, LINES)
    with pytest.raises(vocab.TokenizerError, match="smaller than the alphabet"):
        T.train_tokenizer(files, TokenizerConfig(type=kind, vocab_size=T.min_vocab_size(kind) - 1))


def _demo_files(tmp_path: Path) -> list[Path]:
    """The demo's synthetic corpus (2,000 pairs) as train.en, train.de."""
    pairs = generate(SyntheticConfig(train=2000, valid=0, test=0))["train"]
    files = []
    for side, lang in enumerate(("en", "de")):
        files.append(tmp_path / f"train.{lang}")
        files[-1].write_text("".join(p[side] + "\n" for p in pairs), encoding="utf-8")
    return files


def test_demo_corpus_roundtrips_exactly(tmp_path):
    files = _demo_files(tmp_path)
    for kind in T.TYPES:
        tok = T.train_tokenizer(files, TokenizerConfig(type=kind, vocab_size=1000))
        lines = {lang: read_lines(f) for lang, f in zip(("en", "de"), files)}
        for lang, s in T.stats(vocab.Subwords(tok, kind), lines).items():
            assert s["roundtrip_exact"] == 1.0 and s["unk_share"] == 0.0, (kind, lang)


def test_unigram_keeps_frequent_words_that_start_no_other_word(tmp_path):
    # A templated corpus: "Ich" always followed by " weiß", so no suffix array over the text or
    # the word list finds it recurring before different characters (sentencepiece#967).
    tok = T.train_tokenizer(_demo_files(tmp_path), TokenizerConfig(type="unigram", vocab_size=1000))
    assert tok.encode("Ich weiß, dass Clara").tokens == ["ĠIch", "ĠweiÃŁ", ",", "Ġdass", "ĠClara"]
    assert tok.get_vocab_size() == 1000  # before the marker, EM left it ~40% short
    assert not any(T.MARK in p for p in tok.get_vocab())


def test_unigram_cuts_its_vocabulary_to_the_most_likely_pieces(tmp_path):
    # Issue 59: holding under 1.1 x the size asked, HF's trainer does not prune and cut to size
    # in its seed order: on the demo that dropped "at", "on", "PM", "um" (~7,000 times each).
    files = _demo_files(tmp_path)
    full = T.train_tokenizer(files, TokenizerConfig(type="unigram", vocab_size=5000))
    score = dict(json.loads(full.to_str())["model"]["vocab"])  # every piece (~1,170)
    pieces = [p for p in score if len(p) > 1 and p not in SPECIALS]
    assert len(pieces) < 1000 < len(score)  # so 1,000 is a cut, without a prune (< 1,100)
    cut = T.train_tokenizer(files, TokenizerConfig(type="unigram", vocab_size=1000)).get_vocab()
    kept, lost = [p for p in pieces if p in cut], [p for p in pieces if p not in cut]
    assert len(cut) == 1000 and lost
    assert min(score[p] for p in kept) >= max(score[p] for p in lost)


@pytest.mark.parametrize("kind", T.TYPES)
def test_a_training_file_that_is_not_utf8_is_named(tmp_path, kind):
    files = _files(tmp_path, LINES)
    files[1].write_bytes(files[1].read_bytes() + b"\xff\xfe\n")
    with pytest.raises(vocab.TokenizerError, match="train.de.*UTF-8"):
        T.train_tokenizer(files, TokenizerConfig(type=kind, vocab_size=T.min_vocab_size(kind) + 9))


def test_real_data_roundtrip(shared_data, tmp_path):
    """Issue 4: >= 99.9% exact on Multi30k train and newstest2013, every tokenizer type."""
    m30k = [shared_data / f"multi30k/train.{lang}" for lang in ("en", "de")]
    news = {
        lang: read_lines(shared_data / f"newstest2013/newstest2013.{lang}") for lang in ("en", "de")
    }
    train = {f.name: read_lines(f) for f in m30k}
    # Trained on a fifth of Multi30k to keep the test fast; all of it is then decoded, and
    # newstest2013 is out of domain (unseen characters and words).
    files = [tmp_path / f.name for f in m30k]
    for f in files:
        f.write_text("".join(line + "\n" for line in train[f.name][:6000]), encoding="utf-8")
    for kind in T.TYPES:
        tok = T.train_tokenizer(files, TokenizerConfig(type=kind, vocab_size=4000))
        sw = vocab.Subwords(tok, kind)
        for name, s in {**T.stats(sw, train), **T.stats(sw, news)}.items():
            assert s["roundtrip_exact"] >= 0.999, (kind, name, s)
            assert s["unk_share"] == 0.0, (kind, name, s)


def test_cli_writes_tokenizer_and_metrics(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    _files(raw, LINES)
    _files(raw, LINES[:2], "valid")
    params = tmp_path / "params.yaml"
    params.write_text(
        "download: {src_lang: en, tgt_lang: de}\n"
        "tokenizer: {type: wordpiece, vocab_size: 600, min_frequency: 1}\n"
    )
    out, metrics = tmp_path / "tok", tmp_path / "m" / "tokenizer.json"
    T.main([str(raw), str(out), "--metrics", str(metrics), "--params", str(params)])
    m = json.loads(metrics.read_text())
    assert m["vocab_size"] == 600 and m["type"] == "wordpiece"
    assert m["valid"]["de"]["roundtrip_exact"] == 1.0 and m["valid"]["en"]["mean_tokens"] > 1
    meta = vocab.read_meta(out)
    assert (meta["type"], meta["src_lang"], meta["tgt_lang"]) == ("wordpiece", "en", "de")
    assert meta["train_sha256"] == T.training_sha256([raw / "train.en", raw / "train.de"])
    (raw / "train.de").write_text("")
    with pytest.raises(SystemExit, match="error: .*train.de: the training split is empty"):
        T.main([str(raw), str(out), "--params", str(params)])
