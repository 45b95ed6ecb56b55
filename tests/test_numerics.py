import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from quantscope.emulate.qdq import storage_type
from quantscope.numerics import (
    dequantize,
    fake_quant,
    qparams,
    quantize,
    row_cosines,
    sqnr_db,
    sqnr_db_from_powers,
    weight_encoding,
)

BITS_SIGNED = [(4, True), (8, True), (8, False), (16, True), (16, False)]


def _reference_qdq(x, enc):
    """Quantize+dequantize with ONNX's own reference QuantizeLinear/DequantizeLinear."""
    np_type, onnx_type = storage_type(enc)
    attrs = {"axis": enc.axis} if enc.axis is not None else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs),
    ]
    graph = helper.make_graph(
        nodes, "qdq",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("q", onnx_type, list(x.shape)),
         helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(x.shape))],
        [numpy_helper.from_array(enc.scale.astype(np.float32), "s"),
         numpy_helper.from_array(enc.zero_point.astype(np_type), "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    q, y = ReferenceEvaluator(model).run(None, {"x": x})
    return q.astype(np.int32), y


@pytest.mark.parametrize("bits,signed", BITS_SIGNED)
@pytest.mark.parametrize("symmetric", [True, False])
def test_numerics_match_onnx_reference(bits, signed, symmetric):
    x = np.random.default_rng(bits).normal(0.3, 2.0, (5, 7)).astype(np.float32)
    enc = qparams(float(x.min()), float(x.max()), bits, signed=signed, symmetric=symmetric)
    q_ref, y_ref = _reference_qdq(x, enc)
    np.testing.assert_array_equal(quantize(x, enc), q_ref)
    np.testing.assert_allclose(fake_quant(x, enc), y_ref, rtol=0, atol=1e-6)


def test_per_channel_matches_reference():
    w = np.random.default_rng(0).normal(0, 1, (4, 6)).astype(np.float32) * np.arange(1, 7)
    enc = weight_encoding(w, 8, axis=1, signed=True, symmetric=True)
    assert enc.scale.shape == (6,)
    q_ref, y_ref = _reference_qdq(w, enc)
    np.testing.assert_array_equal(quantize(w, enc), q_ref)
    np.testing.assert_allclose(fake_quant(w, enc), y_ref, atol=1e-6)


def test_zero_is_exact_and_range_includes_zero():
    enc = qparams(2.0, 5.0, 8, signed=False, symmetric=False)  # range widened to [0, 5]
    assert fake_quant(np.array([0.0], np.float32), enc)[0] == 0.0
    lo, hi = enc.range()
    assert lo <= 0.0 and hi >= 5.0 - enc.scale


def test_constant_zero_tensor_gets_valid_scale():
    enc = qparams(0.0, 0.0, 8, signed=False, symmetric=False)
    assert float(enc.scale) > 0
    np.testing.assert_array_equal(fake_quant(np.zeros(3, np.float32), enc), 0.0)


finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(lo=finite, hi=finite, bits=st.sampled_from([4, 8, 16]), signed=st.booleans(),
       symmetric=st.booleans(), data=st.lists(finite, min_size=1, max_size=50))
def test_fake_quant_error_bounded_and_idempotent(lo, hi, bits, signed, symmetric, data):
    lo, hi = min(lo, hi), max(lo, hi)
    enc = qparams(lo, hi, bits, signed=signed, symmetric=symmetric)
    x = np.clip(np.array(data, np.float32), *[float(v) for v in enc.range()])
    y = fake_quant(x, enc)
    # half a step, plus the float32 rounding of values of that size (q * scale + offset
    # is computed in float32: at |x| ~ 700 one ulp is 6e-5, a 16-bit step may be 0.02)
    ulp = np.spacing(np.maximum(np.abs(x), np.abs(y))).astype(np.float64)
    assert np.all(np.abs(x - y) <= float(enc.scale) / 2 * (1 + 1e-5) + 2 * ulp + 1e-7)
    np.testing.assert_array_equal(fake_quant(y, enc), y)


def test_dequantize_inverts_codes():
    enc = qparams(-1.0, 3.0, 8, signed=False, symmetric=False)
    q = np.arange(256, dtype=np.int32)
    np.testing.assert_array_equal(quantize(dequantize(q, enc), enc), q)


def test_sqnr():
    x = np.ones(100, np.float32)
    assert sqnr_db(x, x) == float("inf")
    assert sqnr_db(x, x + 0.1) == pytest.approx(20.0, abs=1e-4)


def test_sqnr_zero_cases_follow_the_table():
    z, one = np.zeros(4), np.ones(4)
    assert sqnr_db(z, z) == float("inf")  # identical
    assert sqnr_db(z, one) == float("-inf")  # reference zero, test not
    assert sqnr_db(one, z) == 0.0  # test zero: noise power = signal power
    assert sqnr_db_from_powers(4.0, 0.0) == float("inf")
    assert sqnr_db_from_powers(0.0, 1.0) == float("-inf")
    assert sqnr_db_from_powers(100.0, 1.0) == pytest.approx(20.0)


def test_row_cosines_zero_rows_and_hand_values():
    ref = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [3.0, 4.0]])
    test = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [3.0, 4.0]])
    cos = row_cosines(ref, test)
    assert cos.dtype == np.float64
    np.testing.assert_array_equal(cos[[0, 1, 2, 4]], [1.0, 0.0, 0.0, 1.0])
    assert cos[3] == pytest.approx(1 / np.sqrt(2))


def test_row_cosines_flatten_trailing_axes_and_check_shapes():
    ref = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    cos = row_cosines(ref, -ref)
    assert cos.shape == (2,)
    assert cos[1] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="shapes differ"):
        row_cosines(ref, ref[:1])
