"""transformer/core/metrics.py: the stages write the keys the flows read, by exact key; a missing key
is an error naming the file and the key."""

from __future__ import annotations

import json

import pytest

from flows import lineage
from flows.dag import Stage
from transformer import parent, shard
from transformer import tokenizer as T
from transformer.core import metrics
from transformer.core.metrics import KEYS, PARENT_KEYS, SHARD_KEYS, MetricsError
from transformer.core.sections.retrain import RetrainConfig
from transformer.core.sections.shard import ShardConfig
from transformer.core.sections.tokenizer import TokenizerConfig

EVAL = Stage("evaluate", (), ("m/evaluate.json",), ("m/evaluate.json",), (), ())
LINES = ["a small house by the river", "the river runs by a house", "houses and rivers"]


def evaluate_file() -> dict:
    """Every evaluate value of the contract, written as the stage writes them (through put)."""
    values = {f: f"<{f}>" for f in KEYS}
    return metrics.put({"n_sentences": 3}, KEYS, **values)


def test_put_nests_by_key_path_and_get_reads_the_exact_key():
    out = evaluate_file()
    assert (
        out["lineage"]["model_sha256"] == "<model_sha256>" and out["set_sha256"] == "<test_sha256>"
    )
    flat = lineage.flatten(out)
    assert all(metrics.get(flat, KEYS, f, "x.json") == f"<{f}>" for f in KEYS)
    with pytest.raises(KeyError):  # a field outside the contract is not written
        metrics.put({}, KEYS, blue=1.0)


def test_a_missing_split_is_an_error_naming_the_file_and_key(tmp_path):
    data = evaluate_file()
    del data["split"]  # was read as "test", the split the gate compares
    (tmp_path / "m").mkdir()
    (tmp_path / "m/evaluate.json").write_text(json.dumps(data))
    with pytest.raises(MetricsError, match=r"m/evaluate.json: no key 'split'"):
        lineage.lineage(lineage.Snapshot(tmp_path), {"evaluate": EVAL}, "rev")


def test_keys_are_exact_not_suffixes(tmp_path):
    """A score nested under another record (evaluate --split valid test) is not the stage's."""
    data = evaluate_file()
    data["valid"] = {"bleu": 99.0}
    del data["bleu"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m/evaluate.json").write_text(json.dumps(data))
    with pytest.raises(MetricsError, match=r"m/evaluate.json: no key 'bleu'"):
        lineage.lineage(lineage.Snapshot(tmp_path), {"evaluate": EVAL}, "rev")
    data["bleu"] = 12.5
    (tmp_path / "m/evaluate.json").write_text(json.dumps(data))
    record = lineage.lineage(lineage.Snapshot(tmp_path), {"evaluate": EVAL}, "rev")
    assert record["bleu"] == 12.5 and record["split"] == "<split>"


def test_shard_and_parent_write_their_contract_keys(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("en", "de"):
        (raw / f"train.{lang}").write_text("".join(line + "\n" for line in LINES * 4))
    cfg = TokenizerConfig(vocab_size=T.min_vocab_size("bpe") + 20, min_frequency=1)
    T.build(raw, tmp_path / "tok", cfg, ("en", "de"))
    written = shard.shard(raw, tmp_path / "tok", tmp_path / "shards", ShardConfig(), ("en", "de"))
    flat = lineage.flatten(written)
    assert 0 <= metrics.get(flat, SHARD_KEYS, "oov_rate", "shard.json") <= 1
    made = lineage.flatten(parent.prepare(tmp_path / "parent", RetrainConfig()))
    assert metrics.get(made, PARENT_KEYS, "parent", "parent.json") is None
    assert metrics.get(made, PARENT_KEYS, "parent_chain", "parent.json") == []
    with pytest.raises(MetricsError, match="parent.json: no key 'chain'"):
        metrics.get({"version": None}, PARENT_KEYS, "parent_chain", "parent.json")
