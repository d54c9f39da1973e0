"""Writing to the Prefect API where a failure must not end the run: artifacts and progress bars.

A flow run's artifacts (the lineage table, the training curves, a decision, the train stage's
progress bar) report what the run did; none is what it does. A Prefect server restarting, a
database locked under load or an artifact deleted in the UI makes the call raise: written()
logs that as a warning and the stage or flow goes on. Every such call in flows/ goes through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import httpx
from prefect.exceptions import PrefectException

from flows.shell import logger

T = TypeVar("T")
# what a Prefect client call raises when the server did not answer or answered with an error
# (PrefectHTTPStatusError is an httpx.HTTPStatusError; ObjectNotFound a PrefectException)
API_ERRORS = (httpx.HTTPError, OSError, PrefectException)


def written(write: Callable[..., T], *args, log=None, **kwargs) -> T | None:
    """`write(*args, **kwargs)` (a Prefect artifact call); None, with a warning naming the call
    and the artifact's key, when the Prefect API failed. `log`: the logger to warn on (default:
    the run's, which a thread of the run's doesn't see by itself)."""
    try:
        return write(*args, **kwargs)
    except API_ERRORS as e:
        key = f" {kwargs['key']!r}" if "key" in kwargs else ""
        (log or logger()).warning(
            "%s%s: not written, the run goes on (Prefect API: %s: %s)",
            write.__name__,
            key,
            type(e).__name__,
            str(e).splitlines()[0] if str(e) else "no message",
        )
        return None
