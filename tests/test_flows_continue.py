"""Retraining that continues from the champion, on the real seven stages (plus `parent`) with a
real Prefect server and real DVC: a continued candidate promoted after the data grew, its
tokenizer and weights the champion's, its lineage naming its parent; and each fallback to
scratch with its reason."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers.checkout import checkout
from prefect_fixtures import DVC, sh

from flows import lineage, registry, results
from flows.dag import locked_outs, read_dag
from flows.workspace import WORKSPACE

PRESET = "tiny-continue"
GREEK = ["η", "γάτα", "κάθεται", "στο", "χαλί", "και", "κοιτάζει", "έξω", "σπίτι", "δρόμο"]


def preset(corpus: Path) -> dict:
    """The demo at a few dozen steps, on local files that the test grows, continuing."""
    split = {s: [{"path": f"{corpus}/{s}.{{lang}}", "name": s}] for s in ("train", "valid", "test")}
    return {
        "download": {"source": "local", "splits": split},
        "tokenizer": {"vocab_size": 300},
        "model": {"d_model": 64, "d_ff": 256, "n_layers": 1},
        "train": {  # a short warmup: the continuation goes on at the champion's rate
            "max_steps": 10,
            "warmup_steps": 10,
            "lr_scale": 0.2,
            "max_tokens": 1024,
            "save_every_steps": 5,
            "valid_every_steps": 5,
            "threads": 1,
        },
        "average": {"last_k": 2},
        "decode": {"beam_size": 1},
        "retrain": {
            "mode": "continue",
            "max_oov_rate": 0.4,  # this tiny vocabulary leaves ~1/4 of its own words to bytes
            "continuation": {"max_steps": 150},  # the default rate: the champion's own
        },
    }


def corpus_files(tmp_path: Path) -> Path:
    """400 synthetic en-de pairs (valid/test 20) as the download stage writes them."""
    gen = tmp_path / "gen"
    gen.mkdir()
    params = {"download": {"synthetic": {"train": 400, "valid": 20, "test": 20}}}
    (gen / "params.yaml").write_text(yaml.safe_dump(params))
    sh(sys.executable, "-m", "transformer.download", str(gen / "raw"), cwd=gen)
    return gen / "raw"


def write_corpus(src: Path, dest: Path, n: int, extra: list[str] = ()) -> None:
    dest.mkdir(exist_ok=True)
    for lang in ("en", "de", "fr"):  # fr: a copy of de, for a recipe of another language pair
        side = "de" if lang == "fr" else lang
        for split in ("valid", "test"):
            shutil.copy(src / f"{split}.{side}", dest / f"{split}.{lang}")
        lines = (src / f"train.{side}").read_text().splitlines(keepends=True)[:n]
        (dest / f"train.{lang}").write_text("".join(lines) + "".join(extra))


def project_with_recipe(tmp_path: Path, n: int) -> tuple[Path, Path, Path]:
    """(the generated corpus, the local corpus of its first n train pairs, a checkout of the
    project with the continuing recipe committed as preset PRESET)."""
    source, corpus = corpus_files(tmp_path), tmp_path / "corpus"
    write_corpus(source, corpus, n)
    project = checkout(tmp_path)
    (project / "presets" / f"{PRESET}.yaml").write_text(yaml.safe_dump(preset(corpus)))
    sh("git", "add", "-A", cwd=project)
    sh("git", "commit", "-qm", "a continuing recipe", cwd=project)
    return source, corpus, project


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


@pytest.mark.slow
def test_continue_promoted_then_each_fallback(prefect_server: dict, tmp_path: Path) -> None:
    from flows.retrain import retrain

    source, corpus, project = project_with_recipe(tmp_path, 300)
    ws = project / WORKSPACE

    first = retrain(preset=PRESET, project=str(project))
    assert "trained from scratch: no champion to continue from" in first["reason"]
    assert first["promoted"] and first["version"] == "v1.0.0", first["reason"]
    assert (ws / "data/parent/NONE").is_file()
    v1 = tmp_path / "v1"
    shutil.copytree(ws / "data/package", v1)

    write_corpus(source, corpus, 400)  # the data grows
    out = retrain(preset=PRESET, project=str(project))
    assert out["reason"].startswith("data_hash changed; trained continued from v1.0.0"), out
    assert out["parent"] == "v1.0.0"
    assert out["promoted"] and out["version"] == "v2.0.0", out["reason"]
    # the champion's tokenizer, not a new one, and training from its weights
    kept = (ws / "data/tokenizer/tokenizer.json").read_bytes()
    assert kept == (v1 / "tokenizer/tokenizer.json").read_bytes()
    ckpt = torch.load(max((ws / "data/checkpoints").glob("step_*.pt")), weights_only=True)
    assert ckpt["parent_sha256"] == sha(v1 / "model.pt") and ckpt["step"] == 150
    shard = json.loads((ws / "data/metrics/shard.json").read_text())
    assert 0 < shard["vocabulary"]["oov_rate"] <= 0.4
    # lineage: the registry's record names the parent; DVC's hash of data/parent is the hash of
    # v1's package as v1's own dvc.lock recorded it; the package carries the chain
    champion = registry.champion(project)
    assert champion["version"] == "v2.0.0" and champion["parent"] == "v1.0.0"
    assert champion["parent_chain"] == ["v1.0.0"]
    c1 = first["candidate"]["experiment_commit"]
    v1_lock = locked_outs(lineage.Snapshot(project, c1).text("dvc.lock"))
    v1_package = lineage.outs_hash(v1_lock, read_dag(project), "package")
    assert md5s(champion["parent_hash"]) == md5s(v1_package)
    lineage_json = json.loads((ws / "data/package/lineage.json").read_text())
    assert lineage_json["parent"]["chain"] == ["v1.0.0"]
    assert lineage_json["parent"]["model_sha256"] == sha(v1 / "model.pt")
    status = sh(*DVC, "status", "--json", cwd=ws)
    assert json.loads(status) == {}  # dvc.lock describes the workspace: the parent included
    # make results shows the chain: v2.0.0's row names v1.0.0 as its parent
    rows = {r[2]: r for r in results.rows(project)}
    assert rows["v2.0.0"][3] == "v1.0.0" and rows["v1.0.0"][3] == "-"

    # each reason to train from scratch instead, with its reason in the decision
    # a recipe whose model shape, tokenizer and language pair all differ: each named
    changes = ["model.d_model=48", "tokenizer.vocab_size=320", "download.tgt_lang=fr"]
    out = retrain(preset=PRESET, overrides=changes, project=str(project))
    assert (
        "trained from scratch: the recipe changed model.d_model 64 -> 48; "
        "tokenizer.vocab_size 300 -> 320; download.tgt_lang 'de' -> 'fr' since v2.0.0"
    ) in out["reason"], out["reason"]
    assert out["parent"] is None and (ws / "data/parent/NONE").is_file()
    record = registry.record_at(project, out["candidate"]["experiment_commit"])
    assert record["parent"] is None and "retrain.mode=scratch" in record["overrides"]


@pytest.mark.slow
def test_continue_falls_back_when_the_new_data_is_new_to_the_tokenizer(
    prefect_server: dict, tmp_path: Path
) -> None:
    from flows.retrain import retrain

    source, corpus, project = project_with_recipe(tmp_path, 400)
    ws = project / WORKSPACE
    first = retrain(preset=PRESET, project=str(project))
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
    # decided before any stage but download: each stage ran once (download: forced, then found
    # up to date by the experiment's run), none twice for the fallback
    ran = stage_runs(state.state_details.flow_run_id)
    assert ran == {**dict.fromkeys(read_dag(ws), 1), "download": 2}, ran
    assert out["stages"]["download"] == "skipped"
    assert {s: r for s, r in out["stages"].items() if s != "download"} == dict.fromkeys(
        [s for s in read_dag(ws) if s != "download"], "ran"
    )
    assert "more than retrain.max_oov_rate 40.00%" in out["reason"]
    assert out["parent"] is None and (ws / "data/parent/NONE").is_file()
    assert (ws / "data/tokenizer/tokenizer.json").read_bytes() != kept  # a new tokenizer
