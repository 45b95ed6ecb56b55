"""Which operators each target takes (``[ops]`` of its profile): LSTM, GatherND and
control flow said by ``check`` with their node names, the source and the fix; nothing
guessed where no list names an operator; a profile entry without provenance refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.check import check
from quantscope.plan.op_support import CONDITIONAL, UNLISTED, UNSUPPORTED, op_problems
from quantscope.stages.open import plan_problems
from quantscope.targets import load_target
from quantscope.targets.profile import parse_target
from quantscope.types import Plan, Precision, QuantscopeError

TARGETS = ("hailo8", "hailo8l", "hailo10h", "qnn_htp_v73", "ort_cpu")


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return load_proto(proto, "tiny.onnx")


def _lstm():
    """x [T=4, N, 3] -> a one-layer LSTM of 5 units -> Y [T, 1, N, 5]."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(1, 20, 3)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.normal(size=(1, 20, 5)).astype(np.float32), "R")
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="rnn/lstm_0", hidden_size=5)
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, "N", 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1, "N", 5])],
                  [w, r])


def _gathernd():
    """A Relu'd score map read at computed indices: MoveNet's decoding in small."""
    idx = numpy_helper.from_array(np.array([[0, 1], [1, 0]], dtype=np.int64), "idx")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="head/relu"),
             helper.make_node("GatherND", ["r", "idx"], ["y"], name="decode/gather_nd")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [idx])


def _loop():
    """A Loop of 3 trips adding 1 to its carried value (control flow)."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Constant", [], ["c1"], value=one),
         helper.make_node("Add", ["v_in", "c1"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2])])
    trips = numpy_helper.from_array(np.array(3, dtype=np.int64), "trips")
    cond = numpy_helper.from_array(np.array(True), "cond")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="pre/relu"),
             helper.make_node("Loop", ["trips", "cond", "r"], ["y"], name="steps/loop",
                              body=body)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [trips, cond])


def _problems(model, target):
    t = load_target(target)
    return op_problems(model, t)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("build,op,node", [(_lstm, "LSTM", "rnn/lstm_0"),
                                           (_gathernd, "GatherND", "decode/gather_nd"),
                                           (_loop, "Loop", "steps/loop")])
def test_each_target_says_what_it_knows_of_lstm_gathernd_loop(target, build, op, node):
    found = _problems(build(), target)
    said = [p for p in found if op in p.reason]
    if target == "ort_cpu":  # the runtime the emulation runs on takes every operator
        assert found == []
        return
    if target == "qnn_htp_v73" and op in ("LSTM", "GatherND"):
        # the QNN EP has a builder for both: listed as taken, nothing said of them
        assert said == []
        return
    # Hailo (in no list held) and QNN's Loop (no builder in the EP): a warning, not guessed
    assert len(said) == 1
    p = said[0]
    assert p.rule == UNLISTED and p.severity == "warning"
    assert f"'{node}'" in p.reason and op in p.group
    assert p.provenance and p.fix and "cut the graph before it" in p.fix
    if target == "qnn_htp_v73":
        assert "op_builder_factory.cc" in p.provenance
        assert "CPU execution provider" in p.reason
    else:
        assert "Supported Layers" in p.provenance and "Supported Layers" in p.fix


def test_loop_body_ops_are_not_judged_one_by_one():
    found = _problems(_loop(), "qnn_htp_v73")
    (p,) = found
    assert p.group == "Loop"  # Relu has a builder; the body's Identity/Add are the Loop's


def test_check_did_not_say_it_before_and_does_now_via_plan_problems():
    """``check`` (the plan's rules) stays silent on operators; ``plan_problems`` (what
    ``check`` the command and ``run``'s check.json print) says them."""
    model = _lstm()
    plan = Plan(default=Precision.A8_W8, target="hailo8l")
    inner = check(plan, find_groups(model), model, load_target("hailo8l"))
    assert not any("LSTM" in p.reason for p in inner)
    found = plan_problems(model, plan)
    assert any(p["rule"] == UNLISTED and "'rnn/lstm_0'" in p["reason"] for p in found)


def _profile(entries, **ops):
    raw = {"name": "mine", "vendor": "Acme", "sdk": "acme 1.0",
           "precisions": {"other": ["a8_w8"], "weighted": ["a8_w8"]},
           "cost": {"basis": "guess", "relative": {"other": {"a8_w8": 1.0},
                                                   "weighted": {"a8_w8": 1.0}}},
           "ops": {"source": "Acme NPU guide 1.0, op list", "unlisted": "not in Acme's list",
                   "unlisted_fix": "ask Acme", "entries": entries, **ops}}
    return parse_target(raw, "mine.toml")


def test_an_unsupported_entry_is_an_error_with_its_reason_provenance_and_fix():
    t = _profile([{"status": "unsupported", "ops": ["LSTM"], "provenance": "Acme guide p. 3",
                   "reason": "no recurrent layers", "fix": "replace LSTM by a 1-D conv"},
                  {"status": "supported", "ops": ["Relu"], "provenance": "Acme guide p. 2"}])
    (p,) = op_problems(_lstm(), t)
    assert p.rule == UNSUPPORTED and p.severity == "error"
    assert p.group == "rnn/lstm_0" and "no recurrent layers" in p.reason
    assert p.provenance.startswith("Acme guide p. 3") and p.fix == "replace LSTM by a 1-D conv"
    assert op_problems(_gathernd(), t)[0].rule == UNLISTED  # GatherND: not in the list


def test_an_entry_without_provenance_is_refused():
    with pytest.raises(QuantscopeError, match="provenance"):
        _profile([{"status": "supported", "ops": ["Relu"]}])
    with pytest.raises(QuantscopeError, match="fix"):
        _profile([{"status": "unsupported", "ops": ["LSTM"], "provenance": "p. 3",
                   "reason": "no"}])
    with pytest.raises(QuantscopeError, match="status"):
        _profile([{"status": "maybe", "ops": ["LSTM"], "provenance": "p. 3"}])
    with pytest.raises(QuantscopeError, match="twice|once"):
        _profile([{"status": "supported", "ops": ["Relu"], "provenance": "a"},
                  {"status": "supported", "ops": ["Relu"], "provenance": "b"}])
    with pytest.raises(QuantscopeError, match="unknown key 'sources'"):
        _profile([], sources="x")


def test_built_in_profiles_name_their_sources():
    for name in TARGETS:
        ops = load_target(name).ops
        assert ops is not None and ops.source
        for e in ops.entries:
            assert e.provenance
    qnn = load_target("qnn_htp_v73").ops
    assert qnn.entry("LSTM").status == "supported" and qnn.entry("Loop") is None


def test_host_lookup_and_constant_folded_nodes_are_not_judged():
    """The word-embedding Gather hailo10h runs on the host, and a node computed from
    constants alone (folded by every converter), are no device operators."""
    rng = np.random.default_rng(1)
    table = numpy_helper.from_array(rng.normal(size=(2000, 8)).astype(np.float32), "emb")
    shape = numpy_helper.from_array(np.array([8], dtype=np.int64), "shape")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed/gather"),
             helper.make_node("ConstantOfShape", ["shape"], ["s"], name="const/fill",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [2.0])),
             helper.make_node("Sub", ["e", "s"], ["y"], name="shift/sub")]
    model = _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
                   [table, shape])
    (p,) = _problems(model, "hailo10h")
    # Sub only: not Gather (the host's; a device Gather would be ops.conditional), not
    # ConstantOfShape (folded)
    assert p.rule == UNLISTED and p.group == "Sub"
    # QNN: no builder for ConstantOfShape, but it is folded; Gather and Sub have builders
    assert _problems(model, "qnn_htp_v73") == []


def test_problem_is_a_plain_record():
    (p,) = _problems(_lstm(), "hailo10h")
    assert set(dataclasses.asdict(p)) >= {"group", "rule", "reason", "provenance", "fix"}


def test_run_verdict_names_the_operators_with_their_fix():
    """``run``'s verdict: the warned rule counts op types, and one warning line per
    operator problem carries its fix (nodes and source in check.json)."""
    from quantscope.pipeline.verdict import _operators, _warned

    model = _lstm()
    found = plan_problems(model, Plan(default=Precision.A8_W8, target="hailo10h"))
    assert _warned(found) == ["ops.unlisted (1 op type)"]
    (line,) = _operators(found, "hailo10h")
    assert "LSTM" in line and "check.json" in line and "cut the graph before it" in line
    t = _profile([{"status": "unsupported", "ops": ["LSTM"], "provenance": "Acme p. 3",
                   "reason": "no recurrent layers", "fix": "replace LSTM by a 1-D conv"}])
    bad = [dataclasses.asdict(p) for p in op_problems(model, t)]
    (line,) = _operators(bad, "mine")
    assert "does not take LSTM" in line and line.endswith("replace LSTM by a 1-D conv")


def test_hailo8_keeps_the_users_compile_test_and_no_hailo_list_has_gathernd():
    """hailo8 keeps the entries of one user's DFC 3.32.0 compile test (its provenance says
    so); the zoo's compiled models name Relu on hailo8l and hailo10h too; GatherND is in no
    Hailo list."""
    model = _gathernd()
    entry = load_target("hailo8").ops.entry("Relu")
    assert entry.status == "supported" and "DFC 3.32.0" in entry.provenance
    assert "not Hailo's list" in entry.provenance
    for name in ("hailo8", "hailo8l", "hailo10h"):
        (p,) = _problems(model, name)
        assert p.group == "GatherND"


def _encoder_block():
    """x [1, 4, 8] -> LayerNormalization -> MatMul -> Softmax -> the exact GELU torch
    exports (Div by 1.414, Erf, Add 1, Mul, Mul 0.5) -> class token (Gather of index 0)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(np.ones(8, np.float32), "g"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b"),
             numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half"),
             numpy_helper.from_array(np.array(0, np.int64), "cls")]
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="blk/norm",
                              axis=-1),
             helper.make_node("MatMul", ["n", "w"], ["m"], name="blk/fc"),
             helper.make_node("Softmax", ["m"], ["s"], name="blk/softmax", axis=-1),
             helper.make_node("Div", ["s", "sqrt2"], ["d"], name="blk/act/Div"),
             helper.make_node("Erf", ["d"], ["e"], name="blk/act/Erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="blk/act/Add"),
             helper.make_node("Mul", ["s", "a"], ["u"], name="blk/act/Mul"),
             helper.make_node("Mul", ["u", "half"], ["h"], name="blk/act/Mul_1"),
             helper.make_node("Gather", ["h", "cls"], ["y"], name="head/Gather", axis=1)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)


@pytest.mark.parametrize("target,dfc", [("hailo8", "3.33"), ("hailo8l", "3.33"),
                                        ("hailo10h", "5.2.0")])
def test_hailo_lists_the_zoo_vits_operators_and_says_erf_and_gather_are_conditional(
        target, dfc):
    """The Hailo Model Zoo's compiled ViT-Tiny (opset 17) puts LayerNormalization, MatMul,
    Softmax, Div, Add, Mul in every Hailo list (each with the zoo's DFC version); Erf and
    Gather were seen taken in one form only: a warning that says which, never silence."""
    found = _problems(_encoder_block(), target)
    (p,) = found
    assert p.rule == CONDITIONAL and p.severity == "warning"
    assert p.group == "Erf, Gather"
    assert "'blk/act/Erf'" in p.reason and "'head/Gather'" in p.reason
    assert "exact GELU torch exports" in p.reason and "constant index" in p.reason
    assert "fast-plate-ocr" in p.provenance and "Erf:" in p.fix and "Gather:" in p.fix
    ops = load_target(target).ops
    for op in ("LayerNormalization", "MatMul", "Softmax"):
        e = ops.entry(op)
        assert e.status == "supported" and "hailo_model_zoo" in e.provenance
        assert dfc in e.provenance and "inferred" in e.provenance
    erf = ops.entry("Erf")
    if target == "hailo10h":  # the refusal was seen on Hailo-8L, DFC 3.31.0: said so
        assert "not tried on Hailo-10H" in erf.provenance
        assert "5.3.0" in ops.entry("Softmax").provenance  # field report 000 corroborates


def test_a_conditional_entry_is_a_warning_with_the_form_seen_and_its_fix():
    t = _profile([{"status": "conditional", "ops": ["LSTM"], "provenance": "Acme forum",
                   "reason": "taken with layout 0 only", "fix": "export with layout 0"},
                  {"status": "supported", "ops": ["Relu"], "provenance": "Acme guide p. 2"}])
    (p,) = op_problems(_lstm(), t)
    assert p.rule == CONDITIONAL and p.severity == "warning" and p.group == "LSTM"
    assert "'rnn/lstm_0'" in p.reason and "taken with layout 0 only" in p.reason
    assert p.provenance.startswith("Acme forum") and p.fix == "LSTM: export with layout 0"
    with pytest.raises(QuantscopeError, match="fix"):
        _profile([{"status": "conditional", "ops": ["LSTM"], "provenance": "p. 3",
                   "reason": "layout 0 only"}])
    from quantscope.pipeline.verdict import _operators, _warned

    said = [dataclasses.asdict(p) for p in op_problems(_lstm(), t)]
    assert _warned(said) == ["ops.conditional (1 op type)"]
    (line,) = _operators(said, "mine")
    assert "in some forms only: LSTM" in line and line.endswith("export with layout 0")
