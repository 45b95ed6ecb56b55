"""An anchor-free grid head written undecoded (YOLOX, ddddocr's ``common_det.onnx``):
``output [N, A, 4 + 1 + C]``, per anchor x, y offsets in grid cells, log w, log h, then an
objectness and class scores after a Sigmoid; the host adds each cell's column and row and
multiplies by its stride. ``--layout OUT=detect:grid=8/16/32`` decodes the boxes as that
host does (:func:`decode_grid`); :func:`grid_head_hint` names the layout when the graph
shows such a head and no ``--layout`` reads it.

A head that writes box *distributions* (DFL: PicoDet, NanoDet-Plus, YOLOv8 undecoded:
``4 x bins`` logits per anchor, a side's distance the softmax's expectation over the bins
in strides) is decoded by ``dfl=BINS`` on the same grid (:func:`decode_dfl`); a grid's
levels are the input's H and W over each stride (:func:`level_shape`, a non-square input's
too), and :func:`dfl_head_hint` names the pooled layout of such a head's level outputs.

==================  ============================================================
``grid_option``     ``grid=8/16/32`` read and checked against the output's anchors
``level_shape``     a level's rows x columns from the input's H, W and its stride
``grid_cells``      each anchor's (column, row, stride), level by level, row by row
``decode_grid``     raw ``[N, A, 4]`` rows -> cx, cy, w, h in input pixels
``decode_dfl``      box distributions ``[N, A, 4 x bins]`` -> x1, y1, x2, y2 px
``grid_head_hint``  one note per output made like such a head, naming the layout
``dfl_head_hint``   one note naming the ``dfl=`` layout of a DFL head's level outputs
==================  ============================================================
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscope.model.load import Model
from quantscope.tasks.unscored import MARK as UNSCORED
from quantscope.types import QuantscopeError

_THROUGH = ("Reshape", "Transpose", "Flatten", "Identity")


def grid_option(text: str | None, box_format: str | None, anchors: int | None,
                size: tuple[int, int] | None = None, dfl: int | None = None
                ) -> tuple[int, ...]:
    """``grid=8/16/32`` -> (8, 16, 32): the strides of an anchor-free head's levels,
    checked against the output's ``anchors`` (None: not known yet) on the grid of an input
    of ``size`` (H, W; None: a square input's). ``dfl``: the boxes are distributions
    (:func:`decode_dfl`), given as ``xyxy`` sides, not YOLOX's ``cxcywh``."""
    if text is None:
        return ()
    try:
        strides = tuple(int(v) for v in text.split("/"))
    except ValueError:
        strides = ()
    if not strides or min(strides) < 1:
        raise QuantscopeError(f"grid={text}: give the head's strides as whole numbers with '/' "
                              "between them (YOLOX: grid=8/16/32)")
    if dfl is None and (box_format or "cxcywh").lower() != "cxcywh":
        raise QuantscopeError("grid= decodes x, y, log w, log h rows (cxcywh): drop format=")
    if dfl is not None and box_format is not None and box_format.lower() != "xyxy":
        raise QuantscopeError(f"dfl={dfl} decodes distances to the 4 sides into x1, y1, x2, y2 "
                              "boxes: drop format=")
    if anchors is not None:
        grid_cells(strides, anchors, size)
    return strides


def level_shape(stride: int, size: tuple[int, int]) -> tuple[int, int]:
    """The rows and columns of a level of ``stride`` on an input of ``size`` (H, W): the
    cells the host's ``arange(H / stride)`` makes (PicoDet's 800 x 608 input at stride 64:
    13 x 10)."""
    return -(-size[0] // stride), -(-size[1] // stride)


def _square(strides: tuple[int, ...], anchors: int) -> tuple[int, int]:
    side = round(np.sqrt(anchors / sum(1 / s**2 for s in strides)))
    if sum((side // s) ** 2 for s in strides) != anchors or any(side % s for s in strides):
        raise QuantscopeError(f"grid={'/'.join(map(str, strides))}: {anchors} anchors are no "
                              "square input's grid of those strides: give the head's strides "
                              "(a non-square input's grid is read from the model's image "
                              "input: give its H and W, --input-shape)")
    return side, side


def grid_cells(strides: tuple[int, ...], anchors: int, size: tuple[int, int] | None = None
               ) -> np.ndarray:
    """The ``[A, 3]`` (column, row, stride) of each anchor of a grid head, level by level,
    row by row (YOLOX's and PicoDet's order: ``3549`` anchors are a 416 px input's 52²,
    26², 13²). ``size``: the input's (H, W), each level :func:`level_shape`; None: a
    square input's, refused when none gives ``anchors``."""
    size = size or _square(strides, anchors)
    shapes = [level_shape(s, size) for s in strides]
    if sum(r * c for r, c in shapes) != anchors:
        cells = " + ".join(f"{r}x{c}" for r, c in shapes)
        raise QuantscopeError(f"grid={'/'.join(map(str, strides))}: {anchors} anchors are not "
                              f"the grid of a {size[0]}x{size[1]} input on those strides "
                              f"({cells} cells): give the head's strides, one per level")
    cells = []
    for s, (h, w) in zip(strides, shapes, strict=True):
        rows, cols = np.divmod(np.arange(h * w), w)
        cells.append(np.stack([cols, rows, np.full(h * w, s)], axis=1))
    return np.concatenate(cells).astype(np.float64)


def decode_grid(boxes: np.ndarray, strides: tuple[int, ...],
                size: tuple[int, int] | None = None) -> np.ndarray:
    """Raw grid offsets ``[N, A, 4]`` (x, y in cells, log w, log h) -> cx, cy, w, h px."""
    cells = grid_cells(strides, boxes.shape[1], size)
    xy = (boxes[..., :2] + cells[:, :2]) * cells[:, 2:]
    wh = np.exp(np.minimum(boxes[..., 2:], 30.0)) * cells[:, 2:]
    return np.concatenate([xy, wh], axis=-1)


def decode_dfl(rows: np.ndarray, strides: tuple[int, ...], bins: int, centre: float,
               size: tuple[int, int] | None = None) -> np.ndarray:
    """Box distributions ``[N, A, 4 * bins]`` (left, top, right, bottom, ``bins`` logits
    each) -> x1, y1, x2, y2 px, as PicoDet's, NanoDet-Plus' and YOLOv8's hosts do: a side's
    distance is ``sum(softmax(bins) * arange(bins)) * stride`` from the cell's point
    ``(col + centre, row + centre) * stride`` (``centre`` 0.5: PicoDet, YOLOv8; 0:
    NanoDet-Plus)."""
    cells = grid_cells(strides, rows.shape[1], size)
    logits = rows.reshape(*rows.shape[:2], 4, bins)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    dist = (e / e.sum(axis=-1, keepdims=True)) @ np.arange(bins, dtype=np.float64)
    stride = cells[:, 2:]
    point = (cells[:, :2] + centre) * stride
    return np.concatenate([point - dist[..., :2] * stride, point + dist[..., 2:] * stride],
                          axis=-1)


def _producer(model: Model, tensor: str) -> onnx.NodeProto | None:
    return next((n for n in model.graph.node if tensor in n.output), None)


def _level(model: Model, tensor: str) -> tuple[int, int, bool] | None:
    """(score rows, level height, whether an objectness channel of its own follows the
    boxes) of a level's ``Concat`` on axis 1 (reached through reshapes) of 4 box channels
    no Sigmoid makes, then Sigmoid channels; None otherwise."""
    node = _producer(model, tensor)
    while node is not None and node.op_type in _THROUGH:
        node = _producer(model, node.input[0])
    shapes = model.value_shapes()
    if node is None or node.op_type != "Concat" or len(node.input) < 2:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    dims = [shapes.get(i) or () for i in node.input]
    if axis != 1 or any(len(d) != 4 for d in dims) or dims[0][1] != 4:
        return None
    made = [_producer(model, i) for i in node.input]
    if (made[0] is not None and made[0].op_type == "Sigmoid") or not all(
            m is not None and m.op_type == "Sigmoid" for m in made[1:]):
        return None
    rows = sum(d[1] for d in dims[1:]) if all(isinstance(d[1], int) for d in dims) else None
    h = dims[0][2]
    obj = len(dims) >= 3 and dims[1][1] == 1  # YOLOX: boxes, objectness, classes
    return (rows, h, obj) if isinstance(rows, int) and isinstance(h, int) else None


def grid_head_hint(model: Model, taken: set[str]) -> list[str]:
    """A note per rank-3 output no task reads that a graph makes like a YOLOX head: a
    ``Concat`` of levels (:func:`_level`), maybe moved anchors-first by a ``Transpose``;
    the strides from the input's height over each level's."""
    shapes, notes = model.value_shapes(), []
    heights = [s[2] for k in model.input_names() if len(s := shapes.get(k) or ()) == 4
               and isinstance(s[2], int)]
    for out in model.output_names():
        shape = shapes.get(out) or ()
        node = _producer(model, out)
        if out in taken or len(shape) != 3 or node is None or len(heights) != 1:
            continue
        row_axis = 1
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [])
            if perm != [0, 2, 1]:
                continue
            row_axis, node = 2, _producer(model, node.input[0])
        if node is None or node.op_type != "Concat":
            continue
        levels = [_level(model, i) for i in node.input]
        if not levels or None in levels or len({lv[0] for lv in levels if lv}) != 1:
            continue
        strides = tuple(heights[0] // lv[1] for lv in levels if lv and lv[1])
        obj = ",obj=4" if levels[0] and levels[0][2] else ""
        notes.append(
            f"output '{out}' [{', '.join(str(d) for d in shape)}] is made like a YOLOX head "
            f"(on {len(levels)} level(s), 4 box rows no Sigmoid makes, then Sigmoid score "
            "rows; its boxes undecoded grid offsets): scored for fidelity only; to score its "
            f"detections declare --layout {out}=detect:axis={row_axis}{obj},"
            f"grid={'/'.join(map(str, strides))}")
    return notes


def _dfl_pairs(model: Model, size: tuple[int, int]) -> list[tuple[int, str, str, int]]:
    """(stride, box output, score output, bins) of each level a graph shows like a DFL
    head's: a rank-3 float output ``[N, A, 4 x bins]`` (4 to 32 bins) beside one of the
    same anchors and fewer, other rows, ``A`` the cells of the input's grid at a stride."""
    shapes, types, found = model.value_shapes(), model.value_types(), []
    outs = [o for o in model.output_names() if types.get(o) == onnx.TensorProto.FLOAT and len(shapes.get(o) or ()) == 3
            and all(isinstance(d, int) for d in (shapes.get(o) or ())[1:])]
    for box in outs:
        a, rows = shapes[box][1:]
        stride = next((s for s in _STRIDES if np.prod(level_shape(s, size)) == a), None)
        if stride is None or rows % 4 or not 4 <= rows // 4 <= 32:
            continue
        scores = [o for o in outs if o != box and shapes[o][1] == a and shapes[o][2] < rows]
        if len(scores) == 1:
            found.append((stride, box, scores[0], rows // 4))
    return sorted(found)


_STRIDES = (4, 8, 16, 32, 64, 128)


def dfl_head_hint(model: Model, taken: set[str], size: tuple[int, int] | None
                  ) -> tuple[list[str], set[str]]:
    """The note naming the pooled ``dfl=`` layout of outputs made like a DFL head's levels
    (:func:`_dfl_pairs`; PicoDet's ``[1, 7600, 32]`` box distributions beside ``[1, 7600,
    10]`` class scores on an 800 x 608 input), and the outputs it names (no other hint
    then calls them an SSD's). Nothing is read as detections without being declared; with
    some of the levels read by a task (``taken``, declared level by level) no pooled layout
    is named: the others are said to be fidelity-only by the unscored note."""
    pairs = _dfl_pairs(model, size) if size is not None else []
    if not pairs or len({p[3] for p in pairs}) != 1 or len({p[0] for p in pairs}) != len(pairs):
        return [], set()
    boxes, scores = [p[1] for p in pairs], [p[2] for p in pairs]
    if taken & {*boxes, *scores}:
        return [], {*boxes, *scores} - taken
    levels = f",levels={'+'.join(boxes[1:])}" if len(boxes) > 1 else ""
    strides = "/".join(str(p[0]) for p in pairs)
    note = (f"outputs {', '.join(repr(b) for b in boxes)} hold 4 x {pairs[0][3]} rows per anchor "
            f"beside the class scores of {', '.join(repr(s) for s in scores)}, on the cells of "
            f"a {size[0]}x{size[1]} input at strides {strides}: if they are box distributions "
            f"(DFL: PicoDet, NanoDet-Plus, YOLOv8 undecoded), --layout {boxes[0]}=detect:axis=2,"
            f"dfl={pairs[0][3]},grid={strides}{levels},scores_from={'+'.join(scores)} scores "
            "them as one detector (centre=0 for NanoDet-Plus' cell corners; threshold= the "
            f"host's); they are {UNSCORED} now")
    return [note], set(boxes) | set(scores)
