"""The special tokens' fixed ids, shared by every vocabulary the tokenizer stage trains.

A module of its own so that the code that only needs the ids (the model's padding mask, the
batches, the decoders) does not depend on the tokenizer's trainer: an edit there reruns the
tokenizer stage, not training.
"""

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# Mixing punctuation and letters, these strings can never be one pre-token of GPT-2's regex,
# so no learned token can collide with them; encode_special_tokens stops literal matches.
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
