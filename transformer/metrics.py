"""The evaluate stage's metrics file (data/metrics/evaluate.json): where each value is.

The contract between the stage that writes the file (transformer/evaluate.py) and the flows that
read it (flows/lineage.py: the lineage record, the promotion gate, `make results`). Both use
these names; tests/test_evaluate.py checks that a file the stage wrote holds every one.
"""

# record field -> its key path in the file ("/" nests; "lineage" is the model's provenance)
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
