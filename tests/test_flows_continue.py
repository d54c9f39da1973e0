"""Retraining that continues from the champion, on the real stages with a real Prefect server
and real DVC: a continued candidate promoted after the data grew, its tokenizer and weights the
champion's (its own line's, not those of the line declared beside it), its lineage naming its
parent; and each fallback to scratch with its reason.

The line beside it, `b`, is the demo reversed, shortened (`demo-de-en`): its first run also
shows that every stage runs the German -> English direction and that the package says so."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from helpers.continuing import PRESET, Champion, write_corpus
from helpers.lines import TINY_MODEL, declare, tags
from prefect_fixtures import DVC, sh

from flows import lineage, registry, results
from flows.dag import locked_outs, read_dag
from flows.pipeline import prepare
from flows.retrain import Start, plan
from flows.workspace import LINES, WORKSPACE

GREEK = ["η", "γάτα", "κάθεται", "στο", "χαλί", "και", "κοιτάζει", "έξω", "σπίτι", "δρόμο"]
# line b: the demo reversed, smaller and 40 updates (no HF export: no test reads it)
DE_EN = [
    *TINY_MODEL,
    "train.max_steps=40",
    "train.save_every_steps=10",
    "train.valid_every_steps=20",
    "average.last_k=2",
    "decode.beam_size=1",
    "package.hf=false",
]
# the champion's artifact as it was (no meta: the recipe the retrain is given, the project's
# own run workspace), and line b declared beside it
BESIDE = yaml.safe_dump(
    {
        "artifacts": {
            "transformer": {"path": "data/package", "type": "model"},
            "b": {
                "path": "data/package",
                "type": "model",
                "meta": {"recipe": {"preset": "demo-de-en", "overrides": DE_EN}, "schedule": None},
            },
        }
    },
    sort_keys=False,
)


def stage_runs(flow_run_id) -> dict[str, int]:
    """How many times each stage's task ran in the flow run (the Prefect server's task runs)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as c:
        runs = c.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    counts: dict[str, int] = {}
    for r in runs:
        name = r.name.rsplit("-", 1)[0]
        counts[name] = counts.get(name, 0) + 1
    return counts


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def md5s(hashes: str) -> list[str]:
    """The content hashes of an outs_hash string ("path=md5,..."), without the paths."""
    return [h.split("=", 1)[1] for h in hashes.split(",")]


def german_to_english(ws: Path) -> None:
    """The run in workspace `ws` went German -> English, every stage of it."""
    data = ws / "data"
    manifest = json.loads((data / "metrics/download.json").read_text())
    assert (manifest["src_lang"], manifest["tgt_lang"]) == ("de", "en")
    hyps = (data / "eval/hyps.test.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len((data / "raw/test.en").read_text(encoding="utf-8").splitlines())
    scores = json.loads((data / "metrics/evaluate.json").read_text())
    assert scores["n_sentences"] == 20 and "bleu_tok_compound_split" not in scores  # German's
    card = (data / "package/README.md").read_text(encoding="utf-8")
    assert "de-en" in card and "en-de" not in card


def package_hash(project: Path, commit: str) -> list[str]:
    """DVC's hash of the package of the run saved in `commit`, as its own dvc.lock has it."""
    lock = locked_outs(lineage.Snapshot(project, commit).text("dvc.lock"))
    return md5s(lineage.outs_hash(lock, read_dag(project), "package"))


@pytest.mark.slow
def test_continue_promoted_then_each_fallback(
    prefect_server: dict, continuing_champion: Champion
) -> None:
    from flows.retrain import retrain

    source, corpus, project = (
        continuing_champion.source,
        continuing_champion.corpus,
        continuing_champion.project,
    )
    ws, v1 = project / WORKSPACE, continuing_champion.v1

    first = continuing_champion.first  # the first retrain of the recipe (helpers/continuing.py)
    assert "trained from scratch: no champion to continue from" in first["reason"]
    assert first["promoted"] and first["version"] == "v1.0.0", first["reason"]
    assert (ws / "data/parent/NONE").is_file()

    # another line beside it, with a champion of its own (other weights, another direction)
    declare(project, BESIDE)
    b = retrain(line="b", project=str(project))
    assert b["promoted"] and b["version"] == "v1.0.0", b["reason"]
    assert b["line"] == "b" and b["parent"] is None, b
    german_to_english(project / LINES / "b")
    b1 = sha(project / LINES / "b/data/package/model.pt")
    assert sha(v1 / "model.pt") != b1  # two champions, told apart by weights
    b_tags = tags(project, "b@*", "b#*", "decision/b/*")

    write_corpus(source, corpus, 400)  # the data grows (b is not retrained)
    out = retrain(preset=PRESET, project=str(project), line="transformer")
    assert out["reason"].startswith("data_hash changed; trained continued from v1.0.0"), out
    assert out["line"] == "transformer" and out["parent"] == "v1.0.0", out
    assert out["champion_before"]["version"] == "v1.0.0", out["champion_before"]
    assert out["promoted"] and out["version"] == "v2.0.0", out["reason"]
    # better beyond noise on both sets (test_gate refuses a candidate equal up to noise)
    assert "better beyond noise [test: BLEU" in out["reason"], out["reason"]
    (test, valid) = out["gate"]["tests"]
    assert test["p"] < 0.05 and test["bleu_delta"] > 0 and valid["set"] == "valid", test
    assert test["bleu"] == out["candidate"]["bleu"]
    # its own line's champion (fetched into data/parent), not b's: the champion's tokenizer,
    # not a new one, and training from its weights
    assert sha(ws / "data/parent/model.pt") == sha(v1 / "model.pt")
    kept = (ws / "data/tokenizer/tokenizer.json").read_bytes()
    assert kept == (v1 / "tokenizer/tokenizer.json").read_bytes()
    ckpt = torch.load(max((ws / "data/checkpoints").glob("step_*.pt")), weights_only=True)
    assert ckpt["parent_sha256"] == sha(v1 / "model.pt") != b1 and ckpt["step"] == 150
    shard = json.loads((ws / "data/metrics/shard.json").read_text())
    assert 0 < shard["vocabulary"]["oov_rate"] <= 0.4
    # lineage: the registry's record names the line and the parent; DVC's hash of data/parent
    # is the hash of v1's package as v1's own dvc.lock recorded it (not b's); the package
    # carries the chain
    record = registry.record_at(project, out["candidate"]["experiment_commit"])
    assert record["line"] == "transformer" and record["parent"] == "v1.0.0", record
    champion = registry.champion(project, "transformer")
    assert champion["version"] == "v2.0.0" and champion["parent"] == "v1.0.0"
    assert champion["parent_chain"] == ["v1.0.0"]
    c1 = first["candidate"]["experiment_commit"]
    v1_package = package_hash(project, c1)
    assert (
        md5s(champion["parent_hash"])
        == v1_package
        != package_hash(project, b["candidate"]["experiment_commit"])
    )
    lineage_json = json.loads((ws / "data/package/lineage.json").read_text())
    assert lineage_json["parent"]["chain"] == ["v1.0.0"]
    assert lineage_json["parent"]["model_sha256"] == sha(v1 / "model.pt")
    status = sh(*DVC, "status", "--json", cwd=ws)
    assert json.loads(status) == {}  # dvc.lock describes the workspace: the parent included
    # make results shows the chain: v2.0.0's row names v1.0.0 as its parent
    rows = {r[2]: r for r in results.rows(project, "transformer")}
    assert rows["v2.0.0"][3] == "v1.0.0" and rows["v1.0.0"][3] == "-"
    assert tags(project, "b@*", "b#*", "decision/b/*") == b_tags  # b's registry untouched

    # a recipe whose model shape, tokenizer and language pair all differ from v2.0.0's (as its
    # experiment commit recorded them): scratch, each named. The decision alone, on the real
    # registry and workspace; the scratch run it leads to is the fallback test's
    changes = ["model.d_model=48", "tokenizer.vocab_size=320", "download.tgt_lang=fr"]
    ws, _ = prepare(project, "HEAD", PRESET, changes)
    start, _ = plan(project, ws, read_dag(ws), registry.champion(project, "transformer"))
    assert start == Start(
        None,
        "from scratch: the recipe changed model.d_model 64 -> 48; tokenizer.vocab_size 300 -> "
        "320; download.tgt_lang 'de' -> 'fr' since v2.0.0",
        ("retrain.mode=scratch",),
    )


@pytest.mark.slow
def test_continue_falls_back_when_the_new_data_is_new_to_the_tokenizer(
    prefect_server: dict, continuing_champion: Champion
) -> None:
    from flows.retrain import retrain

    source, corpus, project = (
        continuing_champion.source,
        continuing_champion.corpus,
        continuing_champion.project,
    )
    ws = project / WORKSPACE
    first = continuing_champion.first  # v1.0.0 of the first 300 pairs (helpers/continuing.py)
    assert first["version"] == "v1.0.0", first["reason"]
    kept = (ws / "data/tokenizer/tokenizer.json").read_bytes()
    # new data in a script the tokenizer never saw (distinct lines: the download stage dedups)
    greek = [
        " ".join([*(GREEK[(i + j) % 10] for j in range(8)), GREEK[i // 10 % 10], GREEK[i // 100]])
        + "\n"
        for i in range(400)
    ]
    write_corpus(source, corpus, 400, greek)
    state = retrain(preset=PRESET, project=str(project), return_state=True)
    out = state.result()
    assert "trained from scratch: v1.0.0's tokenizer leaves" in out["reason"], out["reason"]
    # decided after the download stage and before any other: each stage ran once, none twice
    # for the fallback
    ran = stage_runs(state.state_details.flow_run_id)
    assert ran == dict.fromkeys(read_dag(ws), 1), ran
    # (but helpers: no other line's champion is used, its folder as it was; backtranslate: no
    # monolingual text, and none changed)
    skipped = {"helpers": "skipped", "backtranslate": "skipped"}
    assert out["stages"] == {**dict.fromkeys(read_dag(ws), "ran"), **skipped}
    assert "more than retrain.max_oov_rate 40.00%" in out["reason"]
    assert out["parent"] is None and (ws / "data/parent/NONE").is_file()
    assert (ws / "data/tokenizer/tokenizer.json").read_bytes() != kept  # a new tokenizer
    record = registry.record_at(project, out["candidate"]["experiment_commit"])
    assert record["parent"] is None and "retrain.mode=scratch" in record["overrides"]
