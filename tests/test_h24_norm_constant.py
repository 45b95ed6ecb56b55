"""An output that depends on no input up to float32 rounding (h24): the spatial mean of an
InstanceNormalization's output is its bias B on every sample, whatever the image; the
sums' order moves it by an ulp. It read '96.6 dB' at uniform a8_w8 plus one promotion,
never 'the same on every sample'."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.cli import main
from quantscope.numerics import SameSamples


def _instance_norm_pool() -> onnx.ModelProto:
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(r.uniform(0.5, 1.5, 4).astype(np.float32), "s"),
             numpy_helper.from_array(r.normal(0, 0.3, 4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "axes")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("InstanceNormalization", ["c", "s", "b"], ["n"], name="inorm"),
             helper.make_node("ReduceMean", ["n", "axes"], ["y"], keepdims=0, name="pool")]
    g = helper.make_graph(nodes, "in", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_an_output_equal_up_to_rounding_is_the_same_on_every_sample(tmp_path, capsys):
    m, x, s = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "s.npz"
    onnx.save(_instance_norm_pool(), m)
    np.save(x, np.random.default_rng(1).normal(0, 1, (16, 3, 8, 8)).astype(np.float32))
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "('y') is the same on every sample of the calibration data" in err, err
    assert not s.exists()


def test_alike_within_rounding_but_not_a_small_channel_that_moves():
    same = SameSamples()
    base = np.array([[0.3194, -0.2622, 1000.0]], np.float32)
    same.add(np.concatenate([base, base + np.float32(6e-8) * np.array([[1, -1, 0]], np.float32)]))
    assert same.constant
    moving = SameSamples()  # a channel of 1e-3 beside one of 1000 moves by its own size
    moving.add(np.array([[1000.0, 0.001], [1000.0, -0.001]], np.float32))
    assert not moving.constant
    ints = SameSamples()
    ints.add(np.array([3, 4]))
    assert not ints.constant


def test_same_samples_takes_an_inf_equal_to_itself_without_a_warning():
    """inf - inf is NaN: the rounding tolerance alone called a constant inf output varying
    (and numpy warned, in the suite's output); an equal inf is the same value."""
    import warnings

    from quantscope.numerics import SameSamples

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = SameSamples()
        same.add(np.array([[np.inf, 1.0], [np.inf, 1.0]], np.float32))
        assert same.constant
        other = SameSamples()
        other.add(np.array([[np.inf, 1.0], [-np.inf, 1.0]], np.float32))
        assert not other.constant
