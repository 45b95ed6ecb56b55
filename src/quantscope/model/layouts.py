"""Weighted ops' weight layouts, in one place.

Every repair, analysis and encoding that reads a weight's channels asks :func:`layout_of`
instead of testing ``op_type`` itself (a ConvTranspose read as a Conv crashed the default
``bias`` repair on every U-Net, FPN and DB head).

===================  ======================  ======  =====  ===========  =================
op                   weight                  out     in     bias input   data channel axis
                                             axis    axis                (input, output)
===================  ======================  ======  =====  ===========  =================
Conv                 ``[out, in/g, k…]``     0       1      2            1, 1
ConvTranspose        ``[in, out/g, k…]``     1       0      2            1, 1
Gemm                 ``[in, out]``           1       0      2            -1 (0 if transA), -1
Gemm ``transB=1``    ``[out, in]``           0       1      2            as above
MatMul (2-D weight)  ``[in, out]``           1       0      none (Add)   -1, -1
MatMul (N-D weight)  ``[…, in, out]``        -1      -2     none (Add)   -1, -1
===================  ======================  ======  =====  ===========  =================

With ``group`` g > 1 (Conv, ConvTranspose) the weight's channel axes hold ``in/g`` (Conv)
or ``out/g`` (ConvTranspose) entries: :func:`in_out_matrix` expands it to the full
block-diagonal ``[in, out]`` map, so a per-channel computation stays exact for grouped and
depthwise convolutions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(onnx.helper.get_attribute_value(a))
    return default


@dataclass(frozen=True)
class WeightLayout:
    """Where the channels are in one weighted op's weight, data and bias."""

    op_type: str
    weight: str  # the weight tensor's name (input 1)
    out_axis: int  # output-channel axis of the weight (negative: from the end)
    in_axis: int  # input-channel axis of the weight
    bias_index: int | None  # the node input that holds the bias (None: MatMul, an Add after)
    group: int = 1  # Conv / ConvTranspose ``group``
    data_axis: int = -1  # channel axis of the data input (input 0)
    output_axis: int = -1  # channel axis of the node's output

    @property
    def is_conv(self) -> bool:
        return self.op_type in ("Conv", "ConvTranspose")

    def bias_of(self, node: onnx.NodeProto) -> str | None:
        """The bias input's name, if the node has one."""
        i = self.bias_index
        return node.input[i] if i is not None and len(node.input) > i and node.input[i] else None


def layout_of(node: onnx.NodeProto) -> WeightLayout | None:
    """The weight layout of ``node`` (None: not a weighted op, or a form not understood)."""
    if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or not node.input[1]:
        return None
    w = node.input[1]
    if node.op_type == "Conv":
        return WeightLayout("Conv", w, 0, 1, 2, _attr(node, "group", 1), 1, 1)
    if node.op_type == "ConvTranspose":
        return WeightLayout("ConvTranspose", w, 1, 0, 2, _attr(node, "group", 1), 1, 1)
    if node.op_type == "Gemm":
        t_b = bool(_attr(node, "transB", 0))
        data = 0 if _attr(node, "transA", 0) else -1
        return WeightLayout("Gemm", w, 0 if t_b else 1, 1 if t_b else 0, 2, 1, data, -1)
    return WeightLayout("MatMul", w, -1, -2, None, 1, -1, -1)


def in_out_matrix(w: np.ndarray, lay: WeightLayout) -> np.ndarray:
    """The weight as the ``[in, out]`` map of its data's channels (kernels summed; grouped
    convolutions expanded block-diagonally). ``mean_x @ in_out_matrix(dW)`` is the mean shift
    of each output channel (exact for a Conv away from zero padding)."""
    if not lay.is_conv:
        if w.ndim != 2:
            raise ValueError(f"{lay.op_type} weight of rank {w.ndim}: no single [in, out] map")
        return w if lay.out_axis in (1, -1) else w.T
    k = w.reshape(w.shape[0], w.shape[1], -1).sum(axis=2)
    g = lay.group
    if lay.op_type == "Conv":  # [out, in/g]
        out_ch, in_g = k.shape
        out_g, in_ch = out_ch // g, in_g * g
        full = np.zeros((in_ch, out_ch), k.dtype)
        for j in range(g):
            full[j * in_g:(j + 1) * in_g, j * out_g:(j + 1) * out_g] = \
                k[j * out_g:(j + 1) * out_g].T
        return full
    in_ch, out_g = k.shape  # ConvTranspose: [in, out/g]
    in_g, out_ch = in_ch // g, out_g * g
    full = np.zeros((in_ch, out_ch), k.dtype)
    for j in range(g):
        full[j * in_g:(j + 1) * in_g, j * out_g:(j + 1) * out_g] = k[j * in_g:(j + 1) * in_g]
    return full


def output_channels(w: np.ndarray, lay: WeightLayout) -> int:
    """How many output channels the op has (a grouped ConvTranspose: ``out/g * g``)."""
    n = w.shape[lay.out_axis]
    return n * lay.group if lay.op_type == "ConvTranspose" else n
