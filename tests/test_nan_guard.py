"""The NaN guard an SDPA export writes after each attention Softmax (``Where(IsNaN(p), 0,
p)``, transformers' default attention exported by torch.onnx) is taken out at load, so
headsplit and rowscale see the attention and no IsNaN/Where layer reaches the compiler."""

import numpy as np
from onnx import helper, numpy_helper
from test_repair_heads import _encoder, _feeds

from quantscope.model.load import load_proto
from quantscope.repair.heads import split_heads
from quantscope.repair.rowscale import rowscale
from quantscope.repair.verify import run_all


def _guarded(zero: float = 0.0):
    """The BERT-like attention of test_repair_heads with the SDPA guard after its Softmax."""
    proto = _encoder()
    g = proto.graph
    soft = next(k for k, n in enumerate(g.node) if n.op_type == "Softmax")
    p = g.node[soft].output[0]
    for n in g.node:
        n.input[:] = ["p_safe" if t == p else t for t in n.input]
    g.node.insert(soft + 1, helper.make_node("IsNaN", [p], ["p_nan"], name="guard/IsNaN"))
    g.node.insert(soft + 2, helper.make_node("Where", ["p_nan", "zero", p], ["p_safe"],
                                             name="guard/Where"))
    g.initializer.append(numpy_helper.from_array(np.array([zero], np.float32), "zero"))
    return proto


def test_the_guard_is_taken_out_and_said():
    guarded = _guarded()
    model = load_proto(guarded)
    ops = [n.op_type for n in model.graph.node]
    assert "IsNaN" not in ops and "Where" not in ops
    context = next(n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] == "p")
    assert context.input[1] == "vh"
    assert any("NaN guard" in n and "every key masked" in n for n in model.notes)
    # the function on tokenized texts (every row keeps a key) is the guarded model's
    plain = load_proto(_encoder())
    for f in _feeds(3):
        np.testing.assert_allclose(run_all(model.proto, [f])[0][0],
                                   run_all(guarded, [f])[0][0], rtol=0, atol=1e-6)
        np.testing.assert_allclose(run_all(model.proto, [f])[0][0],
                                   run_all(plain.proto, [f])[0][0], rtol=0, atol=1e-6)


def test_the_rewrites_find_the_guarded_attention():
    model = load_proto(_guarded())
    heads = split_heads(model)
    assert dict(heads.effect).get("attentions") == 1.0, heads.reason
    assert dict(rowscale(model).effect).get("sites") == 1.0


def test_a_where_that_is_not_the_guard_stays():
    """A Where whose value is not 0 is the model's own function: kept, nothing said."""
    model = load_proto(_guarded(zero=0.5))
    assert {"IsNaN", "Where"} <= {n.op_type for n in model.graph.node}
    assert not any("NaN guard" in n for n in model.notes)
