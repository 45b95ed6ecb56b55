"""The plan search's out-of-sample check of repairs folds face data by person (h57).

On face data (``faces``, a folder of identity folders) the 2-fold check of an offered
repair (``stages/offer_holdout.py``) said "not checked out of sample (… its task
(verification:faces) scores all samples together)", and a fold by batch would have put a
person's chips (a photo's variants and distance slices: near-copies) in both halves, the
"out of sample" half holding near-copies of the fit half's chips. The repair feeds are now
folded by person with ``run``'s rule (``tasks.face_split``): no person in both folds, each
fold its own genuine and impostor pairs, and the note says "2 folds by person: 5 and 7
people"; too few people for two halves: said, not checked. ``quantscope repair --data
faces`` scored on the chips it fitted on; it now fits on one half of the people and scores
on the other (``stages.held_out``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_h40_tfjs_human import _nhwc_embedder
from test_h55_faces_held_out import _people

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.pipeline.data import open_run_data
from quantscope.plan.joint import Offer
from quantscope.plan.start import RepairOption
from quantscope.stages import held_out
from quantscope.stages.offer_holdout import Folding, check_offer, fold_feeds
from quantscope.targets import load_target
from quantscope.tasks.registry import open_task_data
from quantscope.types import Dataset, Sensitivity, batch_rows

OPTION = RepairOption("equalize", gain=0.01, cost=0.0, reason="measured")


def _model():
    return load_proto(_nhwc_embedder(0.0), "emb")


def _fit_half(tmp_path: Path) -> Dataset:
    """What ``run EMBEDDER --data faces`` searches its plan on: the fit half by person."""
    rd = open_run_data(_model(), "faces", eval_data=None, pairs=None, tokenizer=None,
                       folder=tmp_path)
    return rd.fit


def _check(data: Dataset, feeds: list) -> Offer:
    model = _model()
    stats = calibrate(model, find_groups(model), iter(data.calibration))
    offer = Offer((OPTION,), ({"name": "equalize", "gain": 0.01},), ())
    sens = Sensitivity.from_gains("decision_agreement", 0.99, {})
    return check_offer(offer, model, data, stats, sens, load_target("hailo8l"), feeds)


def _x(batches) -> np.ndarray:
    return np.concatenate([b["x"] for b in batches])


def test_the_folds_of_face_data_hold_no_person_in_both(tmp_path):
    fit = _fit_half(tmp_path)
    feeds = list(fit.calibration)
    folding = fold_feeds(fit, feeds)
    assert isinstance(folding, Folding), folding
    a, b = folding.tasks
    people_a, people_b = set(a.identity.tolist()), set(b.identity.tolist())
    assert people_a and people_b and not people_a & people_b
    assert people_a | people_b == set(fit.task.identity.tolist())
    assert folding.how == f"2 folds by person: {len(people_a)} and {len(people_b)} people"
    # each fold's batches are its people's chips, in data order
    every, ids = _x(feeds), fit.task.identity
    for batches, people in ((folding.a, people_a), (folding.b, people_b)):
        assert np.array_equal(_x(batches), every[np.isin(ids, list(people))])
    # each fold its own pairs: genuine within a person, impostor between its people only
    for t in (a, b):
        same = t.identity[t.pairs.first] == t.identity[t.pairs.second]
        assert np.array_equal(same, t.pairs.genuine) and (~same).any() and same.sum() >= 8
        assert t.pairs.first.max() < len(t.identity)
    # a fold by batch (what tensor data gets) would put a person in both halves here
    k = (len(feeds) + 1) // 2
    cut = sum(batch_rows(f) for f in feeds[:k])
    assert set(ids[:cut].tolist()) & set(ids[cut:].tolist())


def test_an_offer_on_face_data_is_checked_by_person_and_the_note_says_so(tmp_path):
    fit = _fit_half(tmp_path)
    out = _check(fit, list(fit.calibration))
    note = next(n for n in out.notes if n.startswith("repair equalize"))
    assert "not checked" not in note, note
    # run's fit half: 12 people, ``obama`` (27 chips, 3 photos) with 4 others, 63 chips
    # each side
    assert "out of sample" in note and "2 folds by person: 5 and 7 people" in note, note
    assert "no person in both" in note
    entry = {r["name"]: r for r in out.measured}["equalize"]["out_of_sample"]
    folded = entry["folded"]
    assert folded["by"] == "person"
    one, two = (set(h["people"]) for h in folded["halves"])
    assert (len(one), len(two)) == (5, 7) and not one & two
    assert entry["samples"] == [h["chips"] for h in folded["halves"]] == [63, 63]
    assert sum(entry["samples"]) == 126
    assert entry["metric"] == "decision_agreement" and len(entry["folds"]) == 2


def test_the_whole_builtin_set_folds_twelve_and_twelve_people():
    """``plan --data faces``: the search measures on all 243 chips; the repair feeds (8
    batches of 32 and one of 19: the first 8) fold by person."""
    data = open_task_data("faces", _model())
    folding = fold_feeds(data, list(data.calibration)[:8])
    assert isinstance(folding, Folding), folding
    assert folding.how == "2 folds by person: 12 and 12 people"


def test_too_few_people_to_fold_is_said_not_checked(tmp_path):
    people = _people(tmp_path / "people", (1, 17))  # 2 people: a half of one person
    data = open_task_data(str(people), _model())
    out = _check(data, list(data.calibration))
    assert out.options == (OPTION,)  # stands as measured, unchecked
    note = next(n for n in out.notes if n.startswith("repair equalize"))
    assert note.startswith("repair equalize: not checked out of sample (the plan search "
                           "measures on its calibration data; folded by person, a half would "
                           "hold 1 person and "), note
    assert "each half needs 2 people and 8 genuine pairs" in note
    assert "out_of_sample" not in {r["name"]: r for r in out.measured}["equalize"]


def test_repair_on_faces_fits_on_some_people_and_scores_on_the_others():
    data = open_task_data("faces", _model())
    feeds, scored, note = held_out(data, 8)
    every, ids = _x(data.evaluation), data.task.identity
    fed = _x(feeds)
    scored_people = set(scored.task.identity.tolist())
    fed_people = set(ids.tolist()) - scored_people
    assert len(scored_people) == len(fed_people) == 12
    assert np.array_equal(fed, every[np.isin(ids, list(fed_people))])
    assert np.array_equal(_x(scored.evaluation), every[np.isin(ids, list(scored_people))])
    assert len(scored.task.identity) == len(_x(scored.evaluation))
    assert note is not None and "split by person" in note and "12 people" in note, note
    assert "include the" not in note


def test_repair_on_too_few_people_still_says_it_scores_on_its_fit_chips(tmp_path):
    people = _people(tmp_path / "people", (1, 17))
    data = open_task_data(str(people), _model())
    feeds, scored, note = held_out(data, 8)
    assert scored is data
    assert note is not None and "the evaluation rows include the" in note, note
    assert "a half would hold 1 person" in note


def test_plans_console_says_the_folds_were_by_person() -> None:
    from quantscope.cli.plan import _offer_row

    row = {"name": "equalize", "gain": 0.0,
           "out_of_sample": {"metric": "decision_agreement", "folds": [0.001, -0.002],
                             "mean": -0.0005, "samples": [63, 63], "offered": False,
                             "folded": {"by": "person", "halves": []}, "clips": {}}}
    assert "out of sample" in _offer_row(row) and "(folds by person " in _offer_row(row)


def test_repair_with_fewer_batches_fits_on_some_of_one_half_of_the_people():
    data = open_task_data("faces", _model())
    feeds, scored, note = held_out(data, 2)
    ids = data.task.identity
    fed = _x(feeds)
    assert len(fed) == 64
    rows = [int(np.flatnonzero((_x(data.evaluation) == f).all(axis=(1, 2, 3)))[0]) for f in fed]
    assert not set(ids[rows].tolist()) & set(scored.task.identity.tolist())
    assert "fitted on 64 chips of" in note, note
