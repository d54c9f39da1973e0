"""The soak's pure parts (benchmarks/faults/soak_faults.py, soak_train.py): the fault plan
draws every kind, and the updates a fault made the train stage redo are read from its run's log."""

import random

import pytest


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_plan_draws_every_kind_once_at_least_and_a_third_of_the_cycles(seed, load_benchmark):
    faults = load_benchmark("faults.soak_faults")
    schedule = faults.plan(30, faults.FAULTS, 1 / 3, random.Random(seed))
    drawn = [f for f in schedule if f is not None]
    assert set(drawn) == set(faults.FAULTS) and len(faults.FAULTS) == 9
    assert len(schedule) == 30 and len(drawn) == 10


def test_fewer_cycles_than_kinds_draw_each_kind_at_most_once(load_benchmark):
    faults = load_benchmark("faults.soak_faults")
    schedule = faults.plan(4, faults.FAULTS, 1.0, random.Random(1))
    assert None not in schedule and len(set(schedule)) == 4


def test_updates_redone_are_the_step_reached_minus_the_step_resumed_from(load_benchmark):
    redone = load_benchmark("faults.soak_train").redone
    lines = [
        (1.0, "resuming from data/checkpoints/step_00000005.pt (step 5)"),  # before the fault
        (3.0, "kill -9 ... exitcode: -9"),
        (4.0, "resuming from data/checkpoints/step_00000010.pt (step 10)"),
    ]
    got = redone(lines, {"at": 2.0, "reached": 13})
    assert got["redone"] == 3 and got["resumed_from"] == [10]
    assert redone(lines, {"at": 2.0, "reached": 10})["redone"] == 0  # a preemption's save
    assert redone(lines, {})["redone"] is None  # no fault hit the train stage: not known


def test_a_rewind_redoes_the_updates_from_its_checkpoint_to_the_divergence(load_benchmark):
    redone = load_benchmark("faults.soak_train").redone
    line = (
        "non-finite loss (nan) at step 12: rewound to data/checkpoints/step_00000005.pt (step 5), "
        "the batches of step(s) 6-12 skipped (and their checkpoints removed), the rate x0.5 for "
        "100 updates (rewind 1 of at most 3)"
    )
    got = redone([(1.0, line)], {})
    assert got["redone"] == 7 and got["rewinds"] == [(5, 12)]
