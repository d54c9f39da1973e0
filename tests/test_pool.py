"""benchmarks/quality/pool.py: several sittings of a share benchmark pooled into one decision."""

import json

import pytest

from benchmarks.quality.pool import main, pool

SEED1 = {"a": 30.40, "bt-beam": 34.08, "ab": 38.19}  # the 30-minute sitting's figures


def test_the_share_is_taken_on_the_means_and_each_sitting_is_shown():
    out = pool([SEED1, {"a": 31.0, "bt-beam": 35.0, "ab": 39.0}], "a", "bt-beam", "ab", 0.5)
    assert out["mean"] == pytest.approx({"a": 30.7, "bt-beam": 34.54, "ab": 38.6}, abs=0.011)
    assert out["shares"] == [0.472, 0.5]
    assert out["share"] == pytest.approx((34.54 - 30.7) / (38.6 - 30.7), abs=1e-3)
    assert out["edge"] == 0.71  # 1 / sqrt(2) by default


@pytest.mark.parametrize(
    ("mid", "verdict"), [(35.0, "met"), (34.3, "at the edge"), (33.2, "not met")]
)
def test_the_verdict_needs_the_mean_beyond_the_edge(mid, verdict):
    out = pool([{"a": 30.0, "bt": mid, "ab": 38.0}], "a", "bt", "ab", 0.5, edge=0.7)
    assert out["line"] == 34.0
    assert out["verdict"] == verdict


def test_a_sitting_without_a_gap_shows_no_share_of_its_own():
    out = pool([SEED1, {"a": 31.0, "bt-beam": 31.5, "ab": 31.0}], "a", "bt-beam", "ab", 0.5)
    assert out["shares"] == [0.472, None]
    assert out["line"] == pytest.approx(32.65, abs=0.01) and out["verdict"] == "at the edge"


def test_a_missing_run_or_no_gap_is_an_error_naming_it(tmp_path, capsys):
    with pytest.raises(ValueError, match="sitting 2 has no run ab"):
        pool([SEED1, {"a": 1.0, "bt-beam": 2.0}], "a", "bt-beam", "ab", 0.5)
    with pytest.raises(ValueError, match="ab is not above a"):
        pool([{"a": 30.0, "bt-beam": 31.0, "ab": 29.0}], "a", "bt-beam", "ab", 0.5)
    bad = tmp_path / "results.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="results.json: not a results file"):
        main([str(bad), "--low", "a", "--mid", "b", "--high", "c", "--target", "0.5"])


def test_the_cli_reads_results_files(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": {k: {"bleu": v} for k, v in SEED1.items()}}))
    main([str(path), "--low", "a", "--mid", "bt-beam", "--high", "ab", "--target", "0.5"])
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "at the edge" and out["sittings"] == 1


def test_a_run_counted_twice_is_refused_unless_allowed():
    copied = {"a": 31.0, "bt-beam": SEED1["bt-beam"], "ab": 39.0}  # bt-beam copied from seed 1
    with pytest.raises(
        ValueError, match=r"run bt-beam has the same BLEU \(34.08\) in sittings 1 and 2"
    ):
        pool([SEED1, copied], "a", "bt-beam", "ab", 0.5)
    assert pool([SEED1, copied], "a", "bt-beam", "ab", 0.5, allow_repeats=True)["sittings"] == 2
