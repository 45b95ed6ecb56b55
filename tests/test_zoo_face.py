"""dlib-face: the numpy .dat parser, the ONNX graph, and the port against dlib itself."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from quantscope.types import QuantscopeError
from quantscope.zoo import face

pytest.importorskip("face_recognition_models")


@pytest.fixture(scope="module")
def dat_path() -> Path:
    return face.dlib_dat_path()


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory, dat_path) -> Path:
    return face.build_dlib_face(tmp_path_factory.mktemp("cache"), dat_path=dat_path)


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def test_graph_is_a_plain_cnn(onnx_path):
    model = onnx.load(str(onnx_path))
    ops = collections.Counter(n.op_type for n in model.graph.node)
    assert ops["Conv"] == 29 and ops["Gemm"] == 1 and ops["Add"] == 14
    assert set(ops) <= {"Conv", "Relu", "MaxPool", "AveragePool", "Pad", "Add",
                        "GlobalAveragePool", "Flatten", "Gemm"}  # fmt: skip
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer if "pads" not in t.name)
    assert params == 5_607_488
    props = {p.key: p.value for p in model.metadata_props}
    assert "256" in props["quantscope.preprocess"]


def test_build_is_cached_and_leaves_no_temp_files(onnx_path, dat_path):
    mtime = onnx_path.stat().st_mtime_ns
    again = face.build_dlib_face(onnx_path.parent, dat_path=dat_path)
    assert again == onnx_path and again.stat().st_mtime_ns == mtime
    assert [p.name for p in onnx_path.parent.iterdir()] == [face.ONNX_NAME]
    # readable as an ordinary file (mkstemp's 0600 was kept: h38 found it in the cache)
    import os

    umask = os.umask(0)
    os.umask(umask)
    assert onnx_path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_port_matches_dlib_descriptor(onnx_path, dat_path):
    dlib = pytest.importorskip("dlib")
    from quantscope.tasks.faces import load_builtin_faces

    chips = load_builtin_faces().chips[::3]  # 48 chips: every variant kind represented
    rec = dlib.face_recognition_model_v1(str(dat_path))
    ref = np.array([np.array(rec.compute_face_descriptor(c)) for c in chips])
    out = _session(onnx_path).run(None, {"image": face.preprocess_face(chips)})[0]
    assert out.shape == (len(chips), face.EMBED_DIM)
    assert np.abs(out - ref).max() < 1e-5


def test_preprocess_matches_dlib_formula():
    chip = np.zeros((150, 150, 3), np.uint8)
    chip[..., 0], chip[..., 1], chip[..., 2] = 255, 0, 100
    x = face.preprocess_face(chip)
    assert x.shape == (1, 3, 150, 150) and x.dtype == np.float32
    expect = (np.array([255, 0, 100]) - np.array(face.MEAN_RGB)) / 256
    assert np.allclose(x[0, :, 7, 9], expect, atol=1e-6)


@pytest.mark.parametrize(
    "bad", [np.zeros((150, 150, 3), np.float32), np.zeros((112, 112, 3), np.uint8)]
)
def test_preprocess_rejects_wrong_input(bad):
    with pytest.raises(QuantscopeError, match="uint8"):
        face.preprocess_face(bad)


def _one_line_error(path: Path) -> str:
    with pytest.raises(QuantscopeError) as info:
        face.dlib_net_to_onnx(face.parse_dlib_dat(path))
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("keep", [0, 3, 40, 400, 20_000, 5_000_000, -100])
def test_truncated_dat_gives_one_line_error(tmp_path, dat_path, keep):
    data = dat_path.read_bytes()
    bad = tmp_path / "cut.dat"
    bad.write_bytes(data[:keep])
    assert _one_line_error(bad)


def test_missing_head_layers_are_detected(tmp_path, dat_path):
    data = dat_path.read_bytes()
    bad = tmp_path / "no_fc.dat"
    bad.write_bytes(data[: data.rindex(b"\x01\x04fc_2")])  # file cut at a layer boundary
    assert "layout" in _one_line_error(bad)


def test_corrupted_layer_name_is_reported(tmp_path, dat_path):
    data = bytearray(dat_path.read_bytes())
    at = data.index(b"con_4")
    data[at : at + 5] = b"con_9"
    bad = tmp_path / "renamed.dat"
    bad.write_bytes(bytes(data))
    assert "con_9" in _one_line_error(bad)


def test_missing_file_is_a_quantscope_error(tmp_path):
    with pytest.raises(QuantscopeError, match="cannot read"):
        face.parse_dlib_dat(tmp_path / "nope.dat")


def test_registry_builder_writes_a_valid_model(tmp_path):
    dest = tmp_path / "dlib-face.v1.onnx"
    face.write_dlib_face(dest)
    onnx.checker.check_model(onnx.load(str(dest)))
