"""What is measured is what is shipped: one QDQ graph per plan, whichever path builds it.

For every built-in target, the graph ``evaluate`` is handed, the file ``export-qdq``
writes and the file ``export --format qdq`` writes are byte-identical (issue: on hailo8
``export-qdq`` once stored weights as INT8 and ``export`` as UINT8). ORT runs the emulation
form of that graph (weights dequantized once, :func:`emulation_form`), whose outputs are
bit-identical to the exported graph's run by ORT as written.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tiny_models as tm

from quantscope import stages
from quantscope.analyze import measure
from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.emulate.qdq import quantize_model
from quantscope.emulate.session import emulation_form, make_session
from quantscope.model.groups import find_groups
from quantscope.targets import BUILTIN_TARGETS, load_target
from quantscope.types import Plan, Precision, QuantscopeError

TARGETS = sorted(n.replace("_", "-") for n in BUILTIN_TARGETS)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("onegraph")
    m, x, s = d / "m.onnx", d / "x.npy", d / "s.npz"
    onnx.save(tm.conv_net(), m)
    x_arr = np.random.default_rng(0).normal(0, 1, (16, 3, 16, 16)).astype(np.float32)
    np.save(x, x_arr)
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    return d, m, x, s


def _as_written(proto):
    """The graph handed to ORT as it is (optimizations off, nothing folded)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(proto.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def assert_emulation_form_exact(proto, feeds_list):
    """The emulation form folds every weight DequantizeLinear and computes, bit for bit,
    what the graph as written computes."""
    form = emulation_form(proto)
    inits = {t.name for t in proto.graph.initializer}
    weights = {n.output[0] for n in proto.graph.node
               if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    assert weights, "the graph quantizes no weight"
    assert not weights & {o for n in form.graph.node for o in n.output}
    assert weights <= {t.name for t in form.graph.initializer}
    raw, emu = _as_written(proto), make_session(proto)
    for feeds in feeds_list:
        for a, b in zip(raw.run(None, feeds), emu.run(None, feeds), strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b)


def _evaluated_graph(monkeypatch, argv):
    """Run ``quantscope evaluate`` and return the bytes of the emulated graph it ran (one
    plan: its session is opened first, then FP32's, and both run in lock-step)."""
    seen = []
    real = measure.open_runs  # evaluate_plans (re-exported by stages) runs it there

    def tap(proto, batches, *args, **kw):
        seen.append(proto.SerializeToString())
        return real(proto, batches, *args, **kw)

    monkeypatch.setattr(measure, "open_runs", tap)
    assert main(argv) == 0
    monkeypatch.setattr(measure, "open_runs", real)
    assert len(seen) == 2  # the emulated plan, then the FP32 reference
    return seen[0]


@pytest.mark.parametrize("target", TARGETS)
def test_evaluate_export_qdq_and_export_write_one_graph(files, target, monkeypatch, tmp_path):
    d, m, x, s = files
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"format": "quantscope.plan/1", "default": "a8_w8", "target": target}))
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    assert main(["export-qdq", str(m), "--stats", str(s), "--plan", str(p), "--out", str(a)]) == 0
    assert main(["export", str(p), "--model", str(m), "--stats", str(s), "--format", "qdq",
                 "--out", str(b)]) == 0
    evaluated = _evaluated_graph(monkeypatch, ["evaluate", str(m), "--data", str(x),
                                               "--stats", str(s), "--plan", str(p)])
    assert a.read_bytes() == b.read_bytes() == evaluated
    x_arr = np.load(x)
    assert_emulation_form_exact(onnx.load_from_string(evaluated), [{"image": x_arr[:8]},
                                                                  {"image": x_arr[8:]}])
    # and the graph carries the target's scheme: weights signed iff the target says so
    scheme = load_target(target).scheme
    w = next(i for i in onnx.load(a).graph.initializer if i.name.endswith("_quantized")
             and i.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8))
    assert (w.data_type == onnx.TensorProto.INT8) == scheme.weight_signed


def test_scheme_contradicting_the_plans_target_is_refused(files):
    _, m, _, s = files
    model, stats = stages.open_model(m), stages.read_stats(s)
    other = load_target("hailo8").scheme
    qnn = load_target("qnn-htp-v73").scheme
    assert other != qnn
    with pytest.raises(QuantscopeError, match="another quantization scheme"):
        stages.qdq_for_plan(model, stats, Plan(default=Precision.A8_W8, target="hailo8"),
                            scheme=qnn)


def test_hailo_unsigned_symmetric_weights_compute_what_signed_ones_do(files):
    """Why the figures measured before the fix stand: unsigned symmetric weights (zero point
    2^(b-1)) sit on the same grid as signed ones, so only the stored type changed."""
    import numpy as np

    from quantscope.emulate.qdq import quantize_model
    from quantscope.emulate.session import make_session

    _, m, x, s = files
    model, stats = stages.open_model(m), stages.read_stats(s)
    feeds = {"image": np.load(x)[:8]}
    outs = []
    for target in ("hailo8", "qnn-htp-v73"):
        for prec in (Precision.A8_W8, Precision.A8_W4, Precision.A16_W16):
            q = quantize_model(model, stats, Plan(default=prec, target=target),
                               scheme=load_target(target).scheme)
            outs.append(make_session(q.proto).run(None, feeds)[0])
    for a, b in zip(outs[:3], outs[3:], strict=True):
        assert np.array_equal(a, b)


def _matmul_net(k=384, n=256, seed=5):
    """One MatMul with a wide inner dimension (several of ORT's GEMM blocks) and a bias."""
    rng = np.random.default_rng(seed)
    w = onnx.numpy_helper.from_array(rng.normal(0, 0.05, (k, n)).astype(np.float32), "w")
    bias = onnx.numpy_helper.from_array(rng.normal(0, 0.1, n).astype(np.float32), "b")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["h"]),
         onnx.helper.make_node("Add", ["h", "b"], ["y"])], "mm",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", 64, k])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", 64, n])],
        [w, bias])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("prec", [Precision.A8_W8, Precision.A8_W4, Precision.A16_W16])
def test_emulation_form_is_bit_identical_on_wide_matmuls(target, prec, tmp_path):
    """Wide GEMMs are where ORT's packing of constant weights would change the summation
    order: the emulation form must not let it."""
    onnx.save(_matmul_net(), tmp_path / "m.onnx")
    model = stages.open_model(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, (b, 64, 384)).astype(np.float32)} for b in (1, 4, 8)]
    np.save(tmp_path / "x.npy", np.concatenate([f["x"] for f in feeds]))
    stats = stages.calibrate_model(model, stages.open_data(tmp_path / "x.npy", model))
    plan = Plan(default=prec, target=target)
    q = quantize_model(model, stats, plan, scheme=load_target(target).scheme)
    assert_emulation_form_exact(q.proto, feeds)


def test_graph_without_constant_dequantize_runs_as_written():
    proto = tm.conv_net()
    assert emulation_form(proto) is proto


@pytest.mark.slow
def test_emulation_form_is_bit_identical_on_minilm():
    model = stages.open_model("minilm-l3")
    data = stages.open_data("stdlib-docs", model, max_pairs=24)
    stats = calibrate(model, find_groups(model), list(data.calibration)[:2])  # quick
    feeds = list(data.evaluation)[:3]
    for target in ("hailo8", "qnn-htp-v73"):
        for prec in (Precision.A8_W8, Precision.A16_W16):
            q = quantize_model(model, stats, Plan(default=prec, target=target),
                               scheme=load_target(target).scheme)
            assert_emulation_form_exact(q.proto, feeds)
