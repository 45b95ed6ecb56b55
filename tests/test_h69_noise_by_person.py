"""The planner's no-goal choice and ``run``'s held-out check count people on face data (h69).

h66 made the repair offers' check leave out one PERSON at a time on face data; the planner's
choice by a face verification's embedding SQNR (h58) and ``run``'s held-out check (h52)
still left out one face (photo) at a time: a person's photos are near-copies, so their
noise was too small. On four people of four near-duplicate photos each, a +2.8 dB gain at
7.02x was "beyond" its noise over 16 faces (±0.95 dB) and bought; over 4 people it is
±2.9 dB, within, and uniform a8_w8 is kept. A plan 0.45 dB worse than a8_w8 held out on
six people was "beyond" ±0.31 dB over 24 faces (ship uniform a8_w8); over 6 people ±1.1 dB,
within. Every dB figure's per-sample powers are now summed per unit of the data where they
are measured (:func:`quantscope.analyze.measure.figure_parts`,
:func:`quantscope.tasks.left_out.unit_parts`); other tasks' units are unchanged."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from held_out_helpers import check_held_out, measured
from test_h52_held_out_more_db import _faces_task
from test_h58_planner_picture_noise import _data, _near_identity, _search

from quantscope.analyze.evalcache import EvalCache
from quantscope.analyze.measure import figure_parts
from quantscope.emulate.evaluate import compare_model
from quantscope.pipeline.held_out import headline_parts
from quantscope.stages.plan_measure import _cached_parts
from quantscope.tasks.db_noise import Parts, db_noise, pooled_db, unit_powers
from quantscope.tasks.left_out import UNITS_KEY
from quantscope.types import Dataset, Outputs

METRIC = "embedding_sqnr_db"


def _people_task(people: int, photos: int, chips: int):
    """A verification of ``people`` people, ``photos`` faces (photos) each of ``chips``
    chips: faces and identity as the built-in ``faces`` gives them."""
    return replace(_faces_task(people * photos, chips),
                   identity=np.repeat(np.arange(people), photos * chips))


def _near_copies(people: int, photos: int, chips: int, seed: int) -> np.ndarray:
    """Each person one input of their own size; their photos' chips near-copies of it."""
    r = np.random.default_rng(seed)
    size = np.repeat(np.exp(r.normal(0, 1.0, people)), photos * chips)[:, None]
    base = np.repeat(r.normal(0, 1, (people, 16)), photos * chips, axis=0)
    return ((base + r.normal(0, 0.02, base.shape)) * size).astype(np.float32)


def test_the_planners_choice_counts_people_and_buys_no_gain_within_their_noise():
    """Four people, four near-duplicate photos of two chips each: +2.8 dB at 7.02x is
    within its noise over 4 people (±2.9 dB), uniform a8_w8 is chosen; before, over 16
    faces (±0.95 dB) the gain was beyond it and 7.02x was bought."""
    task = _people_task(4, 4, 2)
    r = _search(_near_identity((16,), 0.005), _data(task, _near_copies(4, 4, 2, seed=1)),
                METRIC)
    c = r.to_dict()["choice"]
    assert r.cost == pytest.approx(1.0), c
    assert c["best"]["cost"] > 7.0 and c["noise"] is not None, c
    assert 0.0 < c["best"]["measured"] - r.measured < c["noise"]["half_width"], c
    assert "over 4 people" in c["noise"]["words"], c["noise"]
    assert "within noise of the best measured" in c["line"], c["line"]


def _embeddings(people: int, per: int, worse: float, seed: int, dim: int = 32):
    """FP32's embeddings of ``people`` people of ``per`` near-copy chips each, a8_w8's
    (an error each person's chips share) and the plan's (larger by a factor drawn per
    person: a person's photos err alike)."""
    rng = np.random.default_rng(seed)
    n = people * per
    ref = np.repeat(rng.normal(0, 1, (people, dim)), per, axis=0) + rng.normal(0, 0.02, (n, dim))
    scale = np.repeat(np.exp(rng.normal(0, 0.5, people)), per)[:, None]
    shared = np.repeat(rng.normal(0, 0.02, (people, dim)), per, axis=0)
    err = (shared + rng.normal(0, 0.002, (n, dim))) * scale
    grow = np.repeat(rng.normal(worse, abs(worse) * 2, people), per)[:, None]
    return [a.astype(np.float32) for a in (ref, ref + err, ref + err * (1 + grow))]


def test_the_held_out_check_counts_people_and_gives_no_advice_within_their_noise():
    """Six people, four photos of two chips each: the plan is 0.45 dB worse than a8_w8
    held out, within ±1.1 dB over 6 people (no advice); before, beyond ±0.31 dB over 24
    faces: "ship uniform a8_w8 or add data" on noise."""
    ref, uni, plan = _embeddings(6, 8, 0.05, seed=1)
    task = _people_task(6, 4, 2)
    results = measured({"emb": ref}, {"a8_w8": {"emb": uni}, "plan": {"emb": plan}}, METRIC,
                       task)
    parts = headline_parts(results, METRIC)
    assert {p.unit for p in parts.values()} == {"people"}
    assert {p.signal.shape for p in parts.values()} == {(6, 1)}
    rec = check_held_out(results, METRIC)
    assert rec is not None and rec["noise_from"] == "jackknife", rec
    assert rec["worse_by"] > 0.4 and not rec["beyond_noise"], rec
    assert "over 6 people" in rec["noise"] and "ship uniform" not in rec["line"], rec
    # one face (photo) out at a time: the noise of the near-copies' shared error, narrower
    faces = np.asarray(task.faces)
    per_face = db_noise(unit_powers(ref, plan, faces, "faces"),
                        unit_powers(ref, uni, faces, "faces"))
    assert per_face is not None and per_face[0] < rec["worse_by"] < rec["margin"], per_face


def _figure_parts(task: object, ref: np.ndarray, test: np.ndarray) -> dict[str, Parts]:
    fp32 = Outputs(("emb",), ((ref,),))

    class Runs:
        names = ("emb",)
        batches = iter([((test,), {})])

    fid, got = compare_model(Runs(), fp32, per_sample=True)
    return figure_parts(Dataset("d", (), (), task=task), fid, fp32, got)  # type: ignore[arg-type]


def test_every_db_figures_powers_on_face_data_are_per_person_and_pool_to_the_same():
    """The output fidelity's powers (per chip) and the verification's (per face) are
    summed per person, pooling to the same figures; without the people (a verification
    that knows only its faces) per face, as before."""
    ref, uni, _ = _embeddings(5, 6, 0.0, seed=3)
    task = _people_task(5, 3, 2)
    got = _figure_parts(task, ref, uni)
    assert {got[k].unit for k in ("sqnr_db", METRIC)} == {"people"}, got
    assert {got[k].signal.shape[0] for k in ("sqnr_db", METRIC)} == {5}
    alone = _figure_parts(replace(task, identity=None), ref, uni)
    assert alone[METRIC].unit == "faces" and alone[METRIC].signal.shape[0] == 15
    assert alone["sqnr_db"].unit == "faces"
    for k in ("sqnr_db", METRIC):
        assert pooled_db(got[k]) == pytest.approx(pooled_db(alone[k]), abs=1e-9)


def test_other_tasks_keep_one_unit_per_sample():
    """Data without faces: every sample its own unit, the powers as measured."""
    ref, uni, _ = _embeddings(4, 3, 0.0, seed=4)
    got = _figure_parts(None, ref, uni)
    assert got["sqnr_db"].unit == "samples" and got["sqnr_db"].signal.shape[0] == 12


def test_a_cached_per_face_entry_is_read_back_per_person(tmp_path):
    """An evaluation cache entry stored before h69 holds a verification's powers per face:
    read back, they are summed per person as a measurement now sums them."""
    task = _people_task(3, 2, 2)
    cache = EvalCache(tmp_path)
    s, n = np.arange(1.0, 7.0), np.full(6, 0.01)
    cache.put("k", 20.0, seconds=0.1, what={"parts": "faces"}, arrays={"signal": s, "noise": n})
    got = _cached_parts(cache, "k", {"parts": "faces"}, task)
    assert got is not None and got.unit == "people"
    assert np.allclose(got.signal[:, 0], [1 + 2, 3 + 4, 5 + 6])


@pytest.mark.parametrize("data, eval_data, keyed", [("faces", None, True),
                                                    ("x.npz", None, False),
                                                    ("x.npz", "faces:raw", True)])
def test_the_units_are_in_the_plan_and_evaluate_keys_on_face_data_only(data, eval_data, keyed):
    """A run folder on face data whose choice or held-out powers counted photos runs its
    plan and evaluate stages again; other data's keys are unchanged."""
    from quantscope.pipeline import STAGES
    from quantscope.pipeline.steps import noise_rules, plan_rules

    ctx = SimpleNamespace(opts=SimpleNamespace(data=data, eval_data=eval_data, repairs=()))
    want = {"noise_units": UNITS_KEY} if keyed else {}
    assert noise_rules(ctx) == want and plan_rules(ctx) == want
    assert STAGES["evaluate"].rules is noise_rules
