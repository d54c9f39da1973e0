"""A distilled student's parts (issue 82): the distill stage (the teacher's beam or n-best
through the project's decoder, finished chunks resumed, no pairs without a teacher, the
direction checked, a second `dvc repro` translating nothing), the shard stage training on the
teacher's pairs, the student's shape, the race against the teacher and the rules of its gate."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml
from helpers.backtranslate import ENGLISH, GERMAN, backward_package
from prefect_fixtures import DVC, sh

from flows import distilled
from flows.significance import Rules
from transformer import decode, distill, race, shard, tokenizer
from transformer.core.card import _distilled
from transformer.core.files import sha256_file
from transformer.core.sections.distill import DistillConfig
from transformer.core.sections.model import ModelConfig
from transformer.core.settings import ConfigError
from transformer.data.batches import load_split
from transformer.model import checkpoint
from transformer.model.beam import beam_search, nbest_search
from transformer.model.incremental import Decoder
from transformer.model.network import Transformer

ROOT = Path(__file__).resolve().parents[1]
N = 10  # train pairs: three chunks of 4


def pair(i: int) -> tuple[str, str]:
    return f"{ENGLISH[i % len(ENGLISH)]} {i}", f"{GERMAN[i % len(GERMAN)]} {i}"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    """(a corpus folder: N English-German train pairs, an en -> de teacher's package)."""
    d = tmp_path_factory.mktemp("distill")
    (d / "corpus").mkdir()
    for side, lang in enumerate(("en", "de")):
        text = "".join(pair(i)[side] + "\n" for i in range(N))
        (d / "corpus" / f"train.{lang}").write_text(text)
    return d / "corpus", backward_package(d / "teacher", "en", "de")


def params(path: Path, **settings) -> Path:
    """A params.yaml for an en -> de student: short outputs, chunks of 4 lines, `settings`."""
    over = {"max_len_a": 0.0, "max_len_b": 8, "chunk_lines": 4, **settings}
    path.write_text(
        yaml.safe_dump(
            {
                "download": {"src_lang": "en", "tgt_lang": "de"},
                "distill": asdict(DistillConfig(**over)),
                "tokenizer": {"vocab_size": 300, "min_frequency": 1},
            }
        )
    )
    return path


def run(inputs, out: Path, teacher: Path | None = None, **settings):
    """The stage's CLI into `out`: (metrics, the sources kept, the teacher's translations)."""
    corpus, own = inputs
    p = params(out.parent / f"{out.name}.yaml", **settings)
    metrics = out.parent / f"{out.name}.json"
    distill.main(
        [str(corpus), str(teacher or own), str(out), "--chunks", str(out.parent / "chunks")]
        + ["--metrics", str(metrics), "--params", str(p)]
    )
    lines = [(out / f"distilled.{lang}").read_text().splitlines() for lang in ("en", "de")]
    return json.loads(metrics.read_text()), *lines


def test_beam_is_the_teachers_translate_command(inputs, tmp_path):
    m, en, de = run(inputs, tmp_path / "beam", beam_size=2)
    assert m["lines"] == N and m["chunks"] == 3 and m["chunks_translated"] == 3
    assert m["pairs"] == len(en) == len(de) == N - m["empty_dropped"] and m["pairs"] >= 5
    assert m["teacher"]["direction"] == "en-de" and m["pairs_per_second"] > 0
    assert not (tmp_path / "chunks").exists()  # the chunks go once the output is whole
    corpus, teacher = inputs
    (tmp_path / "decode.yaml").write_text(
        yaml.safe_dump({"decode": {"beam_size": 2, "max_len_a": 0.0, "max_len_b": 8}})
    )
    out = tmp_path / "translated.de"
    decode.main(
        ["--model", str(teacher), "-i", str(corpus / "train.en"), "-o", str(out)]
        + ["--params", str(tmp_path / "decode.yaml"), "--no-progress", "--device", "cpu"]
    )
    cli = [" ".join(t.split()) for t in out.read_text(encoding="utf-8").split("\n")[:-1]]
    assert [t for t in cli if t] == de  # the student's targets: the teacher's translations
    assert en == [pair(i)[0] for i, t in enumerate(cli) if t]  # beside their own sources


def test_nbest_keeps_the_closest_to_the_reference(inputs, tmp_path):
    from sacrebleu.metrics import CHRF

    from transformer.core.sections.decode import DecodeConfig
    from transformer.model.translator import load_translator

    beam = run(inputs, tmp_path / "beam", beam_size=3)
    # an n-best list of one is the beam's best: the same targets as beam search
    assert run(inputs, tmp_path / "n1", search="nbest", beam_size=3, nbest=1)[1:] == beam[1:]
    m, _en, de = run(inputs, tmp_path / "n3", search="nbest", beam_size=3, nbest=3)
    assert m["search"] == "nbest" and m["metric"] == "chrf"
    _corpus, teacher = inputs
    cfg = DecodeConfig(beam_size=3, max_len_a=0.0, max_len_b=8)
    tr = load_translator(teacher / "model.pt", teacher / "tokenizer", cfg)
    lists = tr.translate_nbest([pair(i)[0] for i in range(N)], 3)
    chosen = [distill.closest(h, pair(i)[1], CHRF()) for i, h in enumerate(lists)]
    assert [" ".join(t.split()) for t in chosen if t.strip()] == de


def test_closest_is_by_sentence_score_and_ties_keep_the_teachers_order():
    from sacrebleu.metrics import CHRF

    ref = "der Hund spielt im Garten"
    assert distill.closest(["ein Mann", "der Hund spielt", "Hund"], ref, CHRF()) == (
        "der Hund spielt"
    )
    assert distill.closest(["eine Katze", "eine Katze"], ref, CHRF()) == "eine Katze"
    with pytest.raises(ConfigError, match="distill.nbest \\(5\\) must be at most"):
        DistillConfig(search="nbest", beam_size=4, nbest=5)


def test_finished_chunks_are_resumed(inputs, tmp_path):
    """What a killed run left: chunk 1 of 3 whole (a marker text, to see it is not redone) and
    a half-written temporary file."""
    corpus, teacher = inputs
    cfg = DistillConfig(**yaml.safe_load(params(tmp_path / "p.yaml").read_text())["distill"])
    files = [corpus / "train.en", corpus / "train.de"]
    key = distill.fingerprint(files, teacher, cfg, ("en", "de"), sha256_file(teacher / "model.pt"))
    (tmp_path / "chunks" / key).mkdir(parents=True)
    (tmp_path / "chunks" / key / "000000.de").write_text("".join(f"kept {i}\n" for i in range(4)))
    (tmp_path / "chunks" / key / ".000001.de.x.tmp").write_text("half")
    m, _en, de = run(inputs, tmp_path / "out")
    assert (m["chunks_resumed"], m["chunks_translated"]) == (1, 2)
    assert de[:4] == [f"kept {i}" for i in range(4)] and "kept 0" not in de[4:]
    assert not (tmp_path / "chunks").exists()


def test_no_teacher_gives_no_pairs_and_a_wrong_one_is_named(inputs, tmp_path):
    none = tmp_path / "none"
    none.mkdir()
    (none / "NONE").write_text("no teacher model declared (params.yaml helpers.teacher is empty)\n")
    m, en, de = run(inputs, tmp_path / "out", teacher=none)
    assert m["pairs"] == 0 and en == de == [] and m["teacher"] is None
    assert m["skipped"].startswith("no teacher model declared")
    backward = backward_package(tmp_path / "de-en")  # de -> en: another direction
    with pytest.raises(SystemExit, match=r"meta.json: a de->en model; a teacher of a en->de"):
        run(inputs, tmp_path / "wrong", teacher=backward)


@pytest.mark.parametrize("mix", [False, True])
def test_shard_trains_a_student_on_its_teachers_pairs(inputs, tmp_path, mix):
    corpus, _ = inputs
    m, _en, de = run(inputs, tmp_path / "distill", beam_size=2)
    p = params(tmp_path / "shard.yaml", mix_originals=mix)
    tokenizer.main([str(corpus), str(tmp_path / "tok"), "--params", str(p)])
    shard.main(
        [str(corpus), str(tmp_path / "tok"), str(tmp_path / "shards"), "--params", str(p)]
        + ["--distilled", str(tmp_path / "distill"), "--metrics", str(tmp_path / "m.json")]
    )
    record = json.loads((tmp_path / "m.json").read_text())["distilled"]
    assert record == {"pairs": m["pairs"], "mix_originals": mix, "originals": N if mix else 0}
    train = load_split(tmp_path / "shards", "train")
    assert len(train) == m["pairs"] + (N if mix else 0)
    from transformer.data.vocab import load_tokenizer

    tok = load_tokenizer(tmp_path / "tok")
    targets = sorted(tok.decode([t[:-1].tolist() for _, t in train]))
    assert targets == sorted(de + ([pair(i)[1] for i in range(N)] if mix else []))


def test_a_students_shape_and_old_checkpoints(inputs):
    cfg = ModelConfig(
        d_model=16, d_ff=32, n_heads=2, n_layers=2, n_decoder_layers=1, d_ff_decoder=8
    )
    student = Transformer(cfg, 40)
    assert (len(student.encoder), len(student.decoder)) == (2, 1)
    assert (
        student.encoder[0].ff.w1.out_features == 32 and student.decoder[0].ff.w1.out_features == 8
    )
    with pytest.raises(ConfigError, match="model.n_decoder_layers must be >= 0"):
        ModelConfig(n_decoder_layers=-1)
    # a checkpoint from before the decoder's own keys: as deep and wide as its encoder
    ckpt = checkpoint.load(inputs[1] / "model.pt")
    for k in ("n_decoder_layers", "d_ff_decoder"):
        ckpt["model_config"].pop(k)
    model = checkpoint.build_model(ckpt)
    assert len(model.decoder) == len(model.encoder) == ckpt["model_config"]["n_layers"]
    # the first of beam search's n best is beam search's
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    cap = torch.tensor([6, 6])
    best = beam_search(Decoder(model), src, 3, 0.6, cap)
    lists = nbest_search(Decoder(model), src, 3, 2, 0.6, cap)
    assert [x[0] for x in lists] == best and all(1 <= len(x) <= 2 for x in lists)


def test_the_race_times_both_on_the_test_set(inputs, tmp_path):
    corpus, teacher = inputs
    raw = tmp_path / "raw"
    raw.mkdir()
    for lang in ("en", "de"):
        shutil.copy(corpus / f"train.{lang}", raw / f"test.{lang}")
    pkg = tmp_path / "teacher"
    shutil.copytree(teacher, pkg)
    (pkg / "params.yaml").write_text(
        yaml.safe_dump({"decode": {"beam_size": 3, "max_len_a": 0.0, "max_len_b": 8}})
    )
    p = params(tmp_path / "p.yaml", rounds=2)
    spec = yaml.safe_load(p.read_text())
    spec.update(decode={"beam_size": 1, "max_len_a": 0.0, "max_len_b": 8})
    spec.update(helpers={"teacher": "en-de@v1.0.0"})
    p.write_text(yaml.safe_dump(spec))
    out, metrics = tmp_path / "race", tmp_path / "race.json"
    argv = [str(teacher / "model.pt"), str(teacher / "tokenizer"), str(raw)]
    race.main([*argv, str(pkg), str(out), "--metrics", str(metrics), "--params", str(p)])
    m = json.loads(metrics.read_text())
    assert (m["split"], m["sentences"], m["threads"], m["rounds"]) == ("test", N, 1, 2)
    assert (m["student"]["beam_size"], m["teacher"]["beam_size"]) == (1, 3)
    assert (m["teacher"]["line"], m["teacher"]["version"]) == ("en-de", "v1.0.0")
    assert m["speedup"] == pytest.approx(
        m["student"]["sentences_per_second"] / m["teacher"]["sentences_per_second"], rel=0.01
    )
    assert m["bleu_gap"] == pytest.approx(m["teacher"]["bleu"] - m["student"]["bleu"], abs=1e-3)
    assert len((out / m["hyps"]).read_text().splitlines()) == N
    none = tmp_path / "none"
    none.mkdir()
    (none / "NONE").write_text("no teacher model declared\n")
    race.main(
        [*argv, str(none), str(tmp_path / "r2"), "--metrics", str(metrics), "--params", str(p)]
    )
    assert json.loads(metrics.read_text())["teacher"] is None
    assert (tmp_path / "r2" / "NONE").read_text() == "no teacher model declared\n"


RACED = {
    "split": "test",
    "speedup": 2.5,
    "student": {"sentences_per_second": 500.0},
    "teacher": {"line": "en-de", "version": "v1.0.0", "sentences_per_second": 200.0},
}


def paired(gap: float) -> dict:
    """A paired test's figures (significance.paired_bs) of a student `gap` below its teacher."""
    return {"bleu": 30.0 - gap, "champion_bleu": 30.0, "bleu_delta": -gap, "p": 0.01}


def test_the_gate_weighs_the_gap_and_the_speed_and_names_what_failed():
    rules = Rules(max_gap=1.0, min_speedup=2.0)
    ok, why, figures = distilled.judge(paired(0.4), RACED, rules)
    assert ok and why.startswith("student of en-de@v1.0.0: BLEU gap 0.40 (max_gap 1.0)")
    assert figures["failed"] == [] and figures["speedup"] == 2.5
    ok, why, figures = distilled.judge(paired(1.5), RACED, rules)
    assert not ok and figures["failed"] == ["gap"] and "more than max_gap 1.0" in why
    slow = {**RACED, "speedup": 1.2}
    ok, why, figures = distilled.judge(paired(0.4), slow, rules)
    assert not ok and figures["failed"] == ["speed"] and "below min_speedup 2.0" in why
    ok, why, figures = distilled.judge(paired(2.0), slow, rules)
    assert not ok and figures["failed"] == ["gap", "speed"]
    flat = {"teacher/line": "en-de", "teacher/version": "v1.0.0", "bleu_gap": 0.4, "speedup": 2.5}
    assert distilled.said(flat) == "0.4 below en-de@v1.0.0, 2.5x"
    assert distilled.said({"teacher": None}) is None


def test_the_card_names_the_teacher_its_version_the_gap_and_the_speedup():
    raced = {
        **RACED,
        "bleu_gap": 0.4,
        "sentences": 1000,
        "threads": 1,
        "rounds": 3,
        "student": {
            "sentences_per_second": 500.0,
            "bleu": 29.6,
            "beam_size": 1,
            "precision": "int8",
        },
    }
    raced["teacher"] = {**RACED["teacher"], "bleu": 30.0, "beam_size": 4, "precision": "fp32"}
    text = "\n".join(_distilled(raced))
    assert "line `en-de` version `v1.0.0`" in text and "BLEU gap 0.4 below the teacher" in text
    assert "2.5x its speed" in text and "| student | greedy, int8 | 29.6 | 500.0 |" in text
    assert _distilled({"teacher": None, "skipped": "no teacher"}) == []


@pytest.mark.slow  # three `dvc repro`s
def test_dvc_caches_the_teachers_translations(inputs, tmp_path):
    """The dvc.yaml stage in a project of its own: a second `dvc repro` translates nothing (its
    output deleted: restored from DVC's cache), and mix_originals and rounds are no deps of it."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "transformer", project / "transformer")
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["distill"]
    (project / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"distill": stage}}))
    shutil.copytree(inputs[0], project / "data" / "corpus")
    shutil.copytree(inputs[1], project / "data" / "helpers" / "teacher")
    spec = yaml.safe_load(params(project / "params.yaml").read_text())
    (project / ".gitignore").write_text("/data/\n__pycache__/\n")
    sh("git", "init", "-q", cwd=project)
    sh(*DVC, "init", "-q", cwd=project)
    out = sh(*DVC, "repro", cwd=project)
    assert "chunk 3/3:" in out
    metrics = project / "data" / "metrics" / "distill.json"
    stamp = metrics.stat().st_mtime_ns
    out = sh(*DVC, "repro", cwd=project)
    assert "didn't change" in out and "chunk" not in out and metrics.stat().st_mtime_ns == stamp
    shutil.rmtree(project / "data" / "distill")
    out = sh(*DVC, "repro", cwd=project)
    assert "chunk" not in out and (project / "data" / "distill" / "distilled.de").exists()
    spec["distill"].update(mix_originals=True, rounds=5)
    (project / "params.yaml").write_text(yaml.safe_dump(spec))
    assert json.loads(sh(*DVC, "status", "--json", cwd=project)) == {}


def test_the_helpers_stage_refuses_a_teacher_without_a_version(tmp_path):
    from transformer import helpers
    from transformer.core.sections.helpers import HelpersConfig

    with pytest.raises(helpers.HelperError, match="the teacher line en-de without a version"):
        helpers.prepare(tmp_path, HelpersConfig(teacher="en-de"), ("en", "de"))
    out = helpers.prepare(tmp_path, HelpersConfig(), ("en", "de"))  # not a student: NONE
    assert out["teacher"]["line"] is None and (tmp_path / "teacher" / "NONE").is_file()
