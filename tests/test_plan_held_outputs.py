"""What a plan's scoring holds per sample (h74): only the outputs the task's figures read.

IS-Net (12 outputs at 1024 x 1024, 118.5 MB a photo) scored by its matte's mask IoU kept
every candidate's 12 outputs of every photo whole until its task was scored, on top of
the FP32 reference: the plan search grew by about that much a photo. The kept outputs
are now the task's (a map's one output; none for plain fidelity), with the same figures.
Bytes are counted here, not the resident set."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import _rng, _with_weights

import quantscope.analyze.measure as measure
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.evaluate import kept_only
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.stages.plan_measure import _plan_measure
from quantscope.tasks.layout import OutputTasks
from quantscope.tasks.maps import MapTask
from quantscope.tasks.reads import outputs_read
from quantscope.types import Dataset, Plan, Precision

FEAT, MAP = 16 * 8 * 8 * 4, 1 * 8 * 8 * 4  # bytes a sample of each output


def matte():
    """A feature map left as a graph output beside its Sigmoid matte (IS-Net's side
    outputs, small)."""
    r = _rng(74)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    matte (float[N, 3, 8, 8] input) => (float[N, 16, 8, 8] feat, float[N, 1, 8, 8] alpha) {
        h = Conv <pads = [1, 1, 1, 1]> (input, w1, b1)
        feat = Relu (h)
        s = Conv <pads = [1, 1, 1, 1]> (feat, w2, b2)
        alpha = Sigmoid (s)
    }
    """
    return load_proto(_with_weights(text, {
        "w1": r.normal(0, 0.4, (16, 3, 3, 3)).astype(np.float32),
        "b1": r.normal(0, 0.1, 16).astype(np.float32),
        "w2": r.normal(0, 0.3, (1, 16, 3, 3)).astype(np.float32),
        "b2": np.zeros(1, np.float32)}), "matte")


def _data(photos: int, task) -> Dataset:
    x = np.random.default_rng(0).uniform(0, 1, (photos, 3, 8, 8)).astype(np.float32)
    batches = tuple({"input": x[i:i + 1]} for i in range(photos))  # one a run, as IS-Net
    return Dataset(name="photos", calibration=batches, evaluation=batches, task=task)


def _search(monkeypatch, photos: int, task, only: str | None):
    """Two plans measured as the plan search measures them; per plan the bytes its
    scoring kept of the plan's outputs, and the figures."""
    model = matte()
    data = _data(photos, task)
    stats = calibrate(model, find_groups(model), list(data.calibration))
    held: list[int] = []
    real = measure.compare_model

    def counted(test, ref, **kw):
        fid, kept = real(test, ref, **kw)
        held.append(sum(a.nbytes for b in kept.batches for a in b))
        return fid, kept

    monkeypatch.setattr(measure, "compare_model", counted)
    run = _plan_measure(model, data, None, None, None, only=only)
    figures = [dict(run(model, stats, Plan.uniform(p)))
               for p in (Precision.A8_W8, Precision.A16_W8)]
    return held, figures


@pytest.mark.parametrize("photos", [2, 6])
def test_a_map_task_keeps_its_output_alone(monkeypatch, photos):
    task = MapTask(name="map:alpha", output="alpha")
    held, figures = _search(monkeypatch, photos, task, "mask_iou")
    assert held == [photos * MAP] * 2  # not photos * (FEAT + MAP): the feature map dropped
    # the same figures as keeping every output (the task reads none of the others)
    monkeypatch.setattr(measure, "outputs_read", lambda task: None)
    whole, before = _search(monkeypatch, photos, task, "mask_iou")
    assert whole == [photos * (FEAT + MAP)] * 2
    assert figures == before


def test_plain_fidelity_keeps_no_output(monkeypatch):
    held, figures = _search(monkeypatch, 4, None, None)
    assert held == [0, 0]
    monkeypatch.setattr(measure, "outputs_read", lambda task: None)
    whole, before = _search(monkeypatch, 4, None, None)
    assert whole == [4 * (FEAT + MAP)] * 2 and figures == before


def test_outputs_read_by_each_kind_of_task():
    alpha, feat = MapTask(name="a", output="alpha"), MapTask(name="f", output="feat")
    assert outputs_read(None) == ()
    assert outputs_read(alpha) == ("alpha",)
    both = OutputTasks(name="o", tasks=(alpha, feat), headline="mask_iou")
    assert outputs_read(both) == ("alpha", "feat")
    # a task not known to read its output alone keeps every output, as before
    assert outputs_read(object()) is None
    assert outputs_read(OutputTasks(name="o", tasks=(alpha, object()), headline="x")) is None
    pick = kept_only(("feat", "alpha"), ("alpha",))
    assert pick(("feat", "alpha")) == ("alpha",) and kept_only(("a",), None)(["a"]) == ("a",)


def _ort_base(a: np.ndarray) -> bool:
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base is not None and not isinstance(base, np.ndarray)


def test_the_fp32_reference_does_not_pin_its_sessions_arena():
    """ONNX Runtime's outputs were views of the session's own arena: the FP32 reference a
    search or an evaluation holds (mobilefacenet's 88 kB of embeddings) kept that session's
    whole arena resident (243 MB) after the session was gone. Its arrays are now the
    process's own, the values the same."""
    from quantscope.emulate.evaluate import open_runs, owned, run_model

    model = matte()
    batches = list(_data(3, None).evaluation)
    ref = run_model(model.proto, batches)
    assert not any(_ort_base(a) for b in ref.batches for a in b)
    raw = [o for o, _ in open_runs(model.proto, batches).batches]  # the shared arena's
    for got, want in zip(ref.batches, raw, strict=True):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    view = np.arange(6.0).reshape(2, 3).T  # a NumPy view: its own memory, not copied
    assert owned(view) is view
    seq = [np.zeros(2, np.float32)]  # a sequence output comes as a list: left as it is
    assert owned(seq) is seq


@pytest.mark.parametrize("photos", [2, 6])
def test_the_plan_estimate_holds_the_reference_beside_the_cache(monkeypatch, photos):
    """The plan stage's estimate counts the FP32 reference the search holds (every output
    of the fit data: it grows with the photos) beside the activation cache as the search
    sizes it (a unit test of the term; before, the reference was counted only with
    repairs)."""
    import quantscope.analyze.activation_cache as ac
    from quantscope.analyze.stage_memory import plan_search_memory

    monkeypatch.setattr(ac, "CACHE_MIN", 1024)
    monkeypatch.setattr(ac, "CACHE_FP32", 2.0)
    model = matte()
    batches = list(_data(photos, None).evaluation)
    parts = dict(plan_search_memory(model, batches, resident=0, available=1 << 34).parts)
    ref = photos * (FEAT + MAP)
    assert parts["the FP32 reference (every output of the fit data)"] == ref
    whole = ac.cache_memory(model, batches, [("feat",), ("feat", "alpha")], 1 << 20,
                            available=1 << 34)
    assert parts["the activation cache"] == whole.cache_bytes
