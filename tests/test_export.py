"""The package in Hugging Face's and CTranslate2's formats (transformer/export.py): the same
greedy outputs token for token, the same beam outputs under the one length penalty all three
share, the tokenizer's specials at our ids, the model card, and what cannot be exported."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import pytest
import torch
import yaml

from transformer import export, package
from transformer.core.files import sha256_file
from transformer.core.sections.decode import DecodeConfig
from transformer.core.sections.model import ModelConfig
from transformer.model import checkpoint
from transformer.model.beam import translate_ids
from transformer.model.network import Transformer
from transformer.model.translator import load_translator
from transformer.package import PackageError

ctranslate2 = pytest.importorskip("ctranslate2")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pkg(scored, tmp_path_factory):
    """The package stage's folder with both exports (hf/, ctranslate2/ in float32)."""
    d = scored
    params = yaml.safe_load((d / "params.yaml").read_text())
    params["package"] = {"hf": True, "ctranslate2": "float32"}
    out = tmp_path_factory.mktemp("export") / "pkg"
    package.package(d / "avg.pt", d / "tokenizer", d / "ev.json", params, out)
    return out


def ours(pkg, lines: list[str], cfg: DecodeConfig) -> tuple[list[list[int]], list[list[int]]]:
    """(source ids, output ids) of transformer-translate's search."""
    tr = load_translator(pkg / "model.pt", pkg / "tokenizer", cfg, device=torch.device("cpu"))
    srcs = tr.encode(lines)
    return srcs, translate_ids(tr.dec, srcs, cfg)


def hf_ids(pkg, lines: list[str], cfg: DecodeConfig) -> list[list[int]]:
    """MarianMTModel.generate, one sentence at a time: HF has one length cap per call."""
    tok = transformers.AutoTokenizer.from_pretrained(pkg / "hf")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(pkg / "hf")
    out = []
    for line in lines:
        ids = tok(line, return_tensors="pt").input_ids
        cap = int(cfg.max_len_a * ids.size(1)) + cfg.max_len_b
        gen = model.generate(
            ids,
            num_beams=cfg.beam_size,
            length_penalty=cfg.length_penalty,
            max_new_tokens=cap,
        )[0].tolist()
        out.append([t for t in gen[1:] if t not in (0, 2)])  # BOS first; EOS, then padding
    return out


def ct2_ids(pkg, lines: list[str], cfg: DecodeConfig) -> list[list[int]]:
    tok = transformers.AutoTokenizer.from_pretrained(pkg / "ctranslate2")
    tr = ctranslate2.Translator(str(pkg / "ctranslate2"), device="cpu", intra_threads=1)
    out = []
    for line in lines:
        src = tok.convert_ids_to_tokens(tok.encode(line))
        cap = int(cfg.max_len_a * len(src)) + cfg.max_len_b
        res = tr.translate_batch(
            [src],
            beam_size=cfg.beam_size,
            length_penalty=cfg.length_penalty,
            max_decoding_length=cap,
        )
        out.append(tok.convert_tokens_to_ids(res[0].hypotheses[0]))
    return out


def test_greedy_outputs_equal_ours_token_for_token(pkg, scored):
    lines = (scored / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    cfg = DecodeConfig(beam_size=1, max_len_b=5)
    srcs, want = ours(pkg, lines, cfg)
    tok = transformers.AutoTokenizer.from_pretrained(pkg / "hf")
    assert [tok(line).input_ids for line in lines] == srcs  # EOS appended, as ours
    assert hf_ids(pkg, lines, cfg) == want
    assert ct2_ids(pkg, lines, cfg) == want
    assert all(want)  # something to compare: no empty outputs


def test_beam_outputs_equal_ours_under_the_shared_penalty(pkg, scored):
    """α = 0 (log-probability alone) is the one penalty HF's len^α, CTranslate2's len^α and
    GNMT's ((5+len)/6)^α share: then the three beam searches agree."""
    lines = (scored / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    cfg = DecodeConfig(beam_size=4, length_penalty=0.0, max_len_b=5)
    _, want = ours(pkg, lines, cfg)
    assert hf_ids(pkg, lines, cfg) == want
    assert ct2_ids(pkg, lines, cfg) == want


def test_the_tokenizer_keeps_our_specials_and_text(pkg):
    tok = transformers.AutoTokenizer.from_pretrained(pkg / "hf")
    assert [tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id] == [0, 1, 2, 3]
    text = "a </s> in the text, not EOS"
    ids = tok("  " + text + " ").input_ids
    assert ids.count(2) == 1 and ids[-1] == 2  # stripped as ours; the only EOS is appended
    assert tok.decode(ids, skip_special_tokens=True) == text
    tok_cfg = json.loads((pkg / "hf" / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"  # transformers 4.x loads it
    gen = json.loads((pkg / "hf" / "generation_config.json").read_text())
    assert gen["num_beams"] == 2 and gen["decoder_start_token_id"] == 1  # params' decode


@pytest.mark.parametrize("beam_size", [1, 4])
def test_the_generation_config_saves_for_any_beam(beam_size, tmp_path):
    """HF refuses to save a greedy config that names beam settings."""
    gen = export.generation_config({"decode": {"beam_size": beam_size}}, max_positions=1024)
    gen.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["num_beams"] == beam_size and saved["max_new_tokens"] == 256 + 1 + 50
    assert saved.get("length_penalty") == (0.6 if beam_size > 1 else None)


def test_the_model_card(pkg, scored):
    card = (pkg / "README.md").read_text(encoding="utf-8")
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["language"] == ["en", "de"] and meta["license"] == "mit"
    assert meta["metrics"] == ["bleu", "chrf"] and meta["pipeline_tag"] == "translation"
    scores = json.loads((scored / "ev.json").read_text())
    assert scores["bleu_signature"].replace("|", "\\|") in body and str(scores["bleu"]) in body
    assert scores["lineage"]["model_sha256"] in body
    assert (pkg / "hf" / "README.md").read_text(encoding="utf-8") == card
    assert (pkg / "ctranslate2" / "README.md").read_text(encoding="utf-8") == card


def variant(pkg, out, **model_config):
    """A copy of package `pkg` (without its exports) whose model has other model settings."""
    shutil.copytree(pkg, out, ignore=shutil.ignore_patterns("hf", "ctranslate2"))
    ckpt = checkpoint.load(out / "model.pt")
    cfg = ModelConfig(**{**ckpt["model_config"], **model_config})
    torch.manual_seed(0)
    ckpt.update(model=Transformer(cfg, ckpt["vocab_size"]).state_dict(), model_config=asdict(cfg))
    (out / "model.pt").unlink()
    checkpoint.save(out / "model.pt", ckpt)
    scores = json.loads((out / "lineage.json").read_text())
    scores["lineage"]["model_sha256"] = sha256_file(out / "model.pt")  # scored, as evaluate does
    (out / "lineage.json").write_text(json.dumps(scores))
    return out


def test_an_untied_model_is_exported_as_trained(pkg, scored, tmp_path):
    """Marian holds separate encoder, decoder and output matrices too."""
    untied = variant(pkg, tmp_path / "untied", tie_embeddings=False)
    export.export(untied, "hf", untied / "hf")
    lines = (scored / "raw" / "test.en").read_text(encoding="utf-8").splitlines()
    cfg = DecodeConfig(beam_size=1, max_len_b=5)
    assert hf_ids(untied, lines, cfg) == ours(untied, lines, cfg)[1]


def test_what_cannot_be_exported_is_refused(pkg, tmp_path):
    pre = variant(pkg, tmp_path / "pre-ln", pre_ln=True)
    with pytest.raises(SystemExit, match="model.pre_ln is true: Marian .* is post-LN only"):
        export.main([str(pre), "--format", "hf", "--out", str(tmp_path / "out")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pre-ln"]  # nothing half-written
    ens = tmp_path / "ensemble"
    shutil.copytree(pkg, ens, ignore=shutil.ignore_patterns("hf", "ctranslate2"))
    scores = json.loads((ens / "lineage.json").read_text())
    scores["lineage"]["ensemble"] = [{"model": "b.pt"}]
    (ens / "lineage.json").write_text(json.dumps(scores))
    with pytest.raises(SystemExit, match="an ensemble's"):
        export.main([str(ens), "--format", "ctranslate2", "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    # the package stage says which setting packages such a model without the export
    params = yaml.safe_load((pre / "params.yaml").read_text())
    with pytest.raises(PackageError, match="package.hf: false"):
        package.package(
            pre / "model.pt",
            pre / "tokenizer",
            pre / "lineage.json",
            params,
            tmp_path / "pkg",
        )
    assert not (tmp_path / "pkg").exists()
