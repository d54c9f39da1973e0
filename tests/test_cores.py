"""A machine's train stages take turns (flows/cores.py), on a real Prefect server: the limit
serve creates, a full limit that makes the next stage wait, and the slot of a crashed attempt
freed by its retry. The turns of two lines' runs on a work pool: tests/test_flows_lines.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect_fixtures import client

from flows import cores


def active(name: str) -> int:
    with client() as c:
        return c.read_global_concurrency_limit_by_name(name).active_slots


def test_serve_makes_the_limit_and_a_second_stage_waits_for_the_first(
    prefect_server: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cores.SLOTS_ENV, raising=False)  # install(N) sets it, as serve's runs read
    name = cores.limit_name()  # this test's own (conftest.py)
    assert cores.install() == (
        f"train stages: 1 at a time on this machine (Prefect concurrency limit {name})"
    )
    assert "2 at a time" in cores.install(2) and cores.slots() == 2  # --train-slots 2
    assert "1 at a time" in cores.install(1)
    first = cores.Turn(tmp_path / "en-de", name)
    first.take()
    try:
        assert first.lease is not None and active(name) == 1
        assert cores.read_lease(tmp_path / "en-de") == {"limit": name, "lease_id": first.lease}
        with client() as c:
            lease, wait_s = cores.acquire(c, name)  # another line's train stage: all taken
        assert lease is None and wait_s is not None and wait_s >= 0
    finally:
        first.give_back()
    assert active(name) == 0 and cores.read_lease(tmp_path / "en-de") is None
    with client() as c:
        lease, _ = cores.acquire(c, name)  # its turn now
        assert lease is not None
        c.release_concurrency_slots_with_lease(lease)


def test_the_retry_frees_the_slot_its_crashed_attempt_held(
    prefect_server: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cores.SLOTS_ENV, raising=False)
    name = cores.limit_name()
    cores.install(1)
    crashed = cores.Turn(tmp_path, name)
    crashed.take()
    crashed.done.set()  # its process died: no renewal, no give-back; its lease id stays
    assert active(name) == 1 and cores.read_lease(tmp_path)
    retry = cores.Turn(tmp_path, name)  # the next attempt, in the same workspace
    with client() as c:
        retry.free_dead(c)
    assert active(name) == 0 and cores.read_lease(tmp_path) is None
    retry.take()
    assert retry.lease is not None and active(name) == 1
    retry.give_back()
    assert active(name) == 0


def test_bad_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cores.SLOTS_ENV, "two")
    with pytest.raises(cores.SlotError, match="FLOWS_TRAIN_SLOTS='two'"):
        cores.slots()
    assert cores.slots(0) == 0
    monkeypatch.setenv(cores.LIMIT_ENV, "cores/a")
    with pytest.raises(cores.SlotError, match="FLOWS_TRAIN_LIMIT='cores/a'.* /"):
        cores.limit_name()
