"""Shapes ONNX inference leaves unknown (a head count computed by Shape/Gather/Concat, as in
minilm-l6's export) are completed by onnxruntime's symbolic shape inference: the cost model
counts every head's attention MACs, not one head's."""

import numpy as np
import onnx
from onnx import numpy_helper, parser

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.model.shapes import resolve_shapes, seq_len_shapes
from quantscope.plan.cost import cost_breakdown
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

HEADS, D = 4, 8
W = HEADS * D


def _computed_heads() -> onnx.ModelProto:
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    enc (int64[N, S] input_ids, float[M, 1, {W}] extra) => (float[N, S, {W}] y) {{
        e0 = Gather (table, input_ids)
        e = Add (e0, extra)
        q = MatMul (e, wq)
        sh = Shape (q)
        i0 = Constant <value = int64 {{0}}> ()
        i1 = Constant <value = int64 {{1}}> ()
        b0 = Gather <axis = 0> (sh, i0)
        s0 = Gather <axis = 0> (sh, i1)
        ax = Constant <value = int64[1] {{0}}> ()
        b = Unsqueeze (b0, ax)
        s = Unsqueeze (s0, ax)
        rest = Constant <value = int64[2] {{-1, {D}}}> ()
        target = Concat <axis = 0> (b, s, rest)
        qr = Reshape (q, target)
        qh = Transpose <perm = [0, 2, 1, 3]> (qr)
        kt = Transpose <perm = [0, 2, 3, 1]> (qr)
        sc = MatMul (qh, kt)
        p = Softmax <axis = -1> (sc)
        c = MatMul (p, qh)
        ct = Transpose <perm = [0, 2, 1, 3]> (c)
        flat = Constant <value = int64[3] {{0, 0, {W}}}> ()
        y = Reshape (ct, flat)
    }}
    """
    model = parser.parse_model(text)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.normal(0, 1, (50, W)).astype(np.float32), "table"),
        numpy_helper.from_array(rng.normal(0, 0.3, (W, W)).astype(np.float32), "wq")])
    onnx.checker.check_model(model)
    return model


def test_a_computed_head_count_is_resolved_and_costed():
    model = load_proto(_computed_heads())
    shapes = resolve_shapes(model, seq_len_shapes(model, 16))  # 'extra' keeps M: batch unknown
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    assert shapes[softmax.output[0]][1:] == (HEADS, 16, 16)
    costs = cost_breakdown(Plan.uniform(Precision.A8_W8), find_groups(model),
                           load_target("hailo10h"), seq_len_shapes(model, 16), model=model)
    scores = next(n for n in model.graph.node if n.op_type == "MatMul"
                  and n.input[0] == "qh").name
    assert costs[scores] == HEADS * 16 * 16 * D  # every head's MACs
