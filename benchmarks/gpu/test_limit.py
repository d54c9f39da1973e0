"""A pytest plugin for the GPU check (`-p benchmarks.gpu.test_limit`): each test's setup and run
stopped after GPU_TEST_LIMIT_S seconds (SIGALRM), so that a hung or slow test fails by its own
name instead of eating the other tests' share of a short device lease."""

from __future__ import annotations

import os
import signal

import pytest


def _limited(item):
    limit = int(os.environ.get("GPU_TEST_LIMIT_S", "0"))

    def stop(signum, frame):
        raise TimeoutError(f"{item.nodeid} ran past its {limit} s (GPU_TEST_LIMIT_S)")

    old = signal.signal(signal.SIGALRM, stop) if limit else None
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        if limit:
            signal.signal(signal.SIGALRM, old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _limited(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _limited(item)
