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


def _sdpa_mask():
    """The attention with an SDPA export's mask: ``Where(mask, 0, -inf)`` added to the
    scores (the masked keys' scores are ``-inf``), and the guard after the Softmax."""
    proto = _guarded()
    g = proto.graph
    k = next(k for k, n in enumerate(g.node) if n.output[0] == "madd")
    del g.node[k]
    g.node.insert(k, helper.make_node("Cast", ["m1"], ["mb"], to=9, name="mask/Cast"))
    g.node.insert(k + 1, helper.make_node("Where", ["mb", "zero", "neginf"], ["madd"],
                                          name="mask/Where"))
    g.initializer.append(numpy_helper.from_array(np.array([-np.inf], np.float32), "neginf"))
    ident = next(n for n in g.node if n.op_type == "Identity")  # the Softmax reads the Add
    for n in g.node:
        n.input[:] = [ident.input[0] if t == ident.output[0] else t for t in n.input]
    g.node.remove(ident)
    return proto


def test_the_masks_minus_inf_is_not_a_fault():
    """The mask Add's ``-inf`` at padded keys is the mask, not a NaN/inf to warn about
    ("find the op that makes them and guard it"); its range still comes from the scores."""
    from quantscope.calibrate.collect import calibrate, nonfinite_note
    from quantscope.model.groups import find_groups, find_mask_adds

    model = load_proto(_sdpa_mask())
    (mask,) = find_mask_adds(model)
    feeds = _feeds(4)
    assert any((f["attention_mask"] == 0).any() for f in feeds)  # padded keys: -inf there
    stats = calibrate(model, find_groups(model), iter(feeds))
    assert stats.tensors[mask.output].nonfinite == 0
    assert nonfinite_note(stats) is None
    # a NaN or +inf in a mask Add is still a fault; any other tensor's -inf too
    from quantscope.calibrate.observe import Observer

    values = np.array([-np.inf, np.nan, np.inf, 1.0], np.float32)
    masked, plain = Observer("m", mask=True), Observer("t")
    masked.update(values)
    plain.update(values)
    assert (masked.nonfinite, plain.nonfinite) == (2, 3)


def test_rowscale_shift_keeps_the_masked_keys_below_the_grid():
    """After rowscale an SDPA mask's -inf reaches the row shift (masked scores minus the
    row max) that Exp reads. Taken for 0 there, the shift's grid ended at the smallest real
    shift, and the quantized masked keys got weight exp(that) (DistilBERT: embedding SQNR
    66 -> 31 dB with rowscale, 66.7 dB on an eager export of the same weights). Now it is
    seen as the fill an eager export writes: a sentinel floor, kept out of the grid."""
    from quantscope.calibrate.collect import calibrate, nonfinite_note
    from quantscope.calibrate.observe import MASK_FILL
    from quantscope.emulate.encode import sentinel_floor
    from quantscope.model.groups import find_groups

    model = load_proto(rowscale(load_proto(_sdpa_mask())).proto)
    stats = calibrate(model, find_groups(model), iter(_feeds(4)))
    shift = stats.tensors["p/shift"]
    assert shift.min == MASK_FILL and shift.nonfinite == 0 and sentinel_floor(shift)
    assert shift.bulk_min is not None and -1e3 < shift.bulk_min < 0
    assert nonfinite_note(stats) is None
