"""Shared pytest fixtures: the real data beside the checkout, and tiny params files."""

from __future__ import annotations

import importlib
import os
import random
from pathlib import Path

import pytest
from helpers.decode import copy_model, model_files, sources  # noqa: F401 (fixtures)
from helpers.evaluate import scored, stage_inputs  # noqa: F401 (fixtures: a tiny trained pipeline)
from helpers.train import corpus  # noqa: F401 (fixture: a tiny corpus through the stages)
from prefect_fixtures import prefect_server_fixture  # noqa: F401 (session Prefect server)

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

# Tests never phone home and never touch the user's DVC site cache.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture(scope="session", autouse=True)
def _dvc_site_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["DVC_SITE_CACHE_DIR"] = str(tmp_path_factory.mktemp("dvc-site-cache"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout (real Multi30k, newstest2013, wmt-sample)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (../shared/data beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def load_benchmark():
    """benchmarks/NAME.py as the module benchmarks.NAME (pytest puts the checkout on sys.path:
    pyproject.toml's `pythonpath`)."""
    return lambda name: importlib.import_module(f"benchmarks.{name}")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from threads, and on shared cores OpenMP waits cost seconds."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shuffle",
        type=int,
        metavar="SEED",
        help="run the test files, and the tests within each, in a random order drawn from SEED "
        "(no test may depend on another having run first)",
    )


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = config.getoption("shuffle")
    return None if seed is None else f"shuffled: --shuffle {seed} repeats this order"


@pytest.hookimpl(tryfirst=True)  # before pytest regroups tests by their parametrized fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test on the real Prefect server is slow by definition (a server, serve processes,
    `dvc exp run`): marked here, so `make test-fast` never starts one, whoever wrote the test.
    With --shuffle SEED: the files in a random order, and each file's tests."""
    for item in items:
        if "prefect_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    seed = config.getoption("shuffle")
    if seed is not None:
        rng, files = random.Random(seed), {}
        for item in items:
            files.setdefault(item.path, []).append(item)
        groups = list(files.values())
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)
        items[:] = [item for group in groups for item in group]
