"""The repair offers' out-of-sample check counts people, gives shares noise, and is keyed (h66).

h61's check weighed a worst channel by its jackknife noise, but on face data a unit was a
photo (a face's chips together): a person's photos are near-copies of each other, so the
noise was too small and an offer was withdrawn on noise. The units are now the people the
folds are split by. A share (decision agreement, top-1 agreement) had no noise at all and
was judged by the sign of its mean: it is now the task's own figure recomputed with each
unit left out (people on face data, samples elsewhere), and withdrawn only when worse by
more than that noise. A ``run`` folder whose plan stage an older check made plans again.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from test_h40_tfjs_human import _nhwc_embedder
from test_h61_offer_noise import _fit_half

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.plan.joint import Offer
from quantscope.plan.start import RepairOption
from quantscope.stages.offer_holdout import _Fold, check_offer, figure, stands
from quantscope.targets import load_target
from quantscope.tasks.db_noise import LeftOut, Parts, left_out_interval, pooled_db
from quantscope.tasks.face_split import take_chips
from quantscope.tasks.left_out import left_out_figures, units_of
from quantscope.tasks.verification import VerificationTask
from quantscope.types import Outputs, Sensitivity


def _measured(parts: dict[str, Parts]) -> dict:
    return {"metrics": {k: pooled_db(p) for k, p in parts.items()}, "sample_parts": parts}


def _fold(shifts: list[float], *, people: bool) -> tuple[_Fold, dict]:
    """A held half of len(shifts) people, 3 near-duplicate photos each (2 chips a photo):
    the repair moves every chip of person i by ``shifts[i]`` dB in the worst channel's
    powers, and the pooled SQNR up by 0.46 dB everywhere."""
    per = 3 * 2
    person = np.repeat(np.arange(len(shifts)), per)
    face = np.repeat(np.arange(len(shifts) * 3), 2)
    task = VerificationTask("v", None, 1.1, faces=face, identity=person if people else None)
    s, before = np.ones(len(person)), np.full(len(person), 0.01)
    after = before * 10 ** (-np.asarray(shifts)[person] / 10)
    base = _measured({"sqnr_db_channel_min": Parts(s, before, "samples"),
                      "sqnr_db": Parts(s, before, "samples")})
    repaired = _measured({"sqnr_db_channel_min": Parts(s, after, "samples"),
                          "sqnr_db": Parts(s, before * 0.9, "samples")})
    return _Fold((), SimpleNamespace(task=task), None, None, base, ()), repaired


def _judged(*, people: bool) -> tuple[object, tuple[bool, str]]:
    a = _fold([-3.0, 1.0, -2.5, 0.8], people=people)
    b = _fold([0.9, -3.2, 0.7, -2.0], people=people)
    own = figure("sqnr_db_channel_min", [a[0], b[0]], [a[1], b[1]], 1.0)
    pooled = figure("sqnr_db", [a[0], b[0]], [a[1], b[1]], 1.0)
    assert own is not None and pooled is not None and pooled.mean > 0
    return own, stands(own, pooled)


def test_near_duplicate_photos_of_a_person_count_once_and_the_decision_follows_people():
    """The worst channel loses 1.3 dB, all of it from two people of four in each half:
    over their 12 photos (near-copies) the noise is 0.6 dB and the offer would go; over
    the 4 people it is 1.5 dB and the offer stays, the reason saying the people."""
    by_person, kept = _judged(people=True)
    assert by_person.noise["unit"] == "people" and by_person.noise["n"] == [4, 4]
    assert by_person.mean < 0 < by_person.upper and kept == (True, "")
    by_photo, dropped = _judged(people=False)  # the task knows only the photos
    assert by_photo.noise["unit"] == "faces" and by_photo.noise["n"] == [12, 12]
    assert by_photo.upper < 0 and by_photo.noise["half_width"] < by_person.noise["half_width"] / 2
    assert dropped == (False, "its sqnr_db_channel_min is worse out of sample beyond its noise "
                              "(-1.3 dB ± 0.6 dB over 12 + 12 faces)")


def test_a_real_fold_counts_the_people_it_was_split_by(tmp_path):
    """``run EMBEDDER --data faces``'s fit half: 5 and 7 people (7 + 7 photos)."""
    from test_h61_offer_noise import _check

    _, oos = _check(tmp_path, "bias")
    assert oos["noise"]["unit"] == oos["pooled"]["noise"]["unit"] == "people"
    assert sorted(oos["noise"]["n"]) == [5, 7]


def _share(folds: tuple[float, float], lefts: tuple[np.ndarray, np.ndarray]) -> object:
    """A share figure of two folds, each fold's repaired value ``folds[i]`` below an
    unrepaired 0.99, with the repaired value per unit left out ``lefts[i]``."""
    made, afters = [], []
    for gain, left in zip(folds, lefts, strict=True):
        n = len(left)
        base = {"metrics": {"decision_agreement": 0.99},
                "left_out": {"decision_agreement": LeftOut(0.99, np.full(n, 0.99), "people")}}
        after = {"metrics": {"decision_agreement": 0.99 + gain},
                 "left_out": {"decision_agreement": LeftOut(0.99 + gain, left, "people")}}
        made.append(_Fold((), SimpleNamespace(task=None), None, None, base, ()))
        afters.append(after)
    return figure("decision_agreement", made, afters, 1.0)


def test_a_share_is_withdrawn_only_when_worse_beyond_its_noise():
    """A share lost in one person (its left-out values all but one alike) is within its
    noise and stays; the same loss in every person is beyond it and goes."""
    one = np.array([0.99, 0.975, 0.975, 0.975, 0.975, 0.975])  # all of it in person 0
    near = _share((-0.015, -0.015), (one, one))
    assert near.noise["unit"] == "people" and near.upper > 0
    assert stands(near, None) == (True, "")
    even = np.array([0.975, 0.976, 0.974, 0.975, 0.976, 0.974])
    far = _share((-0.015, -0.015), (even, even))
    keep, why = stands(far, None)
    assert not keep and far.upper < 0
    assert why.startswith("its decision_agreement is worse out of sample beyond its noise "
                          "(-1.5 pts ± 0.2 pts over 6 + 6 people)"), why
    # no noise estimate (too few units): the mean decides, and the reason says so
    few = _share((-0.015, -0.015), (one[:2], one[:2]))
    keep, why = stands(few, None)
    assert not keep and "no noise estimate: under 3 people in a half" in why, why


def test_a_share_offer_on_faces_is_judged_by_its_noise_over_people(tmp_path):
    """``ranges`` on the tiny embedder by decision agreement: -0.7 pts in one fold, 0 in the
    other (mean -0.4 pts): withdrawn by the sign of its mean before; its noise over the
    held people (0.8 pts over 7 + 5 people) now keeps it, said in the note and the JSON."""
    data, model = _fit_half(tmp_path)
    stats = calibrate(model, find_groups(model), iter(data.calibration))
    option = RepairOption("ranges", gain=0.01, cost=0.0, reason="measured")
    offer = Offer((option,), ({"name": "ranges", "gain": 0.01},), ())
    sens = Sensitivity.from_gains("decision_agreement", 0.99, {})
    out = check_offer(offer, model, data, stats, sens, load_target("hailo8l"),
                      list(data.calibration))
    oos = out.measured[0]["out_of_sample"]
    assert oos["metric"] == "decision_agreement" and oos["mean"] < 0
    assert oos["noise"]["unit"] == "people" and sorted(oos["noise"]["n"]) == [5, 7]
    assert oos["noise"]["upper"] > 0 and oos["offered"] is True
    assert [o.name for o in out.options] == ["ranges"]
    note = next(n for n in out.notes if n.startswith("repair ranges"))
    assert "jackknife over 7 + 5 people" in note and "judged against its noise" in note, note


def test_a_share_left_out_by_person_is_the_tasks_own_figure_on_the_other_people(tmp_path):
    data, _ = _fit_half(tmp_path)
    task = data.task
    ids = np.asarray(task.identity)
    rng = np.random.default_rng(0)
    centers = {p: rng.normal(size=16) for p in np.unique(ids)}
    ref = np.stack([centers[p] + 0.3 * rng.normal(size=16) for p in ids]).astype(np.float32)
    test = (ref + 0.4 * rng.normal(size=ref.shape)).astype(np.float32)

    def outs(e: np.ndarray) -> Outputs:
        return Outputs(("emb",), tuple((e[i:i + 16],) for i in range(0, len(e), 16)))

    got = left_out_figures(task, outs(ref), outs(test), ["decision_agreement", "nothing"])
    assert set(got) == {"decision_agreement"}
    share = got["decision_agreement"]
    people = np.unique(ids)
    assert share.unit == "people" and len(share.left) == len(people) == 12
    assert share.whole == task.metrics(outs(ref), outs(test)).values["decision_agreement"]
    keep = np.flatnonzero(ids != people[3])
    alone = take_chips(task, keep).metrics(outs(ref[keep]), outs(test[keep])).values
    assert share.left[3] == alone["decision_agreement"]
    same = left_out_figures(task, outs(ref), outs(ref), ["decision_agreement"])
    iv = left_out_interval(share, same["decision_agreement"])
    assert iv is not None and iv["unit"] == "people" and iv["n"] == 12
    assert units_of(task, len(ids))[1] == "people"
    assert units_of(SimpleNamespace(row_local=True), 5)[1] == "samples"


def test_a_run_folder_planned_under_the_old_check_plans_again(tmp_path, capsys, monkeypatch):
    """A folder whose plan stage was keyed without the check's version (made before it):
    the rerun plans again, a second rerun skips every stage."""
    from quantscope.pipeline import STAGES

    model = tmp_path / "emb.onnx"
    onnx.save(_nhwc_embedder(0.0), model)
    out = tmp_path / "W"
    args = ["run", str(model), "--data", "faces", "--target", "hailo8l", "--out", str(out),
            "--repairs", "bias", "--rewrites", "none"]
    old = STAGES["plan"]
    monkeypatch.setitem(STAGES, "plan", replace(old, rules=None))  # the key before h66
    assert main(args) == 0
    capsys.readouterr()
    monkeypatch.setitem(STAGES, "plan", old)
    assert main(args) == 0
    text = capsys.readouterr().out
    # the plan again (the stages after it run where its file changed: here it did not)
    assert "stages run: plan" in text and "skipped (done): calibrate, analyze" in text, text
    assert main(args) == 0
    assert "stages run: none" in capsys.readouterr().out


def test_the_check_is_in_the_plan_key_only_where_repairs_are_offered():
    from quantscope.pipeline.steps import plan_rules
    from quantscope.stages.offer_holdout import CHECK_KEY

    def opts(repairs: tuple[str, ...]) -> SimpleNamespace:
        return SimpleNamespace(opts=SimpleNamespace(repairs=repairs, data="x.npz",
                                                    eval_data=None))

    assert plan_rules(opts(("bias",))) == {"offer_check": CHECK_KEY}
    assert plan_rules(opts(())) == {}


def test_plans_console_says_a_shares_noise_and_its_units() -> None:
    from quantscope.cli.plan import _offer_row

    row = {"name": "ranges", "gain": 0.01, "out_of_sample": {
        "metric": "decision_agreement", "folds": [0.0, -0.007264], "mean": -0.003632,
        "noise": {"half_width": 0.008435, "upper": 0.004803, "n": [7, 5], "unit": "people"},
        "offered": True, "judged_by": "decision_agreement", "folded": {"by": "person"}}}
    assert _offer_row(row) == ("out of sample -0.36 pts (folds by person +0.00 pts, -0.73 pts; "
                               "noise 0.84 pts over 7 + 5 people)")


def test_a_share_of_other_data_is_left_out_by_sample():
    """A class output's top-1 agreement (a row-local task): each sample left out in turn,
    the task's own figure over the others."""
    from quantscope.tasks.classes import ClassTask

    rng = np.random.default_rng(1)
    ref = rng.normal(size=(10, 4)).astype(np.float32)
    test = ref.copy()
    test[[2, 7]] = test[[2, 7]][:, ::-1]  # two samples' scores reversed: their top-1 moves
    task = ClassTask("classes", "scores")

    def outs(a: np.ndarray) -> Outputs:
        return Outputs(("scores",), ((a[:6],), (a[6:],)))

    got = left_out_figures(task, outs(ref), outs(test), ["top1_agreement"])["top1_agreement"]
    assert got.unit == "samples" and len(got.left) == 10 and got.whole == 0.8
    assert got.left[2] == got.left[7] == 8 / 9 and got.left[0] == 7 / 9


def test_a_verifications_per_face_powers_are_summed_per_person():
    """``embedding_sqnr_db``'s parts come per face (photo) from the task; the check sums
    them per person (the faces in the task's sorted order), the pooled figure the same."""
    from quantscope.tasks.left_out import unit_parts as _units  # since h69: one place

    faces = np.array([4, 4, 1, 1, 2, 2, 0, 0, 3, 3])  # 5 photos, 2 chips each
    people = np.array([7, 7, 5, 5, 7, 7, 5, 5, 9, 9])  # photo 0, 1 -> 5; 2, 4 -> 7; 3 -> 9
    task = VerificationTask("v", None, 1.1, faces=faces, identity=people)
    rng = np.random.default_rng(2)
    per_face = Parts(rng.uniform(1, 2, 5), rng.uniform(0.01, 0.1, 5), "faces")
    got = _units(per_face, task)
    assert got.unit == "people" and got.signal.shape == (3, 1)
    assert np.allclose(got.signal[:, 0], [per_face.signal[[0, 1]].sum(),
                                          per_face.signal[[2, 4]].sum(), per_face.signal[3]])
    assert pooled_db(got) == pytest.approx(pooled_db(per_face))
