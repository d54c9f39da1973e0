"""A real project whose registry holds a v1.0.0 champion of a continuing recipe, trained once
per test session (the real stages, a real Prefect server: ~80 s), and a copy of it per test.

`continuing_champion` (a conftest fixture) hands each test its own copy in its tmp_path, which
the test may change at will (grow the corpus, retrain, promote): the template is never touched.
The preset names the corpus by a path relative to the run workspace, so a copy of the project
trains on its own copy of the corpus with the very same params (the champion's recipe)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prefect_fixtures import DVC, sh

from flows.workspace import WORKSPACE
from helpers.checkout import checkout

PRESET = "tiny-continue"
FIRST_PAIRS = 300  # the champion's training pairs (of the 400 generated)


def preset(corpus: str) -> dict:
    """The demo at a few dozen steps, on local files that the test grows, continuing."""
    split = {s: [{"path": f"{corpus}/{s}.{{lang}}", "name": s}] for s in ("train", "valid", "test")}
    return {
        "download": {"source": "local", "splits": split},
        "tokenizer": {"vocab_size": 300},
        "model": {"d_model": 64, "d_ff": 256, "n_layers": 1},
        "train": {  # a short warmup: the continuation goes on at the champion's rate
            "max_steps": 60,  # a BLEU above 0 on the 20 test sentences: test_gate's noise test
            "warmup_steps": 10,
            "lr_scale": 0.2,
            "max_tokens": 1024,
            "save_every_steps": 5,
            "valid_every_steps": 30,  # (a validation costs more than 5 updates here)
            "threads": 1,
        },
        "average": {"last_k": 2},
        "decode": {"beam_size": 1},
        "evaluate": {"extra_splits": ["valid"]},  # the gate tests both sets (test_gate)
        "package": {"hf": False},  # no test here reads the HF export (transformers: ~8 s)
        "retrain": {
            "mode": "continue",
            "max_oov_rate": 0.4,  # this tiny vocabulary leaves ~1/4 of its own words to bytes
            # the default rate (the champion's own) for all 150 steps: at this size BLEU stays
            # low for dozens of steps, and patience would end the continuation there
            "continuation": {"max_steps": 150, "patience": 0},
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


def project_with_recipe(root: Path, n: int) -> tuple[Path, Path, Path]:
    """(the generated corpus, the local corpus of its first n train pairs, a checkout of the
    project with the continuing recipe committed as preset PRESET), all under root."""
    source, corpus = corpus_files(root), root / "corpus"
    write_corpus(source, corpus, n)
    project = checkout(root)
    # relative to the run workspace, where the download stage runs: the same in every copy
    relative = os.path.relpath(corpus, project / WORKSPACE)
    (project / "presets" / f"{PRESET}.yaml").write_text(yaml.safe_dump(preset(relative)))
    sh("git", "add", "-A", cwd=project)
    sh("git", "commit", "-qm", "a continuing recipe", cwd=project)
    return source, corpus, project


@dataclass(frozen=True)
class Champion:
    source: Path  # the 400 generated pairs (valid and test too)
    corpus: Path  # the recipe's local corpus: the first FIRST_PAIRS of them, for the test to grow
    project: Path  # the checkout: v1.0.0 promoted, its run workspace as the retrain left it
    v1: Path  # a copy of v1.0.0's package
    first: dict  # what the retrain that made v1.0.0 returned


@pytest.fixture(scope="session")
def continuing_template(
    prefect_server: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Champion]:
    """The first retrain of the continuing recipe (from scratch: no champion), once."""
    from flows.retrain import retrain

    root = tmp_path_factory.mktemp("continuing-champion")
    source, corpus, project = project_with_recipe(root, FIRST_PAIRS)
    first = retrain(preset=PRESET, project=str(project))
    shutil.copytree(project / WORKSPACE / "data/package", root / "v1")
    yield Champion(source, corpus, project, root / "v1", first)


@pytest.fixture
def continuing_champion(continuing_template: Champion, tmp_path: Path) -> Champion:
    """This test's own copy of the template (git, DVC cache and remote, run workspace, corpus)."""
    src = continuing_template.project.parent
    dest = Path(shutil.copytree(src, tmp_path / src.name, symlinks=True))
    project = dest / continuing_template.project.name
    # the run workspace is a git worktree: its links both ways name the template's paths (and
    # `git worktree repair` would follow them to the template and move its worktree here)
    link = project / WORKSPACE / ".git"
    (admin,) = (project / ".git" / "worktrees").iterdir()
    link.write_text(f"gitdir: {admin}\n")
    (admin / "gitdir").write_text(f"{link}\n")
    # what DVC left of the template's finished `dvc exp run` names the template's paths
    (project / WORKSPACE / ".dvc/tmp/repro.dat").unlink(missing_ok=True)
    shutil.rmtree(project / WORKSPACE / ".dvc/tmp/exps", ignore_errors=True)
    # the committed remote is the template's: this copy pushes to its own (config.local, which
    # git ignores and the run workspace takes over)
    sh(*DVC, "remote", "modify", "--local", "store", "url", str(dest / "remote"), cwd=project)
    return Champion(
        dest / "gen" / "raw", dest / "corpus", project, dest / "v1", continuing_template.first
    )
