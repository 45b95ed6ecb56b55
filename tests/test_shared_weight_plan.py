"""A weight read by two weighted groups is one tensor with one encoding.

Before: a plan with ``mm1`` at a16_w16 and ``mm2`` at a8_w8 on a shared ``W`` passed
``check``; the QDQ model quantized ``W`` once at 8 bits and the QNN encodings held one
8-bit entry, so the w16 the plan (and its cost) claimed for ``mm1`` existed nowhere.
Now ``check`` refuses it (``plan.shared_weight``), and so the planner never emits it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.check import check
from quantscope.targets import load_target
from quantscope.types import Plan, Precision


def _shared_model():
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.5, (8, 8))
                                .astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm1"),
         helper.make_node("Relu", ["h"], ["hr"], name="relu"),
         helper.make_node("MatMul", ["hr", "W"], ["y"], name="mm2")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8])], [w])
    return load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _errors(plan, model, target):
    return [p for p in check(plan, find_groups(model), model, target) if p.severity == "error"]


def test_a_shared_weight_at_two_weight_precisions_is_refused():
    model, target = _shared_model(), load_target("qnn-htp-v73")
    split = Plan(default=Precision.A8_W8, overrides=(("mm1", Precision.A16_W16),))
    bad = _errors(split, model, target)
    assert {p.group for p in bad} == {"mm1", "mm2"}
    assert all(p.rule == "plan.shared_weight" and "'W'" in p.reason for p in bad)
    half_float = Plan(default=Precision.A8_W8, overrides=(("mm2", Precision.FLOAT),))
    assert {p.rule for p in _errors(half_float, model, target)} == {"plan.shared_weight"}
    # the same weight bits (activations may differ) are one encoding: legal
    same = Plan(default=Precision.A8_W8, overrides=(("mm1", Precision.A16_W8),))
    assert not _errors(same, model, target)



def test_the_planner_screen_judges_a_shared_weight_as_check_does_without_a_whole_check(
        monkeypatch):
    """The screen of a move that breaks only the shared-weight rule at the start ran a whole
    ``check`` per move: on minilm-l6 after tokensplit (1,076 groups, 36 weights each read by
    two chunks) the plan stage ran for over 25 minutes, re-quantizing every 16-bit weight in
    each check. Now it judges the rule on the moved plan alone, with the same verdict as a
    whole check: refused while the sibling holds other weight bits, legal once it does not."""
    from quantscope.plan import start as start_mod

    model, target = _shared_model(), load_target("qnn-htp-v73")
    groups = find_groups(model)
    uniform = Plan(default=Precision.A8_W8, target=target.name)
    legal = start_mod.legality(uniform, groups, model, target, None, )
    sibling16 = Plan(default=Precision.A8_W8, overrides=(("mm2", Precision.A16_W16),))
    want = {name: legal.blocking(start_mod._with_precisions(plan, {"mm1": Precision.A16_W16}))
            for name, plan in (("uniform", uniform), ("sibling16", sibling16))}
    assert {p.rule for p in want["uniform"]} == {"plan.shared_weight"}
    assert [p for p in want["sibling16"] if p.group == "mm1"] == []
    whole = []
    monkeypatch.setattr(start_mod, "check", lambda *a, **k: whole.append(1) or check(*a, **k))
    got = {name: legal.screen(plan, "mm1", Precision.A16_W16)
           for name, plan in (("uniform", uniform), ("sibling16", sibling16))}
    assert whole == [1]  # the memo's one check at the start plan, none per move
    assert [(p.group, p.rule) for p in got["uniform"]] == [
        (p.group, p.rule) for p in want["uniform"] if p.group == "mm1"]
    assert got["sibling16"] == ()


def _sens(gains):
    from quantscope.types import Sensitivity
    return Sensitivity(metric="sqnr_db", base=10.0, gains=tuple(
        (g, ((Precision.A16_W8, a), (Precision.A16_W16, b))) for g, (a, b) in gains.items()))


def test_the_planner_promotes_groups_sharing_a_weight_together():
    """Stop 53's rule made every tokensplit chunk unpromotable at w16 one at a time (the
    single minilm-l6 plan fell from 87.3 % to 80.0 % top-1 agreement): a promotion of one
    sharer's weight bits was refused and the planner had no move that kept the weight one
    tensor. Now a promotion moves the groups reading that weight with it, its gain and cost
    the sum of theirs; the emitted plan passes check, and an activation-only promotion
    (same weight bits) still moves one group."""
    from quantscope.plan.search import search

    model, target = _shared_model(), load_target("qnn-htp-v73")
    groups = find_groups(model)
    names = [g.name for g in groups.groups]
    assert {"mm1", "mm2"} <= set(names)
    gains = {n: (0.0, 0.0) for n in names}
    gains["mm1"] = (0.1, 3.0)  # w16 helps mm1 a lot, mm2 not at all
    res = search(groups, _sens(gains), target, model, candidates=(
        Precision.A16_W8, Precision.A16_W16))
    chosen = dict(res.plan.overrides)
    assert chosen.get("mm1") == chosen.get("mm2") == Precision.A16_W16
    assert [(m.group, m.also) for m in res.path if m.precision is Precision.A16_W16] == [
        ("mm1", ("mm2",))]
    assert not _errors(res.plan, model, target)
    gains["mm1"] = (2.0, 2.0)  # only the activation bits help: mm1 alone
    res = search(groups, _sens(gains), target, model, candidates=(
        Precision.A16_W8, Precision.A16_W16))
    chosen = dict(res.plan.overrides)
    assert chosen.get("mm1") == Precision.A16_W8 and "mm2" not in chosen
