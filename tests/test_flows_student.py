"""A distilled student line end to end (issue 82), on the real stages, a real Prefect server, real
DVC and GTO: its teacher is the shared continuing champion (helpers/continuing.py, the line
`transformer`, trained in this test session); the student's run translates the teacher's train
sources (distill), trains on them, races the teacher (race) and is gated on both rules. One
trained student, decided three times as its line's declaration changes the rules: refused for
speed, refused for the gap (each naming its rule), then promoted; its card, lineage and
`make results --wide` name the teacher's version."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers.continuing import Champion
from helpers.lines import TINY_MODEL, declare

from flows import results
from flows.workspace import LINES

# a student worse than its teacher by construction: the shipped demo-student preset on the demo
# corpus at the toy's size (helpers/lines.py), 5 updates against the teacher's 60 and a thinner
# decoder; the teacher's beam 1 translations of the 300 train sources in three chunks, one race
# round (the continuing champion's recipe is not a shipped preset: a line's recipe must be)
STUDENT = [
    *TINY_MODEL,
    "model.d_ff_decoder=32",
    "train.max_steps=5",
    "train.save_every_steps=5",
    "train.valid_every_steps=5",
    "average.last_k=1",
    "package.hf=false",
    "distill.beam_size=1",
    "distill.chunk_lines=100",
    "distill.rounds=1",
]


def lines_with(rules: dict) -> str:
    """dvc.yaml's artifacts: the champion's line `transformer` as the teacher of line
    `student`, whose gate has `rules` (meta.retrain)."""
    student = {
        "recipe": {"preset": "demo-student", "overrides": STUDENT},
        "schedule": None,
        "uses": {"teacher": {"line": "transformer"}},
        "retrain": rules,
    }
    return yaml.safe_dump(
        {
            "artifacts": {
                "transformer": {"path": "data/package", "type": "model"},
                "student": {"path": "data/package", "type": "model", "meta": student},
            }
        },
        sort_keys=False,
    )


@pytest.mark.slow
def test_a_student_is_promoted_only_when_its_gap_and_speedup_clear_the_rules(
    prefect_server: dict, continuing_champion: Champion
) -> None:
    from flows.promote import promote
    from flows.retrain import retrain

    project = continuing_champion.project
    teacher_bleu = continuing_champion.first["candidate"]["bleu"]
    assert teacher_bleu > 0  # the gap below needs a teacher that translates something

    declare(project, lines_with({"max_gap": 100.0, "min_speedup": 1000.0}))
    out = retrain(line="student", project=str(project))
    assert not out["promoted"], out["reason"]
    s = out["gate"]["student"]
    assert s["failed"] == ["speed"], s
    assert "student of transformer@v1.0.0 refused: speed:" in out["reason"]
    assert "below min_speedup 1000.0" in out["reason"] and "gap:" not in out["reason"]
    assert s["teacher_bleu"] == pytest.approx(teacher_bleu, abs=0.01)
    assert s["speedup"] == pytest.approx(
        s["sentences_per_second"] / s["teacher_sentences_per_second"], rel=0.01
    )

    ws = project / LINES / "student" / "data"
    distilled = json.loads((ws / "metrics/distill.json").read_text())
    corpus = (ws / "corpus/train.en").read_text().splitlines()
    kept = (ws / "distill/distilled.en").read_text().splitlines()
    assert kept and set(kept) <= set(corpus), distilled  # the train sources, translated
    assert (ws / "distill/distilled.de").read_text() != (ws / "corpus/train.de").read_text()
    raced = json.loads((ws / "metrics/race.json").read_text())
    assert (raced["teacher"]["line"], raced["teacher"]["version"]) == ("transformer", "v1.0.0")
    assert raced["sentences"] == 20 and raced["threads"] == 1
    student_bleu = raced["student"]["bleu"]

    # the same candidate, gated again under the rules the line declares now (its HEAD)
    exp = out["candidate"]["experiment_commit"]
    declare(project, lines_with({"max_gap": 0.0, "min_speedup": 0.001}))
    gap = promote(exp, str(project), line="student")
    assert not gap["promoted"] and gap["gate"]["student"]["failed"] == ["gap"], gap["reason"]
    assert "more than max_gap 0.0" in gap["reason"] and "speed:" not in gap["reason"]
    assert gap["gate"]["student"]["gap"] > 0 and student_bleu < teacher_bleu

    declare(project, lines_with({"max_gap": 100.0, "min_speedup": 0.001}))
    won = promote(exp, str(project), line="student")
    assert won["promoted"] and won["version"] == "v1.0.0", won["reason"]
    assert won["reason"].startswith("student of transformer@v1.0.0: BLEU gap")
    assert won["gate"]["student"]["failed"] == []

    # what the champion says of its teacher: the card, the lineage, the results table
    card = (ws / "package/README.md").read_text(encoding="utf-8")
    assert "line `transformer` version `v1.0.0`" in card and "## Distilled from its teacher" in card
    lineage = json.loads((ws / "package/lineage.json").read_text())
    assert lineage["race"]["teacher"]["version"] == "v1.0.0"
    table = results.table(results.rows(project, "student"), wide=True)
    assert "below transformer@v1.0.0" in table, table
