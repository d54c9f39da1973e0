"""flows/helpers.py: a run pins each champion its line uses at the version it has when the run
starts (real git, DVC and GTO tags); a line with none yet is trained without it, unless the
use is required; the pins that moved since a champion are named."""

from __future__ import annotations

from pathlib import Path

import gto.api
import pytest
from prefect_fixtures import DVC, git_init, sh

from flows import helpers, lines

DVC_YAML = """stages: {}
artifacts:
  en-de:
    path: data/package
    type: model
    meta: {recipe: {preset: demo}, uses: {backward: {line: de-en}}}
  de-en:
    path: data/package
    type: model
    meta: {recipe: {preset: demo-de-en}, uses: {backward: {line: en-de, required: true}}}
"""


def test_a_run_pins_the_used_champion_now_or_trains_without_it(tmp_path: Path) -> None:
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    git_init(tmp_path)
    sh(*DVC, "init", "-q", cwd=tmp_path)
    sh("git", "add", "-A", cwd=tmp_path)
    sh("git", "commit", "-qm", "two lines", cwd=tmp_path)
    en_de, de_en = lines.get(tmp_path, "en-de"), lines.get(tmp_path, "de-en")

    first = helpers.pins(tmp_path, en_de)  # de-en has no champion yet: trained without it
    assert first.overrides == ("helpers.backward=de-en",)
    assert first.text() == "backward de-en: no champion yet, trained without it"
    with pytest.raises(helpers.HelperError) as e:  # required: an error before any run
        helpers.pins(tmp_path, de_en)
    assert str(e.value).startswith(f"{tmp_path / 'dvc.yaml'}: artifacts.de-en.meta.uses.backward")
    assert "en-de has no champion yet" in str(e.value)
    assert "python -m flows.run retrain/en-de --wait" in str(e.value)

    commit = sh("git", "rev-parse", "HEAD", cwd=tmp_path).strip()
    gto.api.register(str(tmp_path), "de-en", commit, version="v1.0.0")
    gto.api.assign(str(tmp_path), "de-en", "prod", version="v1.0.0")
    now = helpers.pins(tmp_path, en_de)  # the next run: de-en's champion, at its version
    assert now.overrides == ("helpers.backward=de-en@v1.0.0",)
    assert now.text() == "backward de-en@v1.0.0"
    before, after = {"helpers": {"backward": "de-en"}}, {"helpers": {"backward": "de-en@v1.0.0"}}
    assert helpers.changed(before, after) == ["backward de-en -> de-en@v1.0.0"]
    assert helpers.changed(after, after) == []


def test_a_student_whose_teacher_has_no_champion_is_an_error_naming_the_teacher(
    tmp_path: Path,
) -> None:
    """issue 82: a teacher is always required (a student has no data without it)."""
    (tmp_path / "dvc.yaml").write_text(
        """stages: {}
artifacts:
  en-de:
    path: data/package
    type: model
    meta: {recipe: {preset: demo}}
  en-de-student:
    path: data/package
    type: model
    meta: {recipe: {preset: demo-student}, uses: {teacher: {line: en-de}}}
"""
    )
    git_init(tmp_path)
    sh(*DVC, "init", "-q", cwd=tmp_path)
    sh("git", "add", "-A", cwd=tmp_path)
    sh("git", "commit", "-qm", "a teacher and its student", cwd=tmp_path)
    student = lines.get(tmp_path, "en-de-student")
    assert student.uses == (lines.Use("teacher", "en-de", True),)
    with pytest.raises(helpers.HelperError) as e:
        helpers.pins(tmp_path, student)
    said = str(e.value)
    assert said.startswith(f"{tmp_path / 'dvc.yaml'}: artifacts.en-de-student.meta.uses.teacher")
    assert "the teacher line en-de has no champion yet" in said
    assert "en-de-student is its student and has no data without it" in said
    commit = sh("git", "rev-parse", "HEAD", cwd=tmp_path).strip()
    gto.api.register(str(tmp_path), "en-de", commit, version="v1.0.0")
    gto.api.assign(str(tmp_path), "en-de", "prod", version="v1.0.0")
    assert helpers.pins(tmp_path, student).overrides == ("helpers.teacher=en-de@v1.0.0",)
