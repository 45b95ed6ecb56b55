"""A time axis is not a channel axis (h47): an output ``[1, F]`` whose F varies by sample
(hibari's ``f0``, a frame per 10 ms of speech) had per-channel figures per frame
position, the last positions over the few longest samples; a "channel" there that only
two samples reach, small against the output's range, quantized to 0 and read ``NOT LIKE
FP32`` (``channel 155 of axis 1: every value quantizes to 0``). An axis whose length
changes between samples is read as positions: no per-channel figure along it, and a
note says so."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Plan, Precision


def frames_model() -> onnx.ModelProto:
    """``x [1, 16]`` frames, ``k [1]`` int64 -> ``y [1, F]``: the first k frames of
    ``x * 1.5`` (a Slice whose end comes from the data)."""
    inits = [numpy_helper.from_array(np.array(1.5, np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "start"),
             numpy_helper.from_array(np.array([1], np.int64), "axis")]
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"], name="gain"),
             helper.make_node("Slice", ["xw", "start", "k", "axis"], ["y"], name="frames")]
    g = helper.make_graph(
        nodes, "frames",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "F"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _samples() -> tuple[dict[str, np.ndarray], ...]:
    """Six samples: four of 6 frames (values up to 400, one at -3), two of 10 whose last
    frames are small (-0.7 .. -0.2: both round to 0 on a grid of 400 / 255 per step)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(6):
        x = rng.uniform(5, 400, (1, 16)).astype(np.float32)
        x[0, 0] = -3.0 if i == 0 else x[0, 0]
        long = i >= 4
        if long:
            x[0, 6:10] = rng.uniform(-0.7, -0.2, 4)
        out.append({"x": x, "k": np.array([10 if long else 6], np.int64)})
    return tuple(out)


def _evaluate() -> dict:
    model = load_proto(frames_model(), "frames")
    data = Dataset(name="frames", calibration=_samples(), evaluation=_samples())
    stats = stages.calibrate_model(model, data)
    return stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W8))


def test_positions_reached_by_few_samples_are_not_a_collapsed_channel():
    res = _evaluate()
    notes = res["notes"]
    assert not any(n.startswith("NOT LIKE FP32") for n in notes), notes
    assert not any("of axis 1" in n for n in notes), notes  # no "channel k of axis 1"
    y = res["outputs"]["y"] if "outputs" in res else res["metrics"]
    assert y.get("collapsed_channels", 0) == 0 and "channel_worst" not in y
    said = next(n for n in notes if "varies by sample" in n)
    assert "output 'y'" in said and "6 to 10" in said and "positions" in said
    assert "6 samples" in said


def test_a_symbolic_axis_of_one_length_is_positions_too():
    """The same data at one length (every sample 10 frames): h47 read its frames as
    channels (``NOT LIKE FP32`` from the small last frames); the model declares ``F``
    symbolic, so they are positions (h70: tests/test_h70_symbolic_positions.py; a static
    axis is still read as channels there)."""
    model = load_proto(frames_model(), "frames")
    fixed = tuple({"x": s["x"], "k": np.array([10], np.int64)} for s in _samples())
    for s in fixed[:4]:
        s["x"][0, 6:10] = np.random.default_rng(1).uniform(-0.7, -0.2, 4)
    data = Dataset(name="frames", calibration=fixed, evaluation=fixed)
    stats = stages.calibrate_model(model, data)
    res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W8))
    assert not any(n.startswith("NOT LIKE FP32") for n in res["notes"]), res["notes"]
    assert not any("varies by sample" in n for n in res["notes"])
    assert any("axis 1 is symbolic in the model ('F')" in n for n in res["notes"])


def test_analysis_refuses_an_output_whose_length_follows_the_data():
    """The analysis compares rows of one width: it stopped with an internal error
    (``ValueError: all the input array dimensions … must match exactly``); now one line
    naming the output and both shapes."""
    import pytest

    from quantscope.analyze import analyze
    from quantscope.analyze.scoring import outputs_scorer
    from quantscope.model.groups import find_groups
    from quantscope.types import QuantscopeError

    model = load_proto(frames_model(), "frames")
    data = Dataset(name="frames", calibration=_samples(), evaluation=_samples())
    stats = stages.calibrate_model(model, data)
    with pytest.raises(QuantscopeError, match=r"output 'y' is \[6\] per sample on one batch "
                       r"and \[10\] on another .*'quantscope evaluate' measures it"):
        analyze(model, find_groups(model), stats, list(_samples()),
                scorer=outputs_scorer(names=("y",)), proxy_fraction=1.0)
