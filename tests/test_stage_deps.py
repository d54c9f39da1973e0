"""An edit to a module reruns exactly the stages that run it, as DVC itself sees it.

A copy of the project in a temporary git repository, its pipeline locked with `dvc commit` over
stand-in outputs (what `dvc status` compares against is dvc.lock, not what the stages wrote, so
nothing needs to train); then every module gets one more line, and for each module `dvc status`
must name it as a changed dependency of exactly the stages whose entry module imports it
(tests/helpers/imports.py reads the imports). One `dvc status` for all the edits: it lists each
stage's every changed dependency, which is what an edit of that module alone would make stale.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.imports import imported_modules

ROOT = Path(__file__).resolve().parents[1]


def sh(*cmd: str, cwd: Path) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def changed(repo: Path) -> dict[str, set[str]]:
    """{stage: the dependencies `dvc status` reports as changed} (DVC's API: the command's own
    code), for each stage it reports as changed."""
    from dvc.repo import Repo

    with Repo(str(repo)) as r:
        return {
            name.split(":")[-1]: {
                dep
                for entry in entries
                if isinstance(entry, dict)
                for dep in entry.get("changed deps", {})
            }
            for name, entries in r.status().items()
        }


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict[str, set[str]]]:
    """The locked copy, its stages, and the project files each stage's command runs (the
    modules after `-m`: the train stage's launcher and train), read once."""
    repo = tmp_path_factory.mktemp("stage-deps")
    ignore = shutil.ignore_patterns("__pycache__")
    for pkg in ("transformer", "flows"):
        shutil.copytree(ROOT / pkg, repo / pkg, ignore=ignore)
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, repo / name)
    (repo / ".gitignore").write_text("/data/\n")
    sh("git", "init", "-q", cwd=repo)
    sh(sys.executable, "-m", "dvc", "init", "-q", cwd=repo)
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    for stage in stages.values():  # stand-ins: a file where the path has a suffix, else a folder
        for out in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []):
            path = repo / (next(iter(out)) if isinstance(out, dict) else out)
            if path.suffix:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("{}\n")
            else:
                path.mkdir(parents=True, exist_ok=True)
                (path / "stand-in").write_text("x\n")
    for stage in stages.values():  # a dep inside another stage's output folder (a helper's
        for dep in stage.get("deps", []):  # package in data/helpers/ROLE): a stand-in too
            if not (repo / dep).exists():
                (repo / dep).mkdir(parents=True)
                (repo / dep / "stand-in").write_text("x\n")
    sh(sys.executable, "-m", "dvc", "commit", "--force", "-q", cwd=repo)
    sh("git", "add", "-A", cwd=repo)
    sh("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "locked", cwd=repo)
    assert changed(repo) == {}
    runs = {
        name: set().union(
            *(imported_modules(repo, m) for m in re.findall(r"-m (transformer\.\w+)", stage["cmd"]))
        )
        for name, stage in stages.items()
    }
    return repo, stages, runs


MODULES = sorted(
    str(p.relative_to(ROOT)) for p in [*ROOT.glob("transformer/**/*.py"), *ROOT.glob("flows/*.py")]
)


@pytest.fixture(scope="module")
def edited(locked) -> dict[str, set[str]]:
    """Every module edited (one more line): {stage: its changed dependencies}, as DVC sees it."""
    repo, _, _ = locked
    texts = {module: (repo / module).read_text() for module in MODULES}
    for module, text in texts.items():
        (repo / module).write_text(text + "# an edit\n")
    try:
        return changed(repo)
    finally:
        for module, text in texts.items():
            (repo / module).write_text(text)


@pytest.mark.parametrize("module", MODULES)
def test_an_edit_reruns_exactly_the_stages_that_import_the_module(locked, edited, module) -> None:
    _, _, runs = locked
    want = {name for name, files in runs.items() if module in files}
    assert {stage for stage, deps in edited.items() if module in deps} == want, module


def test_the_trainer_and_the_presets_are_no_deps_of_training(locked) -> None:
    """The edits issue 51 named: the BPE trainer and the presets."""
    _, stages, _ = locked
    deps = set(stages["train"]["deps"])
    for module in ("transformer/tokenizer.py", "transformer/config.py"):
        assert module not in deps
