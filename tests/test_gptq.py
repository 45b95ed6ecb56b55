"""GPTQ rounding (repair/gptq.py) on tiny models built here: error, grid, files, 16 bit."""

import hashlib

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.numerics import dequantize, quantize, weight_encoding
from quantscope.repair.apply import run_repairs
from quantscope.repair.gptq import gptq, gptq_codes
from quantscope.repair.registry import REGISTRY
from quantscope.types import Plan, Precision, QuantScheme, QuantscopeError

MIX = np.random.default_rng(7).normal(0, 1, (4, 48))


def _x(seed: int, n: int = 64) -> np.ndarray:
    """Strongly correlated inputs (rank 4 plus a little noise): where nearest rounding is
    far from the output-optimal one."""
    r = np.random.default_rng(seed)
    return (r.normal(0, 1, (n, 4)) @ MIX + 0.05 * r.normal(0, 1, (n, 48))).astype(np.float32)


def _linears(seed: int = 0) -> onnx.ModelProto:
    """x [N, 48] -> MatMul w1 [48, 40] -> Relu -> Gemm (transB) w2 [24, 40] -> y [N, 24]."""
    r = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["a"], name="relu"),
             helper.make_node("Gemm", ["a", "w2", "b2"], ["y"], name="fc2", transB=1)]
    inits = [numpy_helper.from_array(r.normal(0, 0.2, (48, 40)).astype(np.float32), "w1"),
             numpy_helper.from_array(r.normal(0, 0.2, (24, 40)).astype(np.float32), "w2"),
             numpy_helper.from_array(r.normal(0, 0.1, 24).astype(np.float32), "b2")]
    g = helper.make_graph(nodes, "linears",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, 48])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, 24])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _feeds(seeds: range) -> list[dict[str, np.ndarray]]:
    return [{"x": _x(s)} for s in seeds]


def test_gptq_output_error_below_nearest_on_held_out_inputs():
    m = load_proto(_linears())
    rep = gptq(m, _feeds(range(4)), Plan.uniform(Precision.A8_W4))
    assert rep.effect_dict()["layers"] == 2
    w = m.initializer_array("w1").astype(np.float64)
    new = rep.model().initializer_array("w1").astype(np.float64)
    enc = weight_encoding(m.initializer_array("w1"), 4, axis=1, signed=True, symmetric=True)
    near = dequantize(quantize(m.initializer_array("w1"), enc), enc).astype(np.float64)
    x = np.concatenate([_x(100 + s) for s in range(4)]).astype(np.float64)  # not calibration
    e_gptq = np.sum((x @ (new - w)) ** 2)
    e_near = np.sum((x @ (near - w)) ** 2)
    assert e_gptq < 0.5 * e_near, (e_gptq, e_near)
    assert rep.effect_dict()["mean_output_error_ratio"] < 0.5


def test_gptq_codes_equal_nearest_when_the_inputs_are_uncorrelated():
    """A diagonal H has no error to feed back: GPTQ is round to nearest."""
    r = np.random.default_rng(1)
    w, s = r.normal(0, 1, (6, 10)), np.full((6, 1), 0.3)
    q = gptq_codes(w, np.diag(r.uniform(1, 2, 10)), s, 0.0, -7, 7, block=4)
    assert np.array_equal(q, np.clip(np.round(w / s), -7, 7))
    with pytest.raises(QuantscopeError, match="block"):
        gptq_codes(w, np.eye(10), s, 0.0, -7, 7, block=0)


SCHEMES = {
    "signed, per channel": QuantScheme(),
    "unsigned (hailo), per channel": QuantScheme(weight_signed=False),
    "signed, per tensor": QuantScheme(weight_per_channel=False),
}


@pytest.mark.parametrize("precision", [Precision.A8_W4, Precision.A8_W8])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_gptq_weights_are_on_the_plans_grid(name, precision):
    """Q(DQ(w)) == w with the encoding the emulation derives from the new weight, and that
    encoding is the original weight's: the QDQ graph hands GPTQ's integers through."""
    scheme = SCHEMES[name]
    m = load_proto(_linears())
    rep = gptq(m, _feeds(range(4)), Plan.uniform(precision), scheme=scheme)
    assert rep.effect_dict()["on_grid"] == 1.0 and len(rep.changes) == 2
    out = rep.model()
    bits = precision.weight_bits
    for g in find_groups(m).groups:
        axis = g.weight_axis if scheme.weight_per_channel else None
        old, new = m.initializer_array(g.weight), out.initializer_array(g.weight)
        enc = weight_encoding(old, bits, axis=axis, signed=scheme.weight_signed, symmetric=True)
        again = weight_encoding(new, bits, axis=axis, signed=scheme.weight_signed,
                                symmetric=True)
        assert np.array_equal(again.scale, enc.scale)
        assert np.array_equal(again.zero_point, enc.zero_point)
        assert np.array_equal(dequantize(quantize(new, again), again), new)
        assert not np.array_equal(new, old)


def test_gptq_says_when_an_asymmetric_grid_is_not_exact():
    """Asymmetric weights: the scale re-derived from the rounded weight may differ in its
    last bit; the integers are the same, and the repair says it is not exactly on the grid."""
    m = load_proto(_linears())
    scheme = QuantScheme(weight_symmetric=False)
    rep = gptq(m, _feeds(range(4)), Plan.uniform(Precision.A8_W4), scheme=scheme)
    out = rep.model()
    for g in find_groups(m).groups:
        old, new = m.initializer_array(g.weight), out.initializer_array(g.weight)
        enc = weight_encoding(old, 4, axis=g.weight_axis, signed=True, symmetric=False)
        again = weight_encoding(new, 4, axis=g.weight_axis, signed=True, symmetric=False)
        assert np.array_equal(quantize(new, again), quantize(new, enc))
        assert np.allclose(again.scale, enc.scale, rtol=1e-6, atol=0)
    exact = rep.effect_dict()["on_grid"]
    assert exact == 1.0 or "not exactly on the grid" in rep.reason


def test_gptq_leaves_16_bit_weights_alone_and_says_so():
    m = load_proto(_linears())
    plan = Plan(default=Precision.A8_W4, overrides=(("fc2", Precision.A16_W16),))
    rep = gptq(m, _feeds(range(4)), plan)
    out = rep.model()
    assert np.array_equal(out.initializer_array("w2"), m.initializer_array("w2"))
    assert not np.array_equal(out.initializer_array("w1"), m.initializer_array("w1"))
    assert [c.tensor for c in rep.changes] == ["w1"]
    assert any(n == "fc2" and "16-bit" in why for n, why in rep.skipped), rep.skipped


def test_gptq_through_the_runner_changes_fp32_on_purpose_and_recalibrates():
    m = load_proto(_linears())
    feeds = _feeds(range(4))
    from quantscope.calibrate.collect import calibrate

    stats = calibrate(m, find_groups(m), feeds)
    assert REGISTRY["gptq"].keeps_fp32 is False and not REGISTRY["gptq"].default
    run = run_repairs(m, stats, Plan.uniform(Precision.A8_W4), feeds, repairs=["gptq"])
    (rec,) = run.records
    assert rec.name == "gptq" and rec.skipped is None and rec.fp32_check is None
    assert set(rec.changed) == {"w1", "w2"}
    assert "FP32 outputs change on purpose" in rec.reason and "vendor compiler" in rec.reason
    assert run.stats.tensors["y"].max != stats.tensors["y"].max  # measured after it


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_gptq_cli_writes_a_new_model_and_never_modifies_the_given_one(tmp_path, capsys):
    model, data = tmp_path / "m.onnx", tmp_path / "x.npz"
    onnx.save(_linears(), str(model))
    np.savez(data, x=np.concatenate([_x(s) for s in range(4)]))
    stats, before = tmp_path / "s.npz", _digest(model)
    assert main(["calibrate", str(model), "--data", str(data), "--out", str(stats)]) == 0
    out = tmp_path / "r.onnx"
    assert main(["repair", str(model), "--data", str(data), "--stats", str(stats),
                 "--precision", "a8_w4", "--repairs", "gptq", "--no-evaluate",
                 "--out-model", str(out), "--out-stats", str(tmp_path / "r.npz"),
                 "--out-plan", str(tmp_path / "r.json")]) == 0
    assert _digest(model) == before
    assert "gptq" in capsys.readouterr().out
    new = load_proto(onnx.load(str(out)))
    assert not np.array_equal(new.initializer_array("w1"),
                              load_proto(_linears()).initializer_array("w1"))


def test_gptq_bad_input_is_one_line(tmp_path, capsys):
    model, data = tmp_path / "m.onnx", tmp_path / "x.npz"
    onnx.save(_linears(), str(model))
    np.savez(data, x=_x(0))
    before = _digest(model)
    args = ["--data", str(data), "--precision", "a8_w4", "--no-evaluate",
            "--out-model", str(tmp_path / "r.onnx"), "--out-stats", str(tmp_path / "r.npz"),
            "--out-plan", str(tmp_path / "r.json")]
    for argv, needle in ((["repair", str(model), "--repairs", "gptqq", *args], "gptq"),
                         (["repair", str(tmp_path / "none.onnx"), "--repairs", "gptq", *args],
                          "none.onnx")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            raise SystemExit(main(argv))
        assert e.value.code != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0], err
    assert _digest(model) == before and not (tmp_path / "r.onnx").exists()
    with pytest.raises(QuantscopeError, match="damping"):
        gptq(load_proto(_linears()), _feeds(range(1)), Plan.uniform(Precision.A8_W4), damp=0)
