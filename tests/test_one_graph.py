"""What is measured is what is shipped: one QDQ graph per plan, whichever path builds it.

For every built-in target, the graph ``evaluate`` runs in ONNX Runtime, the file
``export-qdq`` writes and the file ``export --format qdq`` writes are byte-identical
(issue: on hailo8 ``export-qdq`` once stored weights as INT8 and ``export`` as UINT8).
"""

import json

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope import stages
from quantscope.cli import main
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


def _evaluated_graph(monkeypatch, argv):
    """Run ``quantscope evaluate`` and return the bytes of the emulated graph it ran."""
    seen = []
    real = stages.run_model

    def tap(proto, batches, **kw):
        seen.append(proto.SerializeToString())
        return real(proto, batches, **kw)

    monkeypatch.setattr(stages, "run_model", tap)
    assert main(argv) == 0
    monkeypatch.setattr(stages, "run_model", real)
    assert len(seen) == 2  # FP32 reference, then the emulated plan
    return seen[1]


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
