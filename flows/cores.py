"""The machine's cores, taken in turns: a train stage runs only while it holds a slot of its
machine's Prefect global concurrency limit, so that lines started together queue for the cores
while their other stages (download, tokenizer, evaluate, the gate) overlap.

Why: a train stage starts a thread per core, and two of them on one machine thrash. Two shipped
lines started together on an idle 2-core Xeon made 1,900 to 2,300 tokens/s each where one alone
makes about 17,600: at once was about 4.5x slower in total than one after the other (issue 80).

The limit is `train-cores:HOSTNAME` (FLOWS_TRAIN_LIMIT names another, e.g. one that containers on
one machine share) with FLOWS_TRAIN_SLOTS slots (default 1; 0 turns the turns off). `python -m
flows.serve` creates it at start (`--train-slots N` sets its size); on a work pool's machine the
first train stage creates it. After that it is Prefect's: `prefect gcl ls`, `prefect gcl update
NAME --limit N`. A stage that waits says so: its task run is AwaitingConcurrencySlot with a
message naming the limit, the run's log says it, and `python -m flows.run --wait` prints it. A
train stage that DVC finds up to date does not wait: it is skipped at once.

The slot is held with a lease the holder renews: a process that dies frees it within LEASE_S,
and the next attempt of its run frees it at once (the workspace keeps the lease's id). A server
that restarts forgets its leases (they live in memory unless PREFECT_SERVER_CONCURRENCY_LEASE_
STORAGE says otherwise): the holder then gives the slot back by the limit's name when it ends,
as Prefect's server does for a deployment's slot. A server that cannot be reached: the stage
trains without a slot, saying so (a slower run, not a failed one).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

from flows.lineage import TRAIN
from flows.shell import Stopped, dvc, logger, stopping

SLOTS_ENV, LIMIT_ENV = "FLOWS_TRAIN_SLOTS", "FLOWS_TRAIN_LIMIT"
LEASE_S = 60.0  # the server's shortest lease: a dead holder's slot is free again this soon
RENEW_S = LEASE_S / 4  # a renewal that fails is tried again three times before the lease ends
POLL_S = 5.0  # the longest wait between two tries of a full limit (the server suggests one)
UNREACHABLE_S = 120.0  # a server that answers no request for this long: train without a turn
LEASE_FILE = Path(".dvc/tmp/flows-train-slot.json")  # in the run workspace: the held lease


class SlotError(ValueError):
    """A bad FLOWS_TRAIN_SLOTS or FLOWS_TRAIN_LIMIT; the message names the variable."""


def slots(given: int | None = None) -> int:
    """Train stages at once on this machine: `given`, else FLOWS_TRAIN_SLOTS, else 1."""
    text = str(given) if given is not None else os.environ.get(SLOTS_ENV, "1")
    if not text.strip().isdigit():
        raise SlotError(f"{SLOTS_ENV}={text!r}: expected a whole number >= 0 (0: no limit)")
    return int(text)


def limit_name() -> str:
    """This machine's limit: FLOWS_TRAIN_LIMIT, else train-cores:HOSTNAME."""
    name = os.environ.get(LIMIT_ENV) or f"train-cores:{socket.gethostname()}"
    if bad := set(name) & set("/%&><"):  # what Prefect refuses in a name
        raise SlotError(f"{LIMIT_ENV}={name!r}: a limit's name cannot hold {''.join(sorted(bad))}")
    return name


def create(client, name: str, size: int, resize: bool = False) -> None:
    """Limit `name` with `size` slots, unless it exists (`resize`: then set its size)."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists

    if resize:
        client.upsert_global_concurrency_limit_by_name(name, size)
        return
    with contextlib.suppress(ObjectAlreadyExists):  # another line created it first
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=size))


def install(given: int | None = None) -> str | None:
    """serve.py's start: this machine's limit created (`given`: sized so, also for the runs it
    starts, which inherit the variable); a line saying so, None with no limit."""
    from prefect.client.orchestration import get_client

    size, name = slots(given), limit_name()
    if given is not None:
        os.environ[SLOTS_ENV] = str(size)
    if size == 0:
        return None
    with get_client(sync_client=True) as client:
        create(client, name, size, resize=given is not None)
        size = client.read_global_concurrency_limit_by_name(name).limit
    return f"train stages: {size} at a time on this machine (Prefect concurrency limit {name})"


@contextlib.contextmanager
def slot(ws: Path, stage: str) -> Iterator[None]:
    """The train stage's turn on the machine's cores, held while the block runs (other stages,
    and FLOWS_TRAIN_SLOTS 0: no turn taken)."""
    if stage != TRAIN or slots() == 0:
        yield
        return
    turn = Turn(ws, limit_name())
    turn.take()
    try:
        yield
    finally:
        turn.give_back()


class Turn:
    """One train stage's hold on the limit `name`: taken, renewed from a thread, given back."""

    def __init__(self, ws: Path, name: str):
        self.ws, self.name, self.lease, self.lost = ws, name, None, False
        self.since = time.monotonic()
        self.done = threading.Event()

    def take(self) -> None:
        """Wait for a slot (saying so), unless the stage is up to date; with a server that does
        not answer for UNREACHABLE_S, go on without one."""
        from prefect.client.orchestration import get_client

        try:
            with get_client(sync_client=True) as client:
                self.lease = self.wait(client)
        except Stopped:
            raise
        except Exception as e:  # noqa: BLE001 (unreachable, or an answer of no use: go on)
            logger().warning("no turn on the cores (%s: %s): training without one", self.name, e)
            return
        if self.lease is not None:
            self.since = time.monotonic()
            write_lease(self.ws, {"limit": self.name, "lease_id": str(self.lease)})
            # in this context: the settings (PREFECT_API_URL) may be a context's, not the env's
            renew = contextvars.copy_context().run
            threading.Thread(
                target=renew, args=(self.renew,), name="train-slot", daemon=True
            ).start()

    def wait(self, client):
        """The lease of a slot, once one is free; None where no limit applies (none exists, or
        it is inactive) or the stage is up to date. The server's errors are tried again for
        UNREACHABLE_S (a restart), then raised."""
        waited_since = failing_since = None
        while True:
            try:
                if failing_since is not None or waited_since is None:
                    self.free_dead(client)
                    create(client, self.name, slots())
                lease, retry_after = acquire(client, self.name)
                failing_since = None
            except Exception as e:
                failing_since = failing_since or time.monotonic()
                if not unanswered(e) or time.monotonic() - failing_since > UNREACHABLE_S:
                    raise
                logger().warning("the Prefect server did not answer (%s); trying again", e)
                lease, retry_after = None, POLL_S
            else:
                if lease is not None or retry_after is None:
                    if waited_since is not None:
                        said = f"waited {time.monotonic() - waited_since:.0f} s for the cores"
                        logger().info("stage %s: %s (%s)", TRAIN, said, self.name)
                        set_task_state("Running", f"{said}; training")
                    return lease
                if waited_since is None:
                    if up_to_date(self.ws):
                        logger().info("stage %s: up to date, not waiting for the cores", TRAIN)
                        return None
                    waited_since = time.monotonic()
                    self.say_waiting(client)
            if stopping(min(retry_after, POLL_S)):
                raise Stopped(f"stage {TRAIN}: not started, the flow run is ending")

    def say_waiting(self, client) -> None:
        size = "?"
        with contextlib.suppress(Exception):
            size = client.read_global_concurrency_limit_by_name(self.name).limit
        said = (
            f"waiting for the cores: the {size} slot(s) of this machine's limit {self.name} "
            "are held by other train stages (another line's, or a pipeline run's); this one "
            "starts when one ends"
        )
        logger().info("stage %s: %s", TRAIN, said)
        set_task_state("AwaitingConcurrencySlot", said)

    def renew(self) -> None:
        """Renew the lease until given back; a lease the server forgot (410) is not renewed."""
        import httpx
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            while not self.done.wait(RENEW_S):
                try:
                    client.renew_concurrency_lease(lease_id=self.lease, lease_duration=LEASE_S)
                except httpx.HTTPStatusError as e:
                    if e.response.status_code == 410:
                        self.lost = True  # a restarted server's: still counted, not leased
                        logger().warning("the server forgot the train slot's lease: %s", e)
                        return
                    logger().warning("could not renew the train slot's lease: %s", e)
                except Exception as e:  # noqa: BLE001 (a blip: the next renewal may pass)
                    logger().warning("could not renew the train slot's lease: %s", e)

    def give_back(self) -> None:
        self.done.set()
        if self.lease is None:
            return
        try:
            release(self.name, self.lease, self.lost, time.monotonic() - self.since)
        except Exception as e:  # noqa: BLE001 (the lease then ends on its own, in LEASE_S)
            logger().warning("could not give back the train slot (%s): %s", self.name, e)
        (self.ws / LEASE_FILE).unlink(missing_ok=True)

    def free_dead(self, client) -> None:
        """The slot of an earlier attempt of this workspace's run, whose process died holding
        it (the workspace lock says no live process holds it now)."""
        held = read_lease(self.ws)
        if held:
            logger().info("giving back the train slot a crashed attempt held (%s)", held["limit"])
            client.release_concurrency_slots_with_lease(held["lease_id"])
            (self.ws / LEASE_FILE).unlink(missing_ok=True)


def acquire(client, name: str) -> tuple[Any, float | None]:
    """(lease id, None) with a slot of `name`; (None, seconds to wait) where all are held;
    (None, None) where no active limit of that name exists."""
    import httpx

    try:
        r = client.increment_concurrency_slots_with_lease(
            names=[name], slots=1, mode="concurrency", lease_duration=LEASE_S
        )
    except httpx.HTTPStatusError as e:
        if e.response.status_code != 423:
            raise
        return None, float(e.response.headers.get("Retry-After", POLL_S))
    body = r.json()
    return (body["lease_id"], None) if body.get("limits") else (None, None)


def unanswered(error: Exception) -> bool:
    """Whether `error` says the server did not answer (down, restarting), not that it refused."""
    import httpx

    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code >= 500
    return isinstance(error, httpx.TransportError | OSError)


def release(name: str, lease, lost: bool, held_s: float) -> None:
    """Give the slot back: by its lease, or by the limit's name where the server lost it."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        if lost:
            client.release_concurrency_slots(names=[name], slots=1, occupancy_seconds=held_s)
        else:
            client.release_concurrency_slots_with_lease(lease)


def up_to_date(ws: Path) -> bool:
    """Whether DVC finds the train stage up to date (`dvc repro` would skip it)."""
    try:
        return json.loads(dvc("status", "--json", TRAIN, cwd=ws, what="dvc status")[-1]) == {}
    except Exception:  # noqa: BLE001 (not known: then it waits, as a stage that will run)
        return False


def set_task_state(name: str, message: str) -> None:
    """The train task run's state, named `name` (AwaitingConcurrencySlot, a Scheduled state, or
    Running), with `message`: what the UI and `flows.run --wait` show. Best effort."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import task_run
    from prefect.states import AwaitingConcurrencySlot, Running

    if not task_run.get_id():
        return
    state = AwaitingConcurrencySlot if name == "AwaitingConcurrencySlot" else Running
    with contextlib.suppress(Exception), get_client(sync_client=True) as client:
        client.set_task_run_state(UUID(task_run.get_id()), state(message=message), force=True)


def read_lease(ws: Path) -> dict[str, str] | None:
    try:
        return json.loads((ws / LEASE_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_lease(ws: Path, lease: dict[str, str]) -> None:
    path = ws / LEASE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(lease))
