"""The shard stage: exact contents, length limits, bounded sorted shards, checksums."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from transformer import shard as S
from transformer import tokenizer as T
from transformer.core.ids import EOS_ID
from transformer.core.sections.download import SyntheticConfig
from transformer.core.sections.tokenizer import TokenizerConfig
from transformer.data import vocab
from transformer.data.batches import BatchSampler, DataError, collate, load_split, read_index
from transformer.data.synthetic import generate

MAX_LEN, SHARD_PAIRS = 32, 100


def _write(raw: Path, split: str, pairs: list[tuple[str, str]]) -> None:
    for side, lang in enumerate(("en", "de")):
        text = "".join(p[side] + "\n" for p in pairs)
        (raw / f"{split}.{lang}").write_text(text, encoding="utf-8")


def _shard_with(root: Path, tok_dir: Path, out: Path, params: str) -> dict:
    """Run the stage on root/raw into out/shards with `params` as params.yaml; returns metrics."""
    out.mkdir(exist_ok=True)
    (out / "params.yaml").write_text(params)
    S.main(
        [str(root / "raw"), str(tok_dir), str(out / "shards")]
        + ["--params", str(out / "params.yaml"), "--metrics", str(out / "shard.json")]
    )
    return json.loads((out / "shard.json").read_text())


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    """raw/ (demo pairs plus some too long), a BPE tokenizer, and the shard stage's output."""
    root = tmp_path_factory.mktemp("shard")
    raw = root / "raw"
    raw.mkdir()
    data = generate(SyntheticConfig(train=400, valid=30, test=30, seed=3))
    long = " ".join(["sehr lang"] * 15)
    data["train"] += [(long, "kurz"), ("short", long), ("", "leer")]
    for split, pairs in data.items():
        _write(raw, split, pairs)
    files = [raw / "train.en", raw / "train.de"]
    tok = T.train_tokenizer(files, TokenizerConfig(vocab_size=500, min_frequency=1))
    T.save_tokenizer(tok, root / "tok", {"type": "bpe", "src_lang": "en", "tgt_lang": "de"})
    params = f"shard: {{max_len: {MAX_LEN}, shard_pairs: {SHARD_PAIRS}}}\n"
    return root, data, tok, _shard_with(root, root / "tok", root, params)


def test_kept_pairs_are_exactly_the_short_ones(stage):
    root, data, tok, metrics = stage
    for split, pairs in data.items():
        fits = [p for p in pairs if all(len(tok.encode(x).ids) + 1 <= MAX_LEN for x in p)]
        assert metrics[split]["dropped_too_long"] == len(pairs) - len(fits)
        ds = load_split(root / "shards", split, vocab.tokenizer_sha256(root / "tok"))
        got = []
        for i in range(len(ds)):
            src, tgt = ds[i]
            assert src[-1] == EOS_ID and tgt[-1] == EOS_ID
            assert (len(src), len(tgt)) == (ds.src_lens[i], ds.tgt_lens[i])
            got.append((tok.decode(src[:-1].tolist()), tok.decode(tgt[:-1].tolist())))
        assert Counter(got) == Counter(fits)  # each pair once, exactly as written
        if split == "train":
            assert ("", "leer") in got and not any(len(a) > 100 or len(b) > 100 for a, b in got)


def test_shards_are_bounded_sorted_and_checksummed(stage):
    root = stage[0]
    index = read_index(root / "shards" / "train")
    assert len(index["shards"]) > 1 and index["dtype"] == "uint16"
    assert sum(s["n_pairs"] for s in index["shards"]) == index["n_pairs"]
    ds = load_split(root / "shards", "train")
    start = 0
    for meta in index["shards"]:
        assert meta["n_pairs"] <= SHARD_PAIRS
        key = list(
            zip(
                ds.src_lens[start : start + meta["n_pairs"]],
                ds.tgt_lens[start : start + meta["n_pairs"]],
            )
        )
        assert key == sorted(key)  # grouped by length: sorted within the shard
        start += meta["n_pairs"]


def test_loader_batches_cover_the_split(stage):
    root, _, _, _ = stage
    ds = load_split(root / "shards", "train")
    sampler = BatchSampler(ds.src_lens, ds.tgt_lens, max_tokens=200, seed=1)
    seen = []
    for idx in sampler:
        b = collate([ds[i] for i in idx])
        assert b.src.numel() <= 200 and b.tgt_out.numel() <= 200
        seen += idx
    assert sorted(seen) == list(range(len(ds)))


def _copy(root: Path, tmp_path: Path) -> Path:
    out = tmp_path / "shards"
    for f in (root / "shards" / "train").iterdir():
        (out / "train").mkdir(parents=True, exist_ok=True)
        (out / "train" / f.name).write_bytes(f.read_bytes())
    return out


def test_corrupt_or_truncated_shard_is_refused(stage, tmp_path):
    out = _copy(stage[0], tmp_path)
    shard = out / "train" / "shard_00000.bin"
    blob = bytearray(shard.read_bytes())
    blob[-1] ^= 0xFF
    shard.write_bytes(blob)
    with pytest.raises(DataError, match="shard_00000.bin: sha256 does not match"):
        load_split(out, "train")
    shard.write_bytes(blob[:-2])
    with pytest.raises(DataError, match="shard_00000.bin: .* bytes.*truncated"):
        load_split(out, "train", verify=False)


def test_other_tokenizer_is_refused(stage):
    root = stage[0]
    with pytest.raises(DataError, match="made with tokenizer .*rerun the shard stage"):
        load_split(root / "shards", "train", tokenizer_sha256="0" * 64)
    with pytest.raises(DataError, match="index.json: missing"):
        load_split(root / "shards", "nosuchsplit")


def test_misaligned_input_is_a_clear_error(stage, tmp_path):
    root = stage[0]
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.en").write_text("a\nb\nc\n")
    (raw / "train.de").write_text("a\nb\n")
    params = tmp_path / "params.yaml"
    params.write_text("shard: {max_len: 20}\n")
    with pytest.raises(SystemExit, match=r"error: .*train.de: ends at line 2"):
        S.main([str(raw), str(root / "tok"), str(tmp_path / "out"), "--params", str(params)])
    assert not (tmp_path / "out").exists()  # nothing half-written under the final name


def test_gather_matches_python_slicing():
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 6, 50)
    flat = np.arange(lens.sum())
    pick = rng.permutation(50)[:20]
    off = np.concatenate([[0], np.cumsum(lens)])
    want = np.concatenate([flat[off[i] : off[i + 1]] for i in pick])
    np.testing.assert_array_equal(S._gather(flat, lens, pick), want)


def test_pass_two_in_small_pieces_writes_the_same_shards(stage, tmp_path, monkeypatch):
    """Reading / gathering in pieces of 7 pairs (bounded memory) changes no byte."""
    root = stage[0]
    tok = vocab.load_tokenizer(root / "tok")
    monkeypatch.setattr(S, "GATHER", 7)
    cfg = S.ShardConfig(max_len=MAX_LEN, shard_pairs=SHARD_PAIRS)
    raw = root / "raw"
    S.shard_split(tok, raw / "train.en", raw / "train.de", tmp_path, cfg, "x")
    index = read_index(root / "shards" / "train")
    assert len(index["shards"]) == len(list(tmp_path.glob("shard_*.bin")))
    for meta in index["shards"]:
        want = (root / "shards" / "train" / meta["file"]).read_bytes()
        assert (tmp_path / meta["file"]).read_bytes() == want


def test_bpe_dropout_copies_resegment_train_and_nothing_else(stage, tmp_path):
    """Each train pair comes back up to 3 times, the same text cut into other units."""
    root, data, tok, _ = stage
    limit = 2 * MAX_LEN  # room for the longer segmentations
    params = f"shard: {{max_len: {limit}, bpe_dropout: 0.1, train_copies: 3}}\n"
    metrics = _shard_with(root, root / "tok", tmp_path, params)
    assert metrics["train"]["copies"] == 3
    assert metrics["train"]["pairs_in"] == 3 * len(data["train"])
    fits = Counter(p for p in data["train"] if all(len(tok.encode(x).ids) < limit for x in p))
    ds = load_split(tmp_path / "shards", "train")
    got, resegmented = Counter(), 0
    for i in range(len(ds)):
        src, tgt = ds[i]
        pair = tok.decode(src[:-1].tolist()), tok.decode(tgt[:-1].tolist())
        got[pair] += 1
        resegmented += src[:-1].tolist() != tok.encode(pair[0]).ids
    assert all(got[p] <= 3 * fits[p] for p in got)  # only kept pairs, at most once per copy
    assert len(ds) >= 0.9 * 3 * sum(fits.values())  # dropout makes a few too long, no more
    assert resegmented > len(ds) // 4  # the copies really are cut differently
    for split in ("valid", "test"):  # never dropped: every pair cut as plain BPE cuts it
        ds = load_split(tmp_path / "shards", split)
        assert len(ds) == len(data[split]) and metrics[split]["copies"] == 1
        for src, tgt in (ds[i] for i in range(len(ds))):
            for ids in (src[:-1].tolist(), tgt[:-1].tolist()):
                assert ids == tok.encode(tok.decode(ids)).ids


@pytest.mark.parametrize(
    "extra, error",
    [
        ("train_copies: 2", "shard.train_copies is 2 but shard.bpe_dropout is 0"),
        ("bpe_dropout: 1.0", r"shard.bpe_dropout must be in \[0, 1\), got 1.0"),
    ],
)
def test_bad_bpe_dropout_settings_name_the_key(stage, tmp_path, extra, error):
    root = stage[0]
    with pytest.raises(SystemExit, match=error):
        _shard_with(root, root / "tok", tmp_path, f"shard: {{max_len: 20, {extra}}}\n")
    assert not (tmp_path / "shards").exists()


def test_bpe_dropout_with_a_wordpiece_tokenizer_is_refused(stage, tmp_path):
    root = stage[0]
    files = [root / "raw" / "train.en", root / "raw" / "train.de"]
    cfg = TokenizerConfig(type="wordpiece", vocab_size=600, min_frequency=1)
    meta = {"type": "wordpiece", "src_lang": "en", "tgt_lang": "de"}
    T.save_tokenizer(T.train_tokenizer(files, cfg), tmp_path / "wp", meta)
    with pytest.raises(SystemExit, match=r"wp is a wordpiece tokenizer.*tokenizer.type: bpe"):
        _shard_with(root, tmp_path / "wp", tmp_path, "shard: {bpe_dropout: 0.1}\n")
    assert not (tmp_path / "shards").exists()
