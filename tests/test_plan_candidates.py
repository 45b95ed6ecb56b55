"""Rule-made candidate plans: the Linear families read from the graph, the max-legal plan,
its family variants, and `plan --max-legal --variants` writing them for `buckets`."""

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, parser

from quantscope.cli import main
from quantscope.model.families import linear_families
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.model.shapes import given_shapes
from quantscope.plan.candidates import max_legal, variants
from quantscope.plan.check import check
from quantscope.targets import load_target
from quantscope.types import Precision

W, HEADS, D, SEQ = 8, 2, 4, 6


def _block(decomposed: bool = False) -> onnx.ModelProto:
    """One BERT-like block: Q/K/V, heads, masked Softmax, context, output, LayerNorm, an
    erf-GELU FFN (up, down) and the residual Adds; ``decomposed``: the Softmax written out
    as ``Exp(x - ReduceMax(x)) / ReduceSum`` (as the rowscale rewrite writes it)."""
    softmax = ("        ax = Constant <value = int64[1] {-1}> ()\n"
               "        mx = ReduceMax <keepdims = 1> (ss, ax)\n"
               "        sh = Sub (ss, mx)\n"
               "        ex = Exp (sh)\n"
               "        z = ReduceSum <keepdims = 1> (ex, ax)\n"
               "        p = Div (ex, z)\n") if decomposed else \
        "        p = Softmax <axis = -1> (ss)\n"
    text = f"""
    <ir_version: 9, opset_import: ["" : 18]>
    blk (float[N, S, {W}] x) => (float[N, S, {W}] y) {{
        q0 = MatMul (x, wq)
        q = Add (q0, bq)
        k0 = MatMul (x, wk)
        k = Add (k0, bk)
        v0 = MatMul (x, wv)
        v = Add (v0, bv)
        qr = Reshape (q, hshape)
        qh = Transpose <perm = [0, 2, 1, 3]> (qr)
        kr = Reshape (k, hshape)
        kt = Transpose <perm = [0, 2, 3, 1]> (kr)
        vr = Reshape (v, hshape)
        vh = Transpose <perm = [0, 2, 1, 3]> (vr)
        s = MatMul (qh, kt)
        ss = Div (s, scale)
{softmax}        c = MatMul (p, vh)
        ct = Transpose <perm = [0, 2, 1, 3]> (c)
        cr = Reshape (ct, tshape)
        o0 = MatMul (cr, wo)
        o = Add (o0, bo)
        r1 = Add (x, o)
        n1 = LayerNormalization <axis = -1> (r1, g1, b1)
        u0 = MatMul (n1, wu)
        u = Add (u0, bu)
        ud = Div (u, sqrt2)
        ue = Erf (ud)
        up1 = Add (ue, one)
        um = Mul (u, up1)
        ug = Mul (um, half)
        d0 = MatMul (ug, wd)
        d = Add (d0, bd)
        r2 = Add (n1, d)
        y = LayerNormalization <axis = -1> (r2, g2, b2)
    }}
    """
    rng = np.random.default_rng(0)
    w = {n: rng.normal(0, 0.3, (W, W)) for n in ("wq", "wk", "wv", "wo")}
    w |= {"wu": rng.normal(0, 0.3, (W, 2 * W)), "wd": rng.normal(0, 0.3, (2 * W, W))}
    w |= {n: rng.normal(0, 0.1, W) for n in ("bq", "bk", "bv", "bo", "bd", "b1", "b2")}
    w |= {"bu": rng.normal(0, 0.1, 2 * W), "g1": np.ones(W), "g2": np.ones(W),
          "scale": np.array(np.sqrt(D)), "sqrt2": np.array(np.sqrt(2.0)),
          "one": np.array(1.0), "half": np.array(0.5)}
    model = parser.parse_model(text)
    model.graph.initializer.extend(
        numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items())
    model.graph.initializer.extend([
        numpy_helper.from_array(np.array([0, 0, HEADS, D], np.int64), "hshape"),
        numpy_helper.from_array(np.array([0, 0, W], np.int64), "tshape")])
    onnx.checker.check_model(model)
    return model


def _weight_of(model, groups) -> dict[str, str]:
    """Group name -> its weight initializer (the test's own names for the Linears)."""
    return {g.name: g.weight for g in groups.groups if g.weight}


@pytest.mark.parametrize("decomposed", [False, True])
def test_families_are_read_from_the_graph_not_the_names(decomposed):
    model = load_proto(_block(decomposed))
    fams = linear_families(model)
    by_weight = {_weight_of(model, find_groups(model))[g]: f for g, f in fams.items()}
    assert by_weight == {"wq": "qk", "wk": "qk", "wv": "v", "wo": "ao", "wu": "up", "wd": "down"}
    renamed = _block(decomposed)  # the same graph with meaningless node names
    for i, node in enumerate(renamed.graph.node):
        node.name = f"n{(i * 7) % 101}"
    model2 = load_proto(renamed)
    fams2 = linear_families(model2)
    by_weight2 = {_weight_of(model2, find_groups(model2))[g]: f for g, f in fams2.items()}
    assert by_weight2 == by_weight


def test_max_legal_demotes_only_what_the_target_refuses():
    model = load_proto(_block())
    target = load_target("hailo10h")
    shapes = given_shapes(model, None, (("x", (1, SEQ, W)),))
    base = max_legal(model, target, shapes)
    groups = find_groups(model)
    assert not [p for p in check(base.plan, groups, model, target, shapes=shapes)
                if p.severity == "error"]
    demoted = {g for g, p in base.plan.overrides if p == Precision.A8_W8}
    ops = {g.name: g.op_type for g in groups.groups}
    # hailo.attention_16bit: the Softmax and the two attention MatMuls; nothing else
    assert sorted(ops[g] for g in demoted) == ["MatMul", "MatMul", "Softmax"]
    assert base.plan.default == Precision.A16_W16
    # on the reference target nothing is refused: every group stays at a16_w16
    ort = max_legal(model, load_target("ort-cpu"), shapes)
    assert ort.plan.overrides == ()


def test_variants_put_whole_families_back_at_8_bit():
    model = load_proto(_block())
    target = load_target("hailo10h")
    shapes = given_shapes(model, None, (("x", (1, SEQ, W)),))
    base = max_legal(model, target, shapes)
    made, notes = variants(model, target, shapes, base)
    weights = _weight_of(model, find_groups(model))
    low = {c.name: sorted(weights[g] for g, p in c.plan.overrides
                          if p == Precision.A8_W8 and g in weights) for c in made}
    assert low == {"noqk": ["wk", "wq"], "noqkv": ["wk", "wq", "wv"],
                   "noqkvao": ["wk", "wo", "wq", "wv"],
                   "onlyup": ["wd", "wk", "wo", "wq", "wv"],
                   "nolin": ["wd", "wk", "wo", "wq", "wu", "wv"]}
    assert notes == ()


def test_plan_max_legal_variants_writes_a_candidates_file(tmp_path, capsys):
    m = tmp_path / "blk.onnx"
    onnx.save(_block(), m)
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).normal(0, 1, (8, SEQ, W)).astype(np.float32))
    s = tmp_path / "s.npz"
    assert main(["calibrate", str(m), "--data", str(x), "--out", str(s)]) == 0
    out = tmp_path / "c" / "all16.json"
    out.parent.mkdir()
    assert main(["plan", str(m), "--target", "hailo10h", "--max-legal", "--variants",
                 "--input-shape", f"x=1x{SEQ}x{W}", "--stats", str(s), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "max_legal" in text and "nolin" in text
    cands = json.loads((out.parent / "all16.candidates.json").read_text())["candidates"]
    assert [c["name"] for c in cands] == ["max_legal", "noqk", "noqkv", "noqkvao", "onlyup",
                                           "nolin"]
    from quantscope.stages.buckets import read_candidates

    opened, target = read_candidates(out.parent / "all16.candidates.json")
    assert target == "hailo10h" and len(opened) == 6


@pytest.mark.parametrize("argv, says", [
    (["--variants"], "--variants needs --max-legal"),
    (["--max-legal", "--max-cost", "1.5"], "searches nothing"),
])
def test_plan_max_legal_refuses_what_it_does_not_use(tmp_path, capsys, argv, says):
    m = tmp_path / "blk.onnx"
    onnx.save(_block(), m)
    out = tmp_path / "p.json"
    assert main(["plan", str(m), "--target", "hailo10h", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err and not out.exists()


def _pooled() -> onnx.ModelProto:
    """Conv, MaxPool, Conv: hailo8l's ``hailo.maxpool_16bit`` is a warning on the pool."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32), "w2")
    nodes = [onnx.helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             onnx.helper.make_node("MaxPool", ["c1"], ["p"], kernel_shape=[2, 2],
                                   strides=[2, 2]),
             onnx.helper.make_node("Conv", ["p", "w2"], ["y"], pads=[1, 1, 1, 1])]
    graph = onnx.helper.make_graph(
        nodes, "pooled",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 4, 4])],
        [w1, w2])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_max_legal_demotes_what_the_planner_refuses_with_a_warning():
    """Before, only errors were demoted: the pool stayed at a16_w16 under hailo8l's
    ``hailo.maxpool_16bit`` warning, a plan the planner (which blocks such warnings) never
    emits, and ``run``'s rewrite baseline and ``buckets`` measured it as legal."""
    model = load_proto(_pooled())
    target = load_target("hailo8l")
    groups = find_groups(model)
    ops = {g.name: g.op_type for g in groups.groups}
    base = max_legal(model, target, None)
    assert base.plan.default == Precision.A16_W16
    assert {ops[g]: p for g, p in base.plan.overrides} == {"MaxPool": Precision.A8_W8}
    assert "hailo.maxpool_16bit (warning)" in base.note
    rules = {(p.rule, p.severity) for p in check(base.plan, groups, model, target)}
    assert ("hailo.maxpool_16bit", "warning") not in rules
    # where the rule is an error nothing changes: ort-cpu refuses nothing
    assert max_legal(model, load_target("ort-cpu"), None).plan.overrides == ()
