"""Export a package (the package stage's folder) to where people serve models.

    python -m transformer.export data/package --format hf --out champion-hf
    python -m transformer.export data/package --format ctranslate2 --quantization int8 --out ct2
    transformer-export champion/ --format hf --out champion-hf

hf: a `MarianMTModel` (Marian is this paper's architecture: post-LN, sinusoidal positions,
embeddings scaled by √d_model, one vocabulary, its matrices shared or not as trained) with the
tokenizer as a `PreTrainedTokenizerFast`, generation_config.json and the model card: HF's
`generate` (or transformers 4.x's translation pipeline) translates with no code of this
project. ctranslate2: that model through CTranslate2's own converter (its Marian loader, told
that decoding starts from `<s>`), float32 or int8, the tokenizer files beside it.
docs/export.md shows how to serve each; what cannot be exported (a pre-LN model, an ensemble's
scores) is refused before anything is written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import normalizers, processors
from torch import Tensor

from transformer.core.files import atomic_dir
from transformer.core.ids import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID
from transformer.core.layout import CARD, CURVES, LINEAGE, MODEL, PARAMS, TOKENIZER
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.shard import ShardConfig
from transformer.core.settings import ConfigError, build, parse_yaml
from transformer.data.vocab import TokenizerError, load_tokenizer
from transformer.model import checkpoint
from transformer.model.checkpoint import CheckpointError, build_model
from transformer.model.network import Transformer

FORMATS = ("hf", "ctranslate2")
QUANTIZATIONS = ("float32", "int8")  # CTranslate2's weight types
# our LayerNorms (res1, res2[, res3]) in Marian's names
NORMS = {
    "encoder": ("self_attn_layer_norm", "final_layer_norm"),
    "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"),
}


class ExportError(ValueError):
    """A package that cannot be exported (or is not a package); the message says why."""


def exportable(model: Transformer, lineage: dict[str, Any]) -> None:
    """ExportError unless Marian's class can hold `model` exactly."""
    if (lineage.get("lineage") or {}).get("ensemble"):
        raise ExportError(
            "the package's scores are an ensemble's (lineage.json lineage.ensemble): one "
            "exported model would not reproduce them; export each member's package instead"
        )
    c = model.cfg
    if c.pre_ln:
        raise ExportError(
            "model.pre_ln is true: Marian (HF MarianMTModel, and CTranslate2's converter of it) "
            "is post-LN only; a pre-LN model cannot be exported"
        )
    if c.d_model % 2:
        raise ExportError(f"model.d_model {c.d_model} is odd: Marian's sinusoids need it even")


def _perm(d_model: int) -> Tensor:
    """Our sinusoids interleave sin/cos (PE[:, 2i], PE[:, 2i+1]); Marian's put every sin first.
    Reordering the residual stream's features by this permutation maps one onto the other; the
    model computes the same function (LayerNorm and the heads do not care about the order)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_state(model: Transformer) -> dict[str, Tensor]:
    """Our state dict in Marian's names (separate q/k/v projections), residual features
    permuted by _perm (weights reading the stream: columns; writing it: rows)."""
    sd, p = model.state_dict(), _perm(model.cfg.d_model)
    if model.cfg.tie_embeddings:  # Marian ties the other three uses to it
        out = {"model.shared.weight": model.src_embed.weight[:, p]}
    else:
        out = {
            "model.encoder.embed_tokens.weight": model.src_embed.weight[:, p],
            "model.decoder.embed_tokens.weight": model.tgt_embed.weight[:, p],
            "lm_head.weight": model.out_weight[:, p],
        }
    for side in ("encoder", "decoder"):
        out[f"model.{side}.embed_positions.weight"] = model.pe[:, p]
    for side, norms in NORMS.items():
        for i in range(len(getattr(model, side))):
            a, b = f"{side}.{i}.", f"model.{side}.layers.{i}."
            for j, norm in enumerate(norms, 1):
                out[f"{b}{norm}.weight"] = sd[f"{a}res{j}.norm.weight"][p]
                out[f"{b}{norm}.bias"] = sd[f"{a}res{j}.norm.bias"][p]
            w, bias = sd[f"{a}self_attn.in_proj.weight"], sd[f"{a}self_attn.in_proj.bias"]
            for name, wt, bt in zip("qkv", w.chunk(3), bias.chunk(3)):
                out[f"{b}self_attn.{name}_proj.weight"], out[f"{b}self_attn.{name}_proj.bias"] = (
                    wt[:, p],
                    bt,
                )
            _writer(out, f"{b}self_attn.out_proj", sd, f"{a}self_attn.out_proj", p)
            out[f"{b}fc1.weight"], out[f"{b}fc1.bias"] = (
                sd[f"{a}ff.w1.weight"][:, p],
                sd[f"{a}ff.w1.bias"],
            )
            _writer(out, f"{b}fc2", sd, f"{a}ff.w2", p)
            if side == "decoder":
                w, bias = sd[f"{a}cross_attn.in_proj.weight"], sd[f"{a}cross_attn.in_proj.bias"]
                for name, wt, bt in zip("kv", w.chunk(2), bias.chunk(2)):
                    out[f"{b}encoder_attn.{name}_proj.weight"] = wt[:, p]
                    out[f"{b}encoder_attn.{name}_proj.bias"] = bt
                out[f"{b}encoder_attn.q_proj.weight"] = sd[f"{a}cross_attn.q_proj.weight"][:, p]
                out[f"{b}encoder_attn.q_proj.bias"] = sd[f"{a}cross_attn.q_proj.bias"]
                _writer(out, f"{b}encoder_attn.out_proj", sd, f"{a}cross_attn.out_proj", p)
    return {k: v.detach().float().contiguous() for k, v in out.items()}


def _writer(out: dict, hf: str, sd: dict, ours: str, p: Tensor) -> None:
    """A Linear writing into the residual stream: its rows (and bias) permuted."""
    out[f"{hf}.weight"], out[f"{hf}.bias"] = sd[f"{ours}.weight"][p], sd[f"{ours}.bias"][p]


def marian_config(model: Transformer):
    """MarianConfig of `model`'s shape; decoding starts from `<s>` as ours does."""
    from transformers import MarianConfig

    c, V = model.cfg, model.vocab_size
    return MarianConfig(
        vocab_size=V,
        decoder_vocab_size=V,
        d_model=c.d_model,
        encoder_layers=c.n_layers,
        decoder_layers=c.decoder_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.decoder_d_ff,
        activation_function="relu",
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation_dropout=c.activation_dropout,
        max_position_embeddings=c.max_positions,
        scale_embedding=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=c.tie_embeddings,
        tie_word_embeddings=c.tie_embeddings,
    )


def to_marian(model: Transformer):
    """HF MarianMTModel holding `model`'s weights: the same function, in HF's code."""
    from transformers import MarianMTModel

    hf = MarianMTModel(marian_config(model))
    missing, unexpected = hf.load_state_dict(marian_state(model), strict=False)
    tied = {"final_logits_bias"}
    if model.cfg.tie_embeddings:
        tied |= {"lm_head.weight"} | {f"model.{side}.embed_tokens.weight" for side in NORMS}
    if unexpected or set(missing) - tied:
        raise ExportError(f"Marian's layout changed: missing {missing}, unexpected {unexpected}")
    if model.output_ids is not None:  # model.output_vocab target: the others never output
        keep = torch.zeros(model.vocab_size, dtype=torch.bool)
        keep[model.output_ids] = True
        hf.final_logits_bias.masked_fill_(~keep, float("-inf"))
    return hf.eval()


def hf_tokenizer(tok_dir: Path, max_positions: int):
    """The trained tokenizer.json (any model type) as a PreTrainedTokenizerFast: the line
    stripped as transformer-translate strips it, `</s>` appended to every source as our
    encoder is trained with, and the specials at our ids."""
    from transformers import PreTrainedTokenizerFast

    tok = load_tokenizer(tok_dir).library_copy()
    tok.normalizer = normalizers.Sequence([normalizers.Strip(), *_steps(tok.normalizer)])
    eos = SPECIALS[EOS_ID]
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, EOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIALS[PAD_ID],
        bos_token=SPECIALS[BOS_ID],
        eos_token=eos,
        unk_token=SPECIALS[UNK_ID],
        model_max_length=max_positions,
        clean_up_tokenization_spaces=False,  # the decoder restores the text exactly
        split_special_tokens=True,  # "</s>" in a line is text, as in transformer-translate
    )


def _steps(normalizer) -> list:
    return [] if normalizer is None else [normalizer]


def generation_config(params: dict[str, Any], max_positions: int):
    """The decode section's beam and α as HF's defaults. HF has one length cap for all
    sentences, not decode's a·|src| + b: the cap for the longest source trained on (shard
    max_len), so that no output the decode stage would give is cut."""
    from transformers import GenerationConfig

    dec = build(DecodeConfig, params.get("decode") or {}, "decode", PARAMS)
    longest = build(ShardConfig, params.get("shard") or {}, "shard", PARAMS).max_len
    cap = min(int(dec.max_len_a * (longest + 1)) + dec.max_len_b, max_positions - 1)
    # HF refuses to save beam settings with one beam: they are given only for beam search
    beam = (
        {
            "length_penalty": dec.length_penalty,  # HF: score / len^α (ours: GNMT's)
            "early_stopping": True,  # a sentence ends with its k-th finished hypothesis, as ours
        }
        if dec.beam_size > 1
        else {}
    )
    return GenerationConfig(
        num_beams=dec.beam_size,
        **beam,
        max_new_tokens=cap,
        decoder_start_token_id=BOS_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=None,
        suppress_tokens=[PAD_ID, BOS_ID],  # never output, as in transformer/model/beam.py
    )


def read_package(pkg: Path) -> tuple[Transformer, dict[str, Any], dict[str, Any]]:
    """(model, params.yaml, lineage.json) of a package folder, checked to be exportable."""
    pkg = Path(pkg)
    for name in (MODEL, TOKENIZER, PARAMS, LINEAGE):
        if not (pkg / name).exists():
            raise ExportError(f"{pkg / name}: missing (not a package folder: the package stage's)")
    model = build_model(checkpoint.load(pkg / MODEL, mmap=True), pkg / MODEL).eval()
    params = parse_yaml((pkg / PARAMS).read_text(encoding="utf-8")) or {}
    lineage = json.loads((pkg / LINEAGE).read_text(encoding="utf-8"))
    exportable(model, lineage)
    return model, params, lineage


def write_hf(pkg: Path, out: Path) -> None:
    """The HF form of package `pkg` into the (new, empty) folder `out`."""
    model, params, _ = read_package(pkg)
    tok = hf_tokenizer(Path(pkg) / TOKENIZER, model.cfg.max_positions)
    hf = to_marian(model)
    hf.generation_config = generation_config(params, model.cfg.max_positions)
    hf.save_pretrained(out)
    tok.save_pretrained(out)
    # transformers 5 names the class TokenizersBackend, which 4.x cannot load; both load
    # PreTrainedTokenizerFast (5's alias of it), so the folder serves either
    path = Path(out) / "tokenizer_config.json"
    tok_cfg = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**tok_cfg, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    for name in (CARD, CURVES):  # the card and the picture it shows
        if (Path(pkg) / name).is_file():
            shutil.copyfile(Path(pkg) / name, out / name)


def write_ctranslate2(pkg: Path, out: Path, quantization: str = "float32") -> None:
    """CTranslate2's form of package `pkg` into `out` (replaced), through the HF form: the
    model, the tokenizer's files and the card."""
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization must be one of {', '.join(QUANTIZATIONS)}")
    try:
        import ctranslate2  # noqa: F401  (the optional extra)
    except ImportError:
        raise ExportError(
            "ctranslate2 is not installed: pip install 'transformer-pipeline[export]'"
        ) from None
    from transformer.model.ct2 import convert

    with tempfile.TemporaryDirectory(dir=Path(out).parent, prefix=".hf-") as tmp:
        write_hf(pkg, Path(tmp))
        convert(Path(tmp), Path(out), quantization)


def export(pkg: Path, fmt: str, out: Path, quantization: str = "float32") -> Path:
    """Write package `pkg` as `fmt` to `out`: all of it, or (an error) nothing."""
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    read_package(pkg)  # refused before a folder is made
    with atomic_dir(Path(out)) as tmp:
        if fmt == "hf":
            write_hf(pkg, tmp)
        else:
            write_ctranslate2(pkg, tmp, quantization)
    return Path(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="transformer-export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("package", type=Path, help="a package folder (dvc artifacts get's)")
    parser.add_argument("--format", choices=FORMATS, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    parser.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default="float32",
        help="ctranslate2: the weights' type (int8: ~4x smaller, faster on CPUs)",
    )
    args = parser.parse_args(argv)
    try:
        out = export(args.package, args.format, args.out, args.quantization)
    except (ExportError, CheckpointError, ConfigError, TokenizerError, OSError) as e:
        sys.exit(f"error: {e}")
    print(f"{out}: {args.format} export of {args.package}")


if __name__ == "__main__":
    main()
