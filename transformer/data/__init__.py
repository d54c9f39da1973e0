"""Text in, token batches out: the sources (local files, SGM, TSV, JSONL, HF datasets, WMT
tarballs), the streaming clean-up, the offline demo corpus, the tokenizer seam (vocab) and the
memory-mapped shards with their token-budget batches (batches).

Promise: imports only transformer.core; nothing here imports torch but batches.
"""
