"""The segment sweep streams: each env holds only the tensors a later segment reads (and
one segment's taps), so its memory follows one segment, not every group's output."""

import weakref

import numpy as np
import onnx
from onnx import helper
from sweep_helpers import prepared

from quantscope.analyze import Scorer, sweep_segments
from quantscope.analyze.memory import batch_tensor_bytes
from quantscope.analyze.segments import find_segments, live_tensors
from quantscope.types import Precision

LAYERS, WIDTH, ROWS = 12, 64, 2048


def _deep(layers: int = LAYERS) -> onnx.ModelProto:
    """``layers`` x (MatMul -> Relu), then a 2-wide MatMul: one weighted group per
    layer, a cut after each."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.normal(0, 1, (WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"h{i}"], name=f"relu{i}")]
        x = f"h{i}"
    # a narrow head, so the rows each candidate keeps are small next to the stream
    inits.append(onnx.numpy_helper.from_array(rng.normal(0, 1, (WIDTH, 2)).astype(np.float32),
                                              "head"))
    nodes.append(helper.make_node("MatMul", [x, "head"], ["y"], name="head"))
    graph = helper.make_graph(
        nodes, "deep", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _prepared():
    return prepared(_deep(), "deep", ROWS, WIDTH)


def test_live_tensors_hold_one_segment_not_the_model():
    model, groups, _, feeds = _prepared()
    segments = find_segments(model, groups)
    assert len(segments) == LAYERS + 1
    live = live_tensors(model, groups, segments)
    every = [t for g in groups.groups for t in g.outputs]
    most = max(batch_tensor_bytes(model, feeds, names) for names in live)
    # the stream and one layer's output, against every layer's output at once
    assert most <= 3 * ROWS * WIDTH * 4 < batch_tensor_bytes(model, feeds, every) / 3


def test_the_sweep_holds_about_one_segment_of_tensors(monkeypatch):
    from quantscope.analyze import segments, sweeps

    model, groups, stats, feeds = _prepared()
    held, most = [0], [0]
    real = segments.run_segment

    def counted(sess, names, env):  # the bytes of every tensor a session returned, alive
        out = real(sess, names, env)
        for v in out.values():
            held[0] += v.nbytes
            weakref.finalize(v, lambda n=v.nbytes: held.__setitem__(0, held[0] - n))
        most[0] = max(most[0], held[0])
        return out

    monkeypatch.setattr(segments, "run_segment", counted)
    monkeypatch.setattr(sweeps, "run_segment", counted)
    kw = {"scorer": Scorer(), "low": Precision.A8_W8, "high": Precision.A16_W16}
    res = sweep_segments(model, groups, stats, feeds, **kw)
    one = ROWS * WIDTH * 4  # one tensor of one batch
    assert len(res.candidates) == 2 * (LAYERS + 1)
    # every group output of the FP32, all-low and a candidate's env would be 3 x 13
    # tensors; streamed, each env holds the stream and the segment running
    assert 2 * one <= most[0] <= 8 * one, most[0] / one


def test_the_sizer_infers_shapes_once_and_sizes_every_live_set_as_before(monkeypatch):
    """The sweep sizes every segment's live set; the shapes are inferred once for all of
    them (one inference per set was seconds per segment on a 12-layer encoder)."""
    from quantscope.analyze.memory import tensor_sizer
    from quantscope.model import shapes

    model, groups, _, feeds = _prepared()
    live = live_tensors(model, groups, find_segments(model, groups))
    each = [batch_tensor_bytes(model, feeds, names) for names in live]
    calls = []
    real = shapes.resolve_shapes
    monkeypatch.setattr(shapes, "resolve_shapes", lambda *a, **k: calls.append(1) or real(*a, **k))
    sizer = tensor_sizer(model, feeds)
    assert [sizer(names) for names in live] == each and len(calls) == 1
    assert len(live) > 1 and sizer([]) == 0
