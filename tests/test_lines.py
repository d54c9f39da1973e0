"""flows/lines.py: the lines dvc.yaml declares, each checked before anything runs; a bad one
names dvc.yaml, the line and the key (serve refuses to start on it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prefect_fixtures import git_init, sh

from flows import lines, recipe

ROOT = Path(__file__).resolve().parents[1]
HEAD = "stages: {}\nartifacts:\n"


def declare(tmp_path: Path, body: str) -> Path:
    (tmp_path / "dvc.yaml").write_text(HEAD + body)
    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    return tmp_path


def committed(tmp_path: Path, body: str) -> Path:
    """declare(), with this checkout's presets, committed in a new git repository."""
    tmp_path.mkdir(exist_ok=True)
    declare(tmp_path, body)
    (tmp_path / "presets").mkdir()
    for name in ("demo", "demo-de-en"):
        (tmp_path / f"presets/{name}.yaml").write_text((ROOT / f"presets/{name}.yaml").read_text())
    git_init(tmp_path)
    sh("git", "add", "-A", cwd=tmp_path)
    sh("git", "commit", "-qm", "lines", cwd=tmp_path)
    return tmp_path


TWO = (
    "  en-de:\n    path: data/package\n    meta:\n"
    "      recipe: {preset: demo, overrides: [train.max_steps=20]}\n"
    "      retrain: {margin: 0.5}\n"
    "  de-en:\n    path: data/package\n    meta: {recipe: {preset: demo-de-en}}\n"
)


def test_a_line_reads_its_recipe_schedule_and_gate(tmp_path: Path) -> None:
    declare(
        tmp_path,
        "  en-de:\n    path: data/package\n    type: model\n    meta:\n"
        "      recipe: {preset: demo, overrides: [train.max_steps=20]}\n"
        "      schedule: {cron: '0 4 * * *', timezone: Europe/Berlin}\n"
        "      retrain: {margin: 0.5, mode: continue, continuation: {max_steps: 9}}\n"
        "  fr:\n    path: data/package\n    meta: {recipe: {preset: demo}, schedule: null}\n",
    )
    a, b = lines.read(tmp_path)
    assert (a.name, a.preset, a.cron, a.timezone) == ("en-de", "demo", "0 4 * * *", "Europe/Berlin")
    assert a.overrides == (
        "train.max_steps=20",
        "retrain.margin=0.5",
        "retrain.mode=continue",
        "retrain.continuation.max_steps=9",
    )
    assert (b.name, b.overrides, b.cron, b.declared) == ("fr", (), None, True)
    assert lines.get(tmp_path, "fr") == b
    with pytest.raises(lines.LineError, match="declares 2 lines \\(en-de, fr\\): name one"):
        lines.get(tmp_path, None)


def test_an_artifact_without_meta_is_todays_single_line(tmp_path: Path) -> None:
    declare(tmp_path, "  transformer:\n    path: data/package\n    type: model\n")
    (only,) = lines.read(tmp_path)
    assert (only.name, only.preset, only.overrides, only.declared) == (
        "transformer",
        None,
        (),
        False,
    )
    assert lines.get(tmp_path, None) == only


BAD = {
    "twice": (
        "  en-de:\n    path: data/package\n  en-de:\n    path: data/package\n",
        "line 5: 'en-de' is declared twice (first on line 3)",
    ),
    "gto name": ("  en.de:\n    path: data/package\n", "artifacts.en.de: not a name GTO can tag"),
    "preset": (
        "  a1:\n    path: p\n    meta: {recipe: {preset: demo-xx}}\n",
        "artifacts.a1.meta.recipe.preset: no preset 'demo-xx'",
    ),
    "meta key": (
        "  a1:\n    path: p\n    meta: {recipes: {}}\n",
        "artifacts.a1.meta.recipes: unknown key",
    ),
    "override key": (
        "  a1:\n    path: p\n    meta: {recipe: {preset: demo, overrides: [train.max_stepz=3]}}\n",
        "artifacts.a1.meta.recipe.overrides: override 'train.max_stepz=3': unknown key",
    ),
    "config check": (
        "  a1:\n    path: p\n    meta: {recipe: {preset: demo, overrides: [train.max_steps=-3]}}\n",
        (
            "artifacts.a1.meta.recipe.overrides: refused by the config check: "
            "the recipe: train.max_steps must be >= 0, got -3"
        ),
    ),
    "gate": (
        "  a1:\n    path: p\n    meta: {retrain: {mode: sideways}}\n",
        (
            "artifacts.a1.meta.retrain: refused by the config check: the recipe: retrain.mode "
            "must be one of scratch, continue, got 'sideways'"
        ),
    ),
    "schedule": (
        "  a1:\n    path: p\n    meta: {schedule: {cron: '0 3 *'}}\n",
        "artifacts.a1.meta.schedule: Value error, Invalid cron string",
    ),
    # issue 81: the champions a line uses
    "uses itself": (
        "  en-de:\n    path: p\n    meta: {recipe: {preset: demo}, uses: {backward: {line: en-de}}}\n",
        "artifacts.en-de.meta.uses.backward.line: en-de uses itself",
    ),
    "wrong direction": (
        (
            "  en-de:\n    path: p\n    meta: {recipe: {preset: demo}, uses: {backward: {line: big}}}\n"
            "  big:\n    path: p\n    meta: {recipe: {preset: wmt14-en-de-base}}\n"
        ),
        (
            "artifacts.en-de.meta.uses.backward.line: big translates en -> de; a backward model "
            "of en-de (en -> de) must translate de -> en"
        ),
    ),
    "another pair": (
        (
            "  en-de:\n    path: p\n    meta: {recipe: {preset: demo}, uses: {forward: {line: fr}}}\n"
            "  fr:\n    path: p\n    meta: {recipe: {preset: multi30k-en-fr}}\n"
        ),
        "artifacts.en-de.meta.uses.forward.line: fr translates en -> fr; a forward model",
    ),
    "unknown line": (
        "  a1:\n    path: p\n    meta: {uses: {backward: {line: nope}}}\n",
        "artifacts.a1.meta.uses.backward.line: no line 'nope' (declared: a1)",
    ),
    "unknown role": (
        "  a1:\n    path: p\n    meta: {uses: {mentor: {line: a1}}}\n",
        "artifacts.a1.meta.uses.mentor: unknown key (known: backward, forward, teacher)",
    ),
    # issue 82: a student's teacher translates the same way, and is never optional
    "teacher of the other direction": (
        (
            "  st:\n    path: p\n    meta: {recipe: {preset: demo-student}, "
            "uses: {teacher: {line: de-en}}}\n"
            "  de-en:\n    path: p\n    meta: {recipe: {preset: demo-de-en}}\n"
        ),
        (
            "artifacts.st.meta.uses.teacher.line: de-en translates de -> en; a teacher model of "
            "st (en -> de) must translate en -> de"
        ),
    ),
    "optional teacher": (
        (
            "  st:\n    path: p\n    meta: {recipe: {preset: demo-student}, "
            "uses: {teacher: {line: en-de, required: false}}}\n"
            "  en-de:\n    path: p\n    meta: {recipe: {preset: demo}}\n"
        ),
        "artifacts.st.meta.uses.teacher.required: a teacher is always required",
    ),
    "its own teacher": (
        "  st:\n    path: p\n    meta: {recipe: {preset: demo-student}, uses: {teacher: {line: st}}}\n",
        "artifacts.st.meta.uses.teacher.line: st uses itself",
    ),
    "use key": (
        "  a1:\n    path: p\n    meta: {uses: {backward: {line: a1, required: maybe}}}\n",
        "artifacts.a1.meta.uses.backward.required: true or false, got 'maybe'",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_declaration_names_the_line_and_the_key(tmp_path: Path, case: str) -> None:
    body, said = BAD[case]
    declare(tmp_path, body)
    with pytest.raises(lines.LineError) as e:
        lines.read(tmp_path)
    assert str(e.value).startswith(str(tmp_path / "dvc.yaml")) and said in str(e.value), e.value


def test_serve_refuses_a_bad_declaration_before_anything_runs(tmp_path: Path) -> None:
    """No server is started or asked: the declaration is checked first (exit status 2)."""
    declare(tmp_path, "  a1:\n    path: p\n    meta: {recipe: {preset: nope}}\n")
    r = subprocess.run(
        [sys.executable, "-m", "flows.serve", "--local-only"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent), "HOME": "/tmp"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "artifacts.a1.meta.recipe.preset: no preset 'nope'" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / ".dvc").exists()


def test_the_project_declares_two_lines_on_the_offline_corpus() -> None:
    arts = yaml.safe_load((ROOT / "dvc.yaml").read_text())["artifacts"]
    assert {n: a["meta"]["recipe"]["preset"] for n, a in arts.items()} == {
        "en-de": "demo",
        "de-en": "demo-de-en",
    }
    assert {a["path"] for a in arts.values()} == {"data/package"}
    # out of the box they use each other: each scores its corpus with the other's champion
    assert {n: a["meta"]["uses"] for n, a in arts.items()} == {
        "en-de": {"backward": {"line": "de-en", "required": False}},
        "de-en": {"backward": {"line": "en-de", "required": False}},
    }
    if not (ROOT / "presets/demo-de-en.yaml").exists():
        pytest.skip("presets/demo-de-en.yaml lands with the German->English demo corpus")
    assert [x.name for x in lines.read(ROOT)] == ["en-de", "de-en"]


def test_a_retrain_of_a_line_runs_its_recipe_unless_told_otherwise() -> None:
    from flows.recipe import LINE_RECIPE, recipe

    de_en = lines.get(ROOT, "de-en")
    assert de_en.preset == "demo-de-en"
    extra = ["train.max_steps=5"]
    # the default: what the deployment retrain/de-en passes, with the caller's overrides last
    assert recipe(de_en, LINE_RECIPE, extra) == ("demo-de-en", [*de_en.overrides, *extra])
    assert recipe(de_en, "demo", extra) == ("demo", extra)  # a preset named replaces the recipe
    assert recipe(de_en, None, []) == (None, [])  # params.yaml as committed
    single = lines.Line(name="model", path="data/package", declared=False)
    assert recipe(single, LINE_RECIPE, extra) == ("demo", extra)  # a project without lines


def test_a_line_is_resolved_as_the_commit_that_runs_declares_it(tmp_path: Path) -> None:
    """Its recipe and gate come from the commit (dvc.yaml, params.yaml, presets/), never from the
    working tree; a run's overrides come after the line's, its gate kept."""
    project = committed(tmp_path, TWO)
    preset = project / "presets/demo.yaml"
    preset.write_text(preset.read_text() + "retrain: {alpha: 0.01}\n")  # the commit's preset
    sh("git", "commit", "-qam", "a stricter demo", cwd=project)
    head = sh("git", "rev-parse", "HEAD", cwd=project).strip()
    (project / "dvc.yaml").write_text(HEAD + TWO.replace("margin: 0.5", "margin: 9"))
    preset.write_text("train: {max_steps: 1}\n")  # neither is committed: no run sees them

    found = recipe.resolve(project, "en-de", overrides=["train.max_steps=5"])
    assert found.commit == head and found.preset == "demo"
    assert found.overrides == ("train.max_steps=20", "retrain.margin=0.5", "train.max_steps=5")
    assert (found.rules.margin, found.rules.alpha) == (0.5, 0.01)
    assert lines.get(project, "en-de").retrain == {"margin": 9}  # the working tree's, unused
    other = recipe.resolve(project, "en-de", preset="demo-de-en", overrides=["train.seed=2"])
    assert (other.preset, other.overrides, other.rules) == (
        "demo-de-en",
        ("train.seed=2",),
        found.rules,
    )
    assert recipe.resolve(project, "de-en").rules.margin == 0.0  # each line its own gate
    with pytest.raises(lines.LineError, match=f"dvc.yaml at {head[:9]}: no line 'fr'"):
        recipe.resolve(project, "fr")


def test_a_line_without_meta_is_gated_by_params_yaml_as_committed(tmp_path: Path) -> None:
    project = committed(tmp_path, "  transformer:\n    path: data/package\n")
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["retrain"]["margin"] = 2.5
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    sh("git", "commit", "-qam", "margin 2.5", cwd=project)
    params["retrain"]["margin"] = -1  # uncommitted, and invalid: never read
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    found = recipe.resolve(project)
    assert (found.line.name, found.preset, found.rules.margin) == ("transformer", "demo", 2.5)
    sh("git", "commit", "-qam", "an invalid margin", cwd=project)
    with pytest.raises(lines.LineError, match="params.yaml at .*retrain.margin must be a number"):
        recipe.resolve(project)


def test_a_run_belongs_to_the_line_whose_recipe_it_ran(tmp_path: Path) -> None:
    project = committed(tmp_path, TWO)

    def belongs(preset: str | None, *overrides: str) -> list[str]:
        return [x.name for x in recipe.belongs(project, "HEAD", preset, overrides)]

    assert belongs("demo", "train.max_steps=20") == ["en-de"]
    assert belongs("demo", "train.max_steps=20", "train.seed=3") == ["en-de"]  # its own after
    assert belongs("demo", "train.max_steps=20", "retrain.margin=0") == ["en-de"]  # gate aside
    assert belongs("demo-de-en") == belongs("demo-de-en", "model.d_model=64") == ["de-en"]
    assert belongs("demo") == belongs("demo", "train.max_steps=30") == []  # not en-de's
    assert belongs("wmt14-en-de-base") == belongs(None) == []
    twins = committed(tmp_path / "twins", TWO.replace("demo-de-en", "demo"))
    assert [x.name for x in recipe.belongs(twins, "HEAD", "demo", ["train.seed=3"])] == ["de-en"]
    assert len(recipe.belongs(twins, "HEAD", "demo", ["train.max_steps=20"])) == 1  # the longer
    (twins / "dvc.yaml").write_text(
        HEAD
        + TWO.replace("demo-de-en", "demo").replace(
            "meta: {recipe: {preset: demo}}",
            "meta: {recipe: {preset: demo, overrides: [train.max_steps=20]}}",
        )
    )
    sh("git", "commit", "-qam", "twins", cwd=twins)
    assert len(recipe.belongs(twins, "HEAD", "demo", ["train.max_steps=20"])) == 2  # alike


def test_serve_refuses_the_retrain_flags_on_a_project_of_lines(tmp_path: Path, capsys) -> None:
    """--retrain-preset and --retrain-override would be ignored there: an error naming the lines
    and meta.recipe, before anything runs; a project without lines takes them."""
    from flows.serve import recipe_args

    serve = "python -m flows.serve"
    for flags in (["--retrain-preset", "demo"], ["--retrain-override", "train.max_steps=9"]):
        with pytest.raises(SystemExit) as e:
            recipe_args([*flags, "--local-only"], serve, "", declare(tmp_path, TWO))
        said = capsys.readouterr().err
        assert e.value.code == 2 and "declares the lines en-de, de-en" in said, said
        assert "meta.recipe" in said
    with pytest.raises(SystemExit) as e:  # the schedule too: each line's is its meta.cron
        recipe_args(["--cron", "0 3 * * *", "--local-only"], serve, "", declare(tmp_path, TWO))
    said = capsys.readouterr().err
    assert e.value.code == 2 and "declares the lines en-de, de-en" in said and "meta.cron" in said
    assert recipe_args(["--local-only"], serve, "", tmp_path).cron  # the default, on lines too
    declare(tmp_path, "  transformer:\n    path: data/package\n")
    args = recipe_args(
        ["--retrain-preset", "wmt14-en-de-base", "--local-only"], serve, "", tmp_path
    )
    assert args.retrain_preset == "wmt14-en-de-base"
    assert recipe_args(["--cron", "0 3 * * *", "--local-only"], serve, "", tmp_path).cron == (
        "0 3 * * *"
    )
    assert recipe_args(["--local-only"], serve, "", tmp_path).retrain_preset == "demo"
