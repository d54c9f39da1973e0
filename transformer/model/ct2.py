"""CTranslate2's converter for this project's HF export (the optional `export` extra).

CTranslate2's Marian loader assumes OPUS-MT's conventions: `<pad>` the last unit, decoding
started from a zero vector. This project's Marian starts from the `<s>` embedding (id 1) with
`<pad>` at id 0, so the loader is told so; everything else is CTranslate2's own conversion.
"""

from __future__ import annotations

from pathlib import Path

from ctranslate2.converters import Converter
from ctranslate2.converters.transformers import BartLoader, MarianMTLoader

from transformer.core.layout import CARD

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class _Loader(MarianMTLoader):
    def get_model_spec(self, model):
        # Marian's post-LN layout, every unit kept (MarianMTLoader drops the last: OPUS-MT's pad)
        model.config.normalize_before = False
        model.config.normalize_embedding = False
        return BartLoader.get_model_spec(self, model)

    def set_config(self, config, model, tokenizer):
        super().set_config(config, model, tokenizer)
        config.bos_token = tokenizer.bos_token
        config.decoder_start_token = tokenizer.bos_token

    def set_decoder(self, spec, decoder):
        super().set_decoder(spec, decoder)
        spec.start_from_zero_embedding = False

    def get_vocabulary(self, model, tokenizer):
        vocab = tokenizer.get_vocab()
        return sorted(vocab, key=vocab.__getitem__)  # every unit, in id order


class HFConverter(Converter):
    """The HF export in `hf_dir` (transformer/export.py's) as a CTranslate2 model spec."""

    def __init__(self, hf_dir: Path):
        self.hf_dir = Path(hf_dir)

    def _load(self):
        import torch
        from transformers import AutoTokenizer, MarianMTModel

        with torch.no_grad():
            model = MarianMTModel.from_pretrained(self.hf_dir)
            tokenizer = AutoTokenizer.from_pretrained(self.hf_dir)
            spec = _Loader()(model, tokenizer)
        for name in TOKENIZER_FILES:  # the tokenizer beside the model
            if (self.hf_dir / name).is_file():
                spec.register_file(str(self.hf_dir / name))
        if (self.hf_dir / CARD).is_file():  # the model card (export.write_hf copies it)
            spec.register_file(str(self.hf_dir / CARD))
        return spec


def convert(hf_dir: Path, out: Path, quantization: str = "float32") -> None:
    """Convert the HF export in hf_dir into out (replaced)."""
    HFConverter(hf_dir).convert(str(out), quantization=quantization, force=True)
