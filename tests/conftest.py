"""Shared pytest fixtures: the real data beside the checkout, and tiny params files."""

from __future__ import annotations

import importlib
import os
import random
import uuid
from pathlib import Path

# One OpenMP thread in the tests and every process they start, set before anything imports
# torch: their models are tiny, and `make test` runs two workers on two cores, where a second
# thread spins waiting for a core the other worker holds (the evaluate stage of the continuing
# recipe: 20.3 s of CPU with two threads beside another job, 4.1 s with one).
os.environ["OMP_NUM_THREADS"] = "1"

import pytest
from helpers.continuing import (  # noqa: F401 (fixtures: a real v1.0.0 champion, once)
    continuing_champion,
    continuing_template,
)
from helpers.decode import copy_model, model_files, sources  # noqa: F401 (fixtures)
from helpers.evaluate import scored, stage_inputs  # noqa: F401 (fixtures: a tiny trained pipeline)
from helpers.helper_model import de_en_helper  # noqa: F401 (fixture: another line's champion)
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


@pytest.fixture(autouse=True)
def _own_train_limit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test on the Prefect server trains under a machine train limit of its own
    (flows/cores.py): a run a test kills while it holds the slot keeps it for up to a minute
    (its lease), which must not hold up the next test's train stages."""
    if "prefect_server" in request.fixturenames:
        name = f"train-cores:test-{uuid.uuid4().hex[:12]}"
        request.getfixturevalue("prefect_server")["FLOWS_TRAIN_LIMIT"] = name  # its processes'
        monkeypatch.setenv("FLOWS_TRAIN_LIMIT", name)  # the flows it runs in-process


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data beside the checkout (real Multi30k, newstest2013, wmt-sample)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (../shared/data beside the checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def load_benchmark():
    """benchmarks/GROUP/NAME.py as the module benchmarks.GROUP.NAME, asked for as "GROUP.NAME"
    (pytest puts the checkout on sys.path: pyproject.toml's `pythonpath`)."""
    return lambda name: importlib.import_module(f"benchmarks.{name}")


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


# session fixtures that build something expensive: their tests share one xdist worker
BUILT_ONCE = ("continuing_template",)


def shared_build(item: pytest.Item) -> str | None:
    """The xdist group of a test that uses a module-scoped fixture (its module's) or a
    BUILT_ONCE fixture (that fixture's): with `-n 2 --dist loadgroup` (make test) such tests run
    on one worker, which builds the fixture once, as a plain run does."""
    info = getattr(item, "_fixtureinfo", None)
    fixtures = info.name2fixturedefs if info else {}  # every fixture it needs, transitively
    if once := [name for name in BUILT_ONCE if name in fixtures]:
        return once[0]
    if any(defs[-1].scope == "module" for defs in fixtures.values()):
        return item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest regroups tests by their parametrized fixtures
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test on the real Prefect server is slow by definition (a server, serve processes,
    `dvc exp run`): marked here, so `make test-fast` never starts one, whoever wrote the test.
    Each test's xdist group (shared_build); on xdist workers the slow tests go first (the
    longest work starts first, so neither worker is left alone with it at the end).
    With --shuffle SEED: the files in a random order, and each file's tests."""
    for item in items:
        if "prefect_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        if group := shared_build(item):
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput") and config.getoption("shuffle") is None:
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
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
