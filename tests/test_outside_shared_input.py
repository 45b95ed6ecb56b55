"""An input with no sample axis (a rank-0 sample rate, as in streaming audio exports):
every batch gets it whole; it neither counts nor cuts samples."""

from __future__ import annotations

import numpy as np
import onnx
from tiny_models import _rng, _with_weights

from quantscope import stages
from quantscope.cli import main
from quantscope.types import SHARED, batch_rows, concat_rows, take_rows


def rate_scaled(seed: int = 21) -> onnx.ModelProto:
    """``x [N, 16]`` scaled by ``sr / 16000`` (``sr``: an int64 scalar), then a Linear."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    rated (float[N, 16] x, int64 sr) => (float[N, 4] y) {
        f = Cast <to = 1> (sr)
        g = Div (f, base)
        xs = Mul (x, g)
        h = MatMul (xs, w)
        y = Add (h, b)
    }
    """
    return _with_weights(text, {
        "base": np.array(16000.0, np.float32),
        "w": r.normal(0, 0.4, (16, 4)).astype(np.float32),
        "b": r.normal(0, 0.1, 4).astype(np.float32),
    })


def _data(tmp_path, n: int = 40):
    onnx.save(rate_scaled(), tmp_path / "m.onnx")
    x = np.random.default_rng(0).normal(0, 1, (n, 16)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x, sr=np.array(16000, np.int64))
    return tmp_path / "m.onnx", tmp_path / "d.npz", x


def test_a_rank0_input_is_given_whole_to_every_batch(tmp_path):
    m, d, x = _data(tmp_path)
    model = stages.open_model(str(m))
    ds = stages.open_data(str(d), model)
    assert [batch_rows(b) for b in ds.calibration] == [32, 8]
    assert all(b["sr"].shape == () and int(b["sr"]) == 16000 for b in ds.calibration)
    assert getattr(ds.calibration[0], "axes", {}).get("sr") == SHARED
    assert any("'sr' has no sample axis" in n for n in ds.notes)
    joined = concat_rows(list(ds.calibration))
    assert batch_rows(joined) == 40 and joined["sr"].shape == ()
    np.testing.assert_array_equal(joined["x"], x)
    part = take_rows(joined, slice(3, 7))
    assert batch_rows(part) == 4 and part["sr"].shape == ()


def test_calibrate_evaluate_and_analyze_run_on_it(tmp_path, capsys):
    m, d, _ = _data(tmp_path)
    assert main(["calibrate", str(m), "--data", str(d), "--out", str(tmp_path / "s.npz")]) == 0
    assert main(["evaluate", str(m), "--data", str(d), "--stats", str(tmp_path / "s.npz"),
                 "--precision", "a8_w8", "--json", str(tmp_path / "r.json")]) == 0
    assert main(["analyze", str(m), "--data", str(d), "--stats", str(tmp_path / "s.npz"),
                 "--target", "hailo8", "--out", str(tmp_path / "a.json")]) == 0
    assert "sqnr_db" in capsys.readouterr().out


def state_primed(seed: int = 22) -> onnx.ModelProto:
    """``x [T, 16]`` (T chunks, symbolic) plus a static initial state ``h [1, 8]`` that every
    chunk adds (as faster-whisper's silero_vad_v6.onnx takes ``h, c [1, 1, 128]``)."""
    r = _rng(seed)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    primed (float[T, 16] x, float[1, 8] h) => (float[T, 8] y) {
        m = MatMul (x, w)
        y = Add (m, h)
    }
    """
    return _with_weights(text, {"w": r.normal(0, 0.4, (16, 8)).astype(np.float32)})


def test_a_static_state_beside_sampled_inputs_is_shared(tmp_path):
    onnx.save(state_primed(), tmp_path / "p.onnx")
    h = np.full((1, 8), 0.5, np.float32)
    np.savez(tmp_path / "p.npz", x=np.ones((40, 16), np.float32), h=h)
    model = stages.open_model(str(tmp_path / "p.onnx"))
    ds = stages.open_data(str(tmp_path / "p.npz"), model)
    assert [batch_rows(b) for b in ds.calibration] == [32, 8]
    assert all(np.array_equal(b["h"], h) for b in ds.calibration)
    assert any("'h' has no sample axis" in n for n in ds.notes)
