"""params.yaml loading: typed sections, unknown keys and presets are errors that name the key."""

from pathlib import Path

import pytest
import yaml
from helpers.imports import imported_modules

from transformer import config
from transformer.core import presets, settings
from transformer.core.sections.model import ModelConfig
from transformer.core.sections.train import TrainConfig
from transformer.core.settings import ConfigError


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults_when_section_missing(tmp_path):
    p = write(tmp_path / "params.yaml", {"train": {"max_steps": 7}})
    assert settings.load(TrainConfig, "train", p).max_steps == 7
    assert settings.load(ModelConfig, "model", p) == ModelConfig()


def test_unknown_key_names_the_dotted_key(tmp_path):
    p = write(tmp_path / "params.yaml", {"train": {"max_stpes": 7}})
    with pytest.raises(ConfigError, match=r"train\.max_stpes"):
        settings.load(TrainConfig, "train", p)


def test_unknown_nested_key(tmp_path):
    p = write(tmp_path / "params.yaml", {"download": {"clean": {"max_wrods": 3}}})
    with pytest.raises(ConfigError, match=r"download\.clean\.max_wrods"):
        presets.load_all(p)


def test_unknown_section(tmp_path):
    p = write(tmp_path / "params.yaml", {"trian": {}})
    with pytest.raises(ConfigError, match="unknown section trian"):
        presets.load_all(p)


def test_wrong_type_names_key(tmp_path):
    p = write(tmp_path / "params.yaml", {"model": {"d_model": "big"}})
    with pytest.raises(ConfigError, match=r"model\.d_model must be int"):
        presets.load_all(p)


def test_int_accepted_for_float(tmp_path):
    p = write(tmp_path / "params.yaml", {"train": {"lr_scale": 2}})
    lr_scale = settings.load(TrainConfig, "train", p).lr_scale
    assert type(lr_scale) is float and lr_scale == 2.0  # an int 2 would equal 2.0 too


def test_the_catalogue_names_every_section_once():
    """settings.SECTIONS (the names every reader accepts) and presets.SECTIONS (their classes)."""
    assert tuple(presets.SECTIONS) == settings.SECTIONS


def test_impossible_model_config(tmp_path):
    p = write(tmp_path / "params.yaml", {"model": {"d_model": 100, "n_heads": 3}})
    with pytest.raises(ConfigError, match="divisible"):
        presets.load_all(p)


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        ("average", "last_k", 0, r"average\.last_k must be >= 1, got 0"),
        ("average", "by", "tim", r"average\.by must be one of steps, time, best, got 'tim'"),
        ("decode", "beam_size", 0, r"decode\.beam_size must be >= 1"),
        ("decode", "max_len_b", -100, r"decode\.max_len_b must be >= 0, got -100"),
        ("decode", "precision", "fp16", r"decode\.precision must be one of fp32, bf16, int8"),
        ("evaluate", "split", "tset", r"evaluate\.split must be one of train, valid, test"),
        ("download", "source", "lcoal", r"download\.source must be one of synthetic, local"),
        ("train", "keep_last", -3, r"train\.keep_last must be >= 0, got -3"),
        ("download", "timeout", 0, r"download\.timeout must be > 0 seconds, got 0"),
        (
            "decode",
            "length_penalty",
            float("inf"),
            r"decode\.length_penalty must be in \[0, 10\], got inf",
        ),
        ("retrain", "margin", -1.0, r"retrain\.margin must be a number >= 0, got -1\.0"),
        ("retrain", "margin", float("nan"), r"retrain\.margin must be a number >= 0, got nan"),
    ],
)
def test_out_of_range_values_name_the_file_and_key(tmp_path, section, key, value, message):
    p = write(tmp_path / "params.yaml", {section: {key: value}})
    with pytest.raises(ConfigError, match=rf"params\.yaml: {message}"):
        presets.load_all(p)


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("train:\n  max_steps: 5\n  lr_scale: [1\n")
    with pytest.raises(ConfigError, match=r"params\.yaml: not valid YAML: line 4, column 1"):
        presets.load_all(p)


def test_missing_params_file(tmp_path):
    with pytest.raises(ConfigError, match="no such params file"):
        presets.load_all(tmp_path / "nope.yaml")


@pytest.mark.parametrize("name", presets.presets())
def test_every_preset_validates(name, tmp_path):
    out = tmp_path / "params.yaml"
    presets.write_preset(name, out)
    sections = presets.load_all(out)
    assert set(sections) == set(presets.SECTIONS)


def test_unknown_preset_lists_available():
    with pytest.raises(ConfigError, match="available: .*demo"):
        presets.preset_params("wmt99-xx-yy")


def test_preset_cli_roundtrip(tmp_path):
    out = tmp_path / "p.yaml"
    config.main(["preset", "demo", "--out", str(out)])
    assert presets.load_all(out)["model"] == ModelConfig()
    with pytest.raises(SystemExit, match="no preset"):
        config.main(["preset", "nope", "--out", str(out)])


def test_repo_params_is_valid():
    presets.load_all(Path(__file__).resolve().parents[1] / "params.yaml")


def test_sweep_variants_are_valid_params(tmp_path, load_benchmark):
    """benchmarks/quality/multi30k_variants.yaml: every variant is a valid params.yaml; a typo
    is named."""
    root = Path(__file__).resolve().parents[1]
    sweep = load_benchmark("quality.multi30k_sweep")
    base = presets.preset_params("multi30k-en-de")
    variants = yaml.safe_load((root / "benchmarks/quality/multi30k_variants.yaml").read_text())
    assert len(variants) >= 40
    # rounds 1-4 modified the preset of their day: `<<: *old` keeps them running as they ran
    assert variants["h-A-d0.1"]["model.n_layers"] == 3
    assert variants["h-A-d0.1"]["decode.length_penalty"] == 0.6
    assert variants["h-L2"]["model.n_layers"] == 2
    for name, over in variants.items():
        params = presets.merge(base, sweep.overrides_to_tree(over))
        sections = presets.load_all(write(tmp_path / f"{name}.yaml", params))
        assert sections["train"].max_steps == over["train.max_steps"]
    typo = presets.merge(base, sweep.overrides_to_tree({"train.lr_scael": 1.0}))
    with pytest.raises(ConfigError, match="train.lr_scael"):
        presets.load_all(write(tmp_path / "typo.yaml", typo))


def test_every_stage_depends_on_the_modules_it_runs():
    """dvc.yaml's rule: a stage depends on exactly the project modules its entry module imports,
    transitively (settings and files included): one missing and an edit to, say, the loss would
    leave `dvc repro` reporting train as up to date; one too many reruns a stage for code it
    never runs. A package's __init__.py runs with its modules, so it is a dep too."""
    import re

    root = Path(__file__).resolve().parents[1]
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        # every module the command runs: the train stage's launcher, and what it launches
        modules = re.findall(r"-m (transformer\.\w+)", stage["cmd"])
        deps = [d for d in stage["deps"] if d.endswith(".py")]
        assert len(deps) == len(set(deps)), f"dvc.yaml: stage {name} lists a dep twice"
        want = set().union(*(imported_modules(root, m) for m in modules))
        assert not want - set(deps), f"dvc.yaml: stage {name} lacks deps {sorted(want - set(deps))}"
        assert not set(deps) - want, (
            f"dvc.yaml: stage {name} depends on modules it does not import: "
            f"{sorted(set(deps) - want)}"
        )


def test_an_empty_section_in_a_preset_means_the_defaults():
    defaults = {"evaluate": {"split": "test", "tokenized_bleu": True}, "train": {"seed": 1}}
    assert presets.merge(defaults, {"evaluate": None, "train": {"seed": 2}}) == {
        "evaluate": {"split": "test", "tokenized_bleu": True},
        "train": {"seed": 2},
    }
