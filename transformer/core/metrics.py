"""The metrics files the flows read: which stage's file holds each value, at which key.

The contract between the stages that write the files (evaluate, shard, parent) and the flows that
read them (flows/lineage.py: the lineage record, the promotion gate, the retrain decision, `make
results`). The stages write through `put`, the flows read through `get`: a key missing from a
file is a MetricsError naming the file and the key, never a silent default.
"""

from __future__ import annotations

from typing import Any

# the experiment a flow runs the stages for (flows/pipeline.py sets it): the train stage records
# it in its checkpoints, and a run that goes on from another's says from which (`origin`)
RUN_ENV = "TRANSFORMER_RUN"

# record field -> its key path in data/metrics/evaluate.json ("/" nests; "lineage" is the
# model's provenance)
KEYS = {
    "bleu": "bleu",
    "chrf": "chrf",
    "bleu_signature": "bleu_signature",
    "chrf_signature": "chrf_signature",
    "split": "split",
    "test_sha256": "set_sha256",  # the scored split's source and reference files
    "model_sha256": "lineage/model_sha256",
    "tokenizer_sha256": "lineage/tokenizer_sha256",
    "checkpoints_averaged": "lineage/averaged_checkpoints",
}
# the shard stage's: how much of the train data the tokenizer leaves to single bytes
SHARD_KEYS = {"oov_rate": "vocabulary/oov_rate"}
# the parent stage's: the version a continued run started from (null: from scratch) and its
# ancestors, newest first
PARENT_KEYS = {"parent": "version", "parent_chain": "chain"}
CONTRACT = {"evaluate": KEYS, "shard": SHARD_KEYS, "parent": PARENT_KEYS}  # by dvc.yaml stage


class MetricsError(ValueError):
    """A metrics file lacks a value of the contract; the message names the file and the key."""


def put(record: dict[str, Any], keys: dict[str, str], **values: Any) -> dict[str, Any]:
    """`record` with each value at its field's key path in `keys` (nested dicts made as needed)."""
    for field, value in values.items():
        *parents, leaf = keys[field].split("/")  # KeyError: a field outside the contract
        node = record
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return record


def get(flat: dict[str, Any], keys: dict[str, str], field: str, where: str) -> Any:
    """The value of `field` in a flattened metrics file (`where` names it): the exact key path."""
    path = keys[field]
    if path not in flat:
        raise MetricsError(f"{where}: no key {path!r} ({field}; see transformer/core/metrics.py)")
    return flat[path]
