"""h52: ``run``'s held-out check judged a picture's PSNR, a face verification's and image
views' embedding SQNR and an image output's per-output key (``psnr_db:OUTPUT``) against the
flat 0.1 dB margin ("no noise estimate: evaluate.json keeps no per-sample powers"): a plan
worse by 0.05 dB PSNR on many steady samples was "within" it, one worse by 0.5 dB on five
noisy ones "beyond" it (ship uniform a8_w8, on noise). The evaluate stage now keeps their
per-sample powers too (a PSNR's ``peak² x values`` and squared error per sample; an
embedding's powers per face, per photo: the rows of one source are no independent
samples), for the check only (since h58 the planner ranks by them too)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from held_out_helpers import assert_beyond_noise, check_held_out, measured

from quantscope.analyze.measure import figure_parts
from quantscope.cli import main
from quantscope.emulate.evaluate import compare_model
from quantscope.pipeline.held_out import headline_parts
from quantscope.tasks.db_noise import db_noise, pooled_db, row_powers
from quantscope.tasks.pictures import ImageTask
from quantscope.types import Dataset, Outputs

PSNR = "psnr_db"


def _pictures(samples: int, spread: float, worse: float, seed: int, shape=(1, 8, 8)
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FP32's 0..1 images, a8_w8's (an error per sample scaled by a spread factor) and the
    plan's (that error ``worse`` larger, per sample about as much)."""
    rng = np.random.default_rng(seed)
    ref = rng.uniform(0.1, 0.9, (samples, *shape)).astype(np.float32)
    scale = np.exp(rng.normal(0, spread, (samples, 1, 1, 1))).astype(np.float32)
    err = rng.normal(0, 0.01, ref.shape).astype(np.float32) * scale
    grow = rng.normal(worse, worse * spread, (samples, 1, 1, 1)).astype(np.float32)
    return ref, ref + err, ref + err * (1 + grow)


def _image_results(samples: int, spread: float, worse: float, seed: int) -> dict:
    ref, uni, plan = _pictures(samples, spread, worse, seed)
    task = ImageTask(name="image:y", output="y", range=(0.0, 1.0))
    return measured({"y": ref}, {"a8_w8": {"y": uni}, "plan": {"y": plan}}, PSNR, task)


def test_a_plan_worse_by_under_0_1_db_psnr_beyond_its_jackknife_noise_says_ship_uniform():
    """200 steady pictures: 0.05 dB PSNR worse is measurably worse; the flat margin called
    it within noise and gave no advice."""
    results = _image_results(200, 0.5, 0.006, seed=0)
    assert_beyond_noise(check_held_out(results, PSNR), 200)


def test_a_plan_worse_by_over_0_1_db_psnr_within_its_noise_gives_no_advice():
    """Five pictures whose error differs widely: 0.5 dB worse is within the noise."""
    results = _image_results(5, 1.0, 0.05, seed=2)
    rec = check_held_out(results, PSNR)
    assert rec is not None and rec["worse_by"] > 0.1, rec
    assert rec["noise_from"] == "jackknife" and not rec["beyond_noise"], rec
    assert "ship uniform" not in rec["line"]


def test_the_psnr_powers_pool_to_the_figure_with_the_peak_of_fp32s_own_range():
    """No declared range: the peak is FP32's span on the data; the kept powers pool to the
    PSNR reported (else :func:`headline_parts` would drop them) and leaving a sample out
    keeps that peak (the difference of two plans does not depend on it)."""
    ref, uni, plan = _pictures(12, 0.3, 0.2, seed=3)
    task = ImageTask(name="image:y", output="y")
    results = measured({"y": ref}, {"a8_w8": {"y": uni}, "plan": {"y": plan}}, PSNR, task)
    parts = headline_parts(results, PSNR)
    assert set(parts) == {"plan", "a8_w8"}
    for label, p in parts.items():
        assert p.unit == "samples" and p.signal.shape == (12, 1)
        assert pooled_db(p) == pytest.approx(results[label]["metrics"][PSNR], abs=1e-9)
    # the paired difference is the squared errors' ratio, whatever the peak
    sse = {k: p.noise.sum() for k, p in parts.items()}
    got = db_noise(parts["plan"], parts["a8_w8"])
    assert got is not None and f"{10 * np.log10(sse['a8_w8'] / sse['plan']):+.3f} dB" in got[1]


def test_the_planner_reads_the_psnr_powers_the_check_reads():
    """One source of the powers (the task's ``sample_parts``): since h58 the planner's
    measurement keeps those the held-out check reads (h52 kept them for the check only;
    the planner's choice: ``tests/test_h58_planner_picture_noise.py``)."""
    ref, uni, _ = _pictures(6, 0.3, 0.0, seed=1)
    task = ImageTask(name="image:y", output="y", range=(0.0, 1.0))
    fp32 = Outputs(("y",), ((ref,),))
    fid, test = compare_model(_runs(uni), fp32, per_sample=True)
    data = Dataset("d", (), (), task=task)
    got = figure_parts(data, fid, fp32, test)[PSNR]
    assert np.array_equal(got.noise, task.sample_parts(fp32, test)[PSNR].noise)


def _runs(y: np.ndarray):
    from held_out_helpers import Runs

    return Runs(("y",), (y,))


def test_a_per_output_psnr_key_and_the_worst_outputs_keep_their_powers():
    """Two image outputs (``--layout a=image --layout b=image``): ``psnr_db:b`` has its own
    powers, and the unprefixed ``psnr_db`` (the worst output's) both outputs' columns."""
    from quantscope.tasks.layout import OutputTasks

    ra, ua, pa = _pictures(40, 0.3, 0.01, seed=4)
    rb, ub, pb = _pictures(40, 0.3, 0.5, seed=5)
    tasks = tuple(ImageTask(name=f"image:{o}", output=o, range=(0.0, 1.0)) for o in "ab")
    task = OutputTasks(name="outputs", tasks=tasks, headline=PSNR)
    for metric in ("psnr_db:b", PSNR):
        results = measured({"a": ra, "b": rb}, {"a8_w8": {"a": ua, "b": ub},
                                                "plan": {"a": pa, "b": pb}}, metric, task)
        parts = headline_parts(results, metric)
        assert set(parts) == {"plan", "a8_w8"}, metric
        rec = check_held_out(results, metric)
        assert rec is not None and rec["noise_from"] == "jackknife", rec
        assert "over 40 samples" in rec["noise"]
    assert results["plan"]["metrics"][PSNR] == results["plan"]["metrics"]["psnr_db:b"]


def _faces_task(faces: int, chips: int):
    from quantscope.tasks.faces import VerificationPairs
    from quantscope.tasks.verification import VerificationTask

    n = faces * chips  # genuine: a face's first chip and its others; impostor: the next face's
    first = np.concatenate([np.repeat(np.arange(0, n, chips), chips - 1), np.arange(0, n, chips)])
    second = np.concatenate([[f * chips + k for f in range(faces) for k in range(1, chips)],
                             (np.arange(0, n, chips) + chips + 1) % n])
    genuine = np.arange(len(first)) < faces * (chips - 1)
    pairs = VerificationPairs(first=first, second=second, genuine=genuine,
                              distance=np.array(["orig"] * len(first)),
                              change=np.array(["flip"] * len(first)))
    return VerificationTask("verification:faces", pairs, threshold=0.6,
                            faces=np.repeat(np.arange(faces), chips))


def _embeddings(units: int, rows: int, worse: float, seed: int, dim: int = 32):
    """FP32's embeddings of ``units`` sources of ``rows`` rows each, a8_w8's (an error
    whose size each source shares) and the plan's (larger by about ``worse``, by as much
    on each row of a source)."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(0, 1, (units * rows, dim)).astype(np.float32)
    scale = np.repeat(np.exp(rng.normal(0, 0.5, units)), rows)[:, None].astype(np.float32)
    err = rng.normal(0, 0.02, ref.shape).astype(np.float32) * scale
    grow = np.repeat(rng.normal(worse, worse * 0.5, units), rows)[:, None].astype(np.float32)
    return ref, ref + err, ref + err * (1 + grow)


def test_a_face_verification_embedding_sqnr_is_judged_by_its_noise_per_face():
    """``--data faces --metric embedding_sqnr_db``: the powers per face (its chips and
    their variants summed), and a plan 0.05 dB worse on 60 faces is beyond that noise."""
    metric = "embedding_sqnr_db"
    ref, uni, plan = _embeddings(60, 4, 0.006, seed=0)
    results = measured({"emb": ref}, {"a8_w8": {"emb": uni}, "plan": {"emb": plan}}, metric,
                       _faces_task(60, 4))
    parts = headline_parts(results, metric)
    assert {p.unit for p in parts.values()} == {"faces"}
    assert {p.signal.shape for p in parts.values()} == {(60, 1)}
    rec = check_held_out(results, metric)
    assert rec is not None and rec["worse_by"] < 0.1 and rec["beyond_noise"], rec
    assert "over 60 faces" in rec["noise"], rec["noise"]


def test_image_views_embedding_sqnr_is_judged_by_its_noise_per_photo():
    """``--data photos --metric embedding_sqnr_db``: one unit per photo (its views share
    the source), not per view: the noise is that of 12 photos, not of 48 views."""
    from quantscope.tasks.images import ViewRetrievalTask

    metric = "embedding_sqnr_db"
    ref, uni, plan = _embeddings(12, 4, 0.05, seed=2)
    task = ViewRetrievalTask(name="view-retrieval:photos", photo=np.repeat(np.arange(12), 4))
    results = measured({"emb": ref}, {"a8_w8": {"emb": uni}, "plan": {"emb": plan}}, metric,
                       task)
    parts = headline_parts(results, metric)
    assert {p.unit for p in parts.values()} == {"photos"}
    assert {p.signal.shape for p in parts.values()} == {(12, 1)}
    rec = check_held_out(results, metric)
    assert rec is not None and rec["noise_from"] == "jackknife", rec
    assert "over 12 photos" in rec["noise"], rec["noise"]
    # one view out at a time reads the noise of a photo's shared error as 4 samples'
    per_view = db_noise(row_powers(ref, plan), row_powers(ref, uni))
    assert per_view is not None and per_view[0] < rec["margin"], (per_view, rec["margin"])


def test_run_keeps_a_pictures_psnr_powers_held_out(tmp_path):
    """A tiny image model (Conv, Sigmoid: a 0..1 picture) run with ``--layout y=image``:
    evaluate.json keeps the plan's and a8_w8's PSNR powers per held-out sample, and the
    check has a jackknife noise of their difference."""
    import tiny_models as tm

    tm.conv_sigmoid(tmp_path / "m.onnx")
    x = np.random.default_rng(0).normal(0, 1, (24, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "w"
    assert main(["run", str(tmp_path / "m.onnx"), "--data", str(tmp_path / "x.npy"),
                 "--layout", "y=image:range=0-1", "--target", "hailo8",
                 "--out", str(out)]) == 0
    ev = json.loads((out / "evaluate.json").read_text())
    assert ev["metric"] == PSNR
    parts = headline_parts(ev["results"], PSNR)
    assert set(parts) == {"plan", "a8_w8"}
    for label, p in parts.items():
        assert p.signal.shape == (12, 1)  # the held-out half, one column
        assert pooled_db(p) == pytest.approx(ev["results"][label]["metrics"][PSNR], abs=1e-6)
    assert db_noise(parts["a8_w8"], parts["plan"]) is not None


def test_unit_powers_pool_to_the_whole_sqnr_and_leave_a_source_out_together():
    from quantscope.numerics import sqnr_db
    from quantscope.tasks.db_noise import Parts, side_by_side, unit_powers

    rng = np.random.default_rng(7)
    ref = rng.normal(0, 1, (10, 6))
    test = ref + rng.normal(0, 0.1, ref.shape)
    units = np.array([3, 1, 3, 2, 1, 2, 3, 1, 2, 2])
    got = unit_powers(ref, test, units, "faces")
    assert got.unit == "faces" and got.signal.shape == (3,)
    assert pooled_db(got) == pytest.approx(sqnr_db(ref, test), abs=1e-9)
    rows = row_powers(ref, test)
    assert got.noise[0] == pytest.approx(rows.noise[units == 1].sum())
    with pytest.raises(ValueError, match="unit labels"):
        unit_powers(ref, test, units[:-1], "faces")
    a, b = Parts(np.ones(4), np.ones(4), "samples"), Parts(np.ones(5), np.ones(5), "samples")
    assert side_by_side([a, b]) is None and side_by_side([]) is None
    assert side_by_side([a, a]).signal.shape == (4, 2)
