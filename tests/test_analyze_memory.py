"""The segment sweep's memory: candidate sessions built and dropped in windows within a
budget (the rows do not change), the peak said before any session, and one line when
not even one candidate fits."""

import io
import sys

import numpy as np
import pytest
import tiny_models as tm
from sweep_helpers import assert_same_sweep

from quantscope.analyze import Scorer, sweep_segments
from quantscope.analyze import segments as seg_mod
from quantscope.analyze.memory import plan_memory, weight_bytes
from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Precision, QuantscopeError

KW = {"scorer": Scorer(), "low": Precision.A8_W8, "high": Precision.A16_W16}


def _prepared(name="layernorm_block"):
    model = load_proto(tm.ALL[name](), name)
    groups = find_groups(model)
    feeds = [tm.sample_inputs(model.proto, seed=i) for i in range(3)]
    return model, groups, calibrate(model, groups, feeds), feeds


def test_windows_hold_fewer_sessions_and_give_the_same_rows(monkeypatch):
    model, groups, stats, feeds = _prepared()
    held, most = [0], [0]
    real = seg_mod.make_session

    class Tracked:
        """A session that counts itself alive (the sweep must drop each window's)."""

        def __init__(self, sess):
            self.sess = sess
            held[0] += 1
            most[0] = max(most[0], held[0])

        def __del__(self):
            held[0] -= 1

        def __getattr__(self, name):
            return getattr(self.sess, name)

    monkeypatch.setattr(seg_mod, "make_session", lambda *a, **k: Tracked(real(*a, **k)))
    whole = sweep_segments(model, groups, stats, feeds, **KW)
    all_at_once = most[0]
    most[0] = held[0] = 0
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    windowed = sweep_segments(model, groups, stats, feeds, **KW, session_budget=1,
                              progress=True)
    chains = 2 * len(seg_mod.find_segments(model, groups))
    # one candidate's sessions at a time next to the chains', not every candidate's
    assert most[0] - chains <= len(seg_mod.find_segments(model, groups))
    assert all_at_once - chains >= len(whole.candidates) > most[0] - chains
    assert_same_sweep(whole, windowed)
    said = err.getvalue()
    first = said.index("GB peak (2 chain(s) of")
    assert f"in {len(whole.candidates)} windows" in said
    assert first < said.index("analyze: FP32 sessions of")  # said before any session
    assert "analyze: candidate sessions 1-1 (window 1/" in said


def test_the_estimate_splits_and_refuses_in_one_line(monkeypatch):
    from quantscope.analyze import memory

    model, _, _, feeds = _prepared()
    w = weight_bytes(model)
    mem = plan_memory(model, [w, w, w, w], feeds, [], chains=2, budget=2 * w,
                      available=1 << 40)
    assert mem.windows == (range(0, 2), range(2, 4)) and mem.sessions == 2
    assert mem.peak == 2 * w + 2 * w + mem.activation_bytes + mem.run_bytes
    out = model.output_names()
    rows, length, width = feeds[0]["x"].shape  # [N, S, 24] out, like its input
    assert plan_memory(model, [w], feeds, out, chains=2, available=1 << 40).activation_bytes \
        == 3 * rows * length * width * 4
    monkeypatch.setattr(memory, "WINDOW_MODELS", float("inf"))  # bench: no bound
    assert len(plan_memory(model, [w] * 4, feeds, [], chains=2, available=1 << 40).windows) == 1
    monkeypatch.setattr(memory, "WINDOW_MODELS", 2.0)
    assert len(plan_memory(model, [w] * 4, feeds, [], chains=2, available=1 << 40).windows) == 2
    with pytest.raises(QuantscopeError) as e:
        plan_memory(model, [w], feeds, out, chains=2, available=w)
    assert "--seq-len" in str(e.value) and "\n" not in str(e.value)


def test_tensor_bytes_come_from_shapes_inferred_at_the_batch_not_from_dim_positions():
    """A head split leaves per-head tensors with symbolic dims of their own ([N, 'h', 'd',
    'e']): read by position each would be the length (8 ** 3 here); inferred at the batch's
    [rows, length] token input they are their real size."""
    import onnx
    from onnx import TensorProto, helper

    from quantscope.analyze.memory import batch_tensor_bytes

    rows, length, heads, d = 3, 8, 2, 4
    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["x"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["x", "ax"], ["x3"]),
         helper.make_node("Expand", ["x3", "shape"], ["wide"]),
         helper.make_node("Reshape", ["wide", "heads"], ["per_head"])],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", "S"])],
        [helper.make_tensor_value_info("per_head", TensorProto.FLOAT, ["N", "a", "b", "c"])],
        [helper.make_tensor("ax", TensorProto.INT64, [1], [2]),
         helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1, heads * d]),
         helper.make_tensor("heads", TensorProto.INT64, [4], [0, 0, heads, d])])
    model = load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    onnx.checker.check_model(model.proto)
    batch = {"ids": np.zeros((rows, length), np.int64)}
    got = batch_tensor_bytes(model, [batch], ["per_head"])
    assert got == rows * length * heads * d * 4  # not rows * length ** 3 * 4


def test_the_peak_resident_set_is_read_and_started_anew():
    """``peak_bytes`` reads the process's peak (VmHWM); after ``reset_peak`` it is the
    peak since, below a large array's that was freed before (Linux). In a fresh process:
    in one that ran other tests the allocator may keep the freed array resident."""
    import json
    import subprocess
    import sys

    code = (
        "import json, numpy as np\n"
        "from quantscope.analyze.memory import peak_bytes, reset_peak\n"
        "if peak_bytes() is None:\n"
        "    print(json.dumps({'skip': 'no /proc/self/status here'})); raise SystemExit\n"
        "big = np.ones(64 << 17)  # 64 MB, touched\n"
        "held = peak_bytes()\n"
        "del big\n"
        "if not reset_peak():\n"
        "    print(json.dumps({'skip': '/proc/self/clear_refs is not writable here'}))\n"
        "    raise SystemExit\n"
        "print(json.dumps({'held': held, 'after': peak_bytes()}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    held, after = got["held"], got["after"]
    assert held is not None and held >= 64 << 20
    assert after is not None and after < held - (32 << 20)


def test_a_scored_sweep_keeps_metrics_not_rows_and_gives_the_same_figures():
    """With ``score``, each candidate is scored when its window is done and its rows are
    dropped (an image model's rows are every output value: IS-Net's 118.5 MB a sample,
    held for 258 candidates, ended an analysis at 22 GB); the metrics are those of the
    rows an unscored sweep keeps, windowed or not."""
    from quantscope.analyze.scoring import fidelity

    model, groups, stats, feeds = _prepared()
    whole = sweep_segments(model, groups, stats, feeds, **KW)
    for budget in (None, 1):
        scored = sweep_segments(model, groups, stats, feeds, **KW, score=fidelity,
                                session_budget=budget)
        assert scored.rows == () and len(scored.metrics) == len(whole.candidates)
        for i, m in enumerate(scored.metrics):
            assert m == fidelity(whole.ref_rows, whole.rows[i])
        np.testing.assert_array_equal(whole.ref_rows, scored.ref_rows)


def test_the_rows_held_until_scored_split_the_windows_and_are_said():
    """A candidate's rows count toward the peak until its window is scored: the rows held
    at once stay within the larger of a batch's tensors and two models' weights (here two
    candidates' rows), and within what the memory available leaves."""
    model, _, _, feeds = _prepared()
    w = weight_bytes(model)
    roomy = plan_memory(model, [w] * 4, feeds, [], chains=2, available=1 << 40)
    assert len(roomy.windows) == 2 and roomy.row_bytes == 0  # the weights' budget alone
    mem = plan_memory(model, [w // 8] * 6, feeds, [], chains=2, available=1 << 40,
                      row_bytes=w)
    assert [len(x) for x in mem.windows] == [2, 2, 2]
    assert mem.row_bytes == 2 * w and mem.peak >= 2 * w
    row = 1 << 30
    mem = plan_memory(model, [w // 8] * 3, feeds, [], chains=2, available=1 << 40,
                      row_bytes=row)  # larger than the bound: one candidate a window
    assert [len(x) for x in mem.windows] == [1, 1, 1]
    assert "their output rows ~1024 MB until scored" in mem.text()
    held = plan_memory(model, [w // 8] * 3, feeds, [], chains=2, available=1 << 40,
                       row_bytes=row, held_bytes=3 * row)  # FP32's and the baselines' rows
    assert held.peak == mem.peak + 3 * row
    assert "reference and baseline rows ~3072 MB" in held.text()
    with pytest.raises(QuantscopeError) as e:  # not even one candidate's rows fit
        plan_memory(model, [w], feeds, [], chains=2, available=row, row_bytes=row)
    assert "one candidate's output rows ~1024 MB" in str(e.value)


def test_a_picture_models_tensors_are_sized_at_the_datas_picture_size():
    """``x [1, 3, H, W]`` -> Relu -> Relu -> Sigmoid at 64 x 48 pictures: every tensor is
    3 x 64 x 48 floats (read by position, H and W were the length, 3: 36 values each), and
    one run holds two of them at once plus a Q/DQ copy of the largest."""
    import onnx
    from onnx import TensorProto, helper

    from quantscope.analyze.memory import run_bytes, tensor_sizer

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
         helper.make_node("Sigmoid", ["b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, "H", "W"])])
    model = load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    onnx.checker.check_model(model.proto)
    one = 3 * 64 * 48 * 4
    sizer = tensor_sizer(model, [{"x": np.zeros((1, 3, 64, 48), np.float32)}])
    assert sizer(["a"]) == sizer(["y"]) == one
    assert run_bytes(model, sizer) == 3 * one
