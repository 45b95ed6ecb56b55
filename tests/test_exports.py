"""Exports: Hailo .alls and QNN/AIMET encodings, golden files plus parse-back tests.

Regenerate the golden files with ``QUANTSCOPE_UPDATE_GOLDEN=1 pytest tests/test_exports.py``
(then review the diff: a golden file is a reviewed artefact, not a snapshot).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import tiny_models
from onnx import TensorProto, helper, numpy_helper

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.export.alls_lint import lint, script_plan
from quantscope.export.hailo_alls import (
    export_alls,
    heuristic_names,
    hn_layer_names,
    names_guessed,
    unset_decisions,
)
from quantscope.export.plan_export import export_plan, scripted_plan
from quantscope.export.qnn_encodings import (
    aimet_offset,
    export_qnn_encodings,
    parse_qnn_encodings,
    to_json,
)
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load_proto
from quantscope.numerics import qparams, weight_encoding
from quantscope.report.summary import unset_line
from quantscope.serde import write_plan, write_stats
from quantscope.targets import load_target
from quantscope.types import Encoding, Encodings, Plan, Precision, QuantScheme, QuantscopeError

GOLDEN = Path(__file__).parent / "golden"
HAILO = load_target("hailo10h")


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("QUANTSCOPE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from the golden file"


@pytest.fixture(scope="module")
def block():
    model = load_proto(tiny_models.layernorm_block())
    return model, find_groups(model)


PLAN = Plan(
    default=Precision.A8_W8,
    overrides=(("MatMul_8", Precision.A16_W16), ("LayerNormalization_10", Precision.A16_W8)),
    target="hailo10h",
    reasons=(("MatMul_8", "FFN output: largest SQNR gain per unit cost"),),
)


# ---- Hailo .alls -------------------------------------------------------------------


def test_alls_golden_with_guessed_names(block):
    _, groups = block
    text = export_alls(PLAN, groups, force_ranges={"LayerNormalization_10": (-1.1, 1.1)})
    _golden("layernorm_block_hailo10h.alls", text)
    assert "quantization_param(conv2, precision_mode=a16_w16)" in text
    assert text.count("# guessed name") == 3


def test_alls_with_hn_names_is_exact(block):
    _, groups = block
    hn = {
        "name": "lnblock",
        "layers": {
            "lnblock/input_layer1": {"type": "input_layer", "original_names": ["x"]},
            "lnblock/conv7": {"type": "conv", "original_names": ["MatMul_8"]},
            "lnblock/layer_normalization2": {
                "type": "layer_normalization",
                "original_names": ["LayerNormalization_10"],
            },
        },
    }
    names = hn_layer_names(hn, groups)
    assert names == {"MatMul_8": "conv7", "LayerNormalization_10": "layer_normalization2"}
    text = export_alls(PLAN, groups, layer_names=names)
    assert "guessed name" not in text
    assert "quantization_param(conv7, precision_mode=a16_w16)" in text
    assert "quantization_param(layer_normalization2, precision_mode=a16_w8)" in text
    with pytest.raises(QuantscopeError, match="layers"):
        hn_layer_names({"nodes": []}, groups)


def test_alls_parses_back_to_the_plan(block):
    model, groups = block
    for plan in (PLAN, Plan(default=Precision.A16_W16, overrides=(("Add_9", Precision.A8_W8),))):
        back = script_plan(export_alls(plan, groups), groups, model, HAILO)
        for g in groups.names():
            assert back.precision_of(g) == plan.precision_of(g), g


def test_alls_default_for_every_layer_is_the_braced_glob(block):
    # the Hailo Model Zoo's scripts select every layer as {*} (never a bare *)
    model, groups = block
    plan = Plan(default=Precision.A16_W8, overrides=(("Add_9", Precision.A8_W8),))
    text = export_alls(plan, groups)
    assert "quantization_param({*}, precision_mode=a16_w8)\n" in text
    assert "quantization_param(*," not in text
    assert script_plan(text, groups, model, HAILO).precision_of("MatMul_1") is Precision.A16_W8


def test_alls_rejects_float(block):
    _, groups = block
    with pytest.raises(QuantscopeError, match="float"):
        export_alls(Plan(default=Precision.A8_W8, overrides=(("Add_9", Precision.FLOAT),)), groups)


def test_heuristic_names_count_by_kind(block):
    _, groups = block
    names = heuristic_names(groups)
    assert names["conv1"] == "MatMul_1" and names["conv2"] == "MatMul_8"
    assert names["normalization2"] == "LayerNormalization_10" == names["layer_normalization2"]
    assert names["ew_add1"] == "Add_9"


def _separable_net() -> Model:
    """Conv -> depthwise Conv -> pointwise Conv -> GlobalAveragePool -> Gemm."""
    r = np.random.default_rng(4)
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    sep (float[N, 3, 8, 8] x) => (float[N, 4] y) {
        a = Conv <pads = [1, 1, 1, 1]> (x, w1)
        d = Conv <pads = [1, 1, 1, 1], group = 8> (a, w2)
        p = Conv (d, w3)
        g = GlobalAveragePool (p)
        f = Flatten (g)
        y = Gemm <transB = 1> (f, w4)
    }
    """
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(numpy_helper.from_array(r.normal(0, 0.3, s).astype(
        np.float32), n) for n, s in (("w1", (8, 3, 3, 3)), ("w2", (8, 1, 3, 3)),
                                      ("w3", (16, 8, 1, 1)), ("w4", (4, 16))))
    return load_proto(model)


def test_guessed_names_count_depthwise_convs_and_gemms_apart():
    # the DFC names a depthwise Conv dw<i>, a Gemm fc<i>, each counted apart from conv<i>:
    # counting them as convs put a16 on another layer than the plan's
    model = _separable_net()
    groups = find_groups(model)
    conv, dw, pw, gemm = (g.name for g in groups.groups if g.weight)
    names = {g: n for n, g in reversed(heuristic_names(groups).items())}
    assert [names[g] for g in (conv, dw, pw, gemm)] == ["conv1", "dw1", "conv2", "fc1"]
    plan = Plan(default=Precision.A8_W8, overrides=((pw, Precision.A16_W16),), target="hailo8")
    text = export_alls(plan, groups)
    assert "quantization_param(conv2, precision_mode=a16_w16)" in text
    back = script_plan("quantization_param(dw1, precision_mode=a16_w16)\n", groups, model,
                       load_target("hailo8"))
    assert back.precision_of(dw) is Precision.A16_W16
    assert back.precision_of(pw) is Precision.A8_W8


# ---- QNN / AIMET encodings ----------------------------------------------------------


def _act(lo, hi, bits):
    return qparams(lo, hi, bits, signed=False, symmetric=False)


def _encodings(model) -> Encodings:
    w = {n: model.initializer_array(n) for n in ("w1", "w2")}
    return Encodings(
        activations={
            "x": _act(-3.0, 3.0, 8),
            "n1": _act(-2.5, 2.0, 8),
            "gelu": _act(-0.2, 4.0, 8),
            "o": _act(-1.0, 1.0, 16),
            "res": _act(-4.0, 4.5, 8),
            "y": _act(-3.0, 3.0, 16),
        },
        weights={
            "w1": weight_encoding(w["w1"][:, :4], 8, axis=1, signed=True, symmetric=True),
            "w2": weight_encoding(w["w2"][:, :3], 16, axis=1, signed=True, symmetric=True),
        },
        scheme=QuantScheme(),
    )


QNN_PLAN = Plan(
    default=Precision.A8_W8,
    overrides=(("MatMul_8", Precision.A16_W16), ("Add_9", Precision.FLOAT)),
)


@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
def test_qnn_encodings_golden(block, version):
    model, groups = block
    doc = export_qnn_encodings(QNN_PLAN, groups, _encodings(model), version=version)
    _golden(f"layernorm_block_qnn_{version}.json", to_json(doc))


@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
def test_qnn_encodings_parse_back(block, version):
    model, groups = block
    enc = _encodings(model)
    doc = json.loads(to_json(export_qnn_encodings(QNN_PLAN, groups, enc, version=version)))
    back = parse_qnn_encodings(doc)
    assert back["activations"]["res"] is None  # the float group's output
    for name, orig in [*enc.activations.items(), *enc.weights.items()]:
        if name == "res":
            continue
        got = back["activations"].get(name) or back["params"][name]
        assert got.bits == orig.bits
        np.testing.assert_allclose(got.scale, orig.scale, rtol=1e-6)
        for a, b in zip(got.range(), orig.range(), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    plan_bits = {t: e.bits for t, e in back["activations"].items() if e is not None}
    assert plan_bits["o"] == 16 and plan_bits["n1"] == 8


def test_aimet_offset_convention():
    sym8 = Encoding(scale=np.float32(0.1), zero_point=np.int32(0), bits=8, signed=True)
    asym = Encoding(scale=np.float32(0.00976785), zero_point=np.int32(114), bits=8, signed=False)
    u16 = Encoding(scale=np.float32(1e-4), zero_point=np.int32(35799), bits=16, signed=False)
    assert aimet_offset(sym8).tolist() == [-128]
    assert aimet_offset(asym).tolist() == [-114]
    assert aimet_offset(u16).tolist() == [-35799]


def test_qnn_missing_encoding_and_bad_version(block):
    model, groups = block
    enc = _encodings(model)
    del enc.activations["gelu"]
    with pytest.raises(QuantscopeError, match="no activation encoding for 'gelu'"):
        export_qnn_encodings(QNN_PLAN, groups, enc)
    with pytest.raises(QuantscopeError, match="format"):
        export_qnn_encodings(QNN_PLAN, groups, _encodings(model), version="2.0.0")


def _lookup_exp_model() -> Model:
    """ids -> Gather (1,200 x 4 table: the host's on hailo10h) -> Exp -> MatMul -> y."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], name="lookup"),
         helper.make_node("Exp", ["rows"], ["e"], name="exp"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")],
        "lookup_exp",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3, 4])],
        [numpy_helper.from_array(rng.normal(size=(1200, 4)).astype(np.float32) * 0.1, "table"),
         numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return Model(proto=proto, source="lookup_exp")


def test_alls_says_which_decisions_it_cannot_carry_and_what_the_host_does(tmp_path,
                                                                          capsys):
    """A decision on an op kind no Hailo prefix names (Exp) is a NOT SET comment naming the
    kind, counted by ``unset_decisions`` and said by ``export``; the lookup the target
    leaves to the host is no compiler decision: said so, not NOT SET."""

    model = _lookup_exp_model()
    groups = find_groups(model)
    ids = np.random.default_rng(1).integers(0, 1200, size=(4, 3))
    stats = calibrate(model, groups, [{"ids": ids}])
    plan = Plan(default=Precision.A8_W8, target="hailo10h", overrides=(
        ("lookup", Precision.A16_W16), ("exp", Precision.A16_W16), ("proj", Precision.A16_W16)))
    text = export_plan(model, stats, plan, fmt="alls", out=tmp_path / "m.alls").read_text()
    assert unset_decisions(text) == [
        "exp: a16_w16 NOT SET: no Hailo layer name known for its Exp layer: give the HN "
        "parsed from this model or set it by hand"]
    assert "# lookup: a16_w16: runs on the host" in text and names_guessed(text)
    assert "quantization_param(conv1, precision_mode=a16_w16)" in text
    # without a target that leaves the lookup to the host, it is one more unnamed layer
    plain = export_alls(plan, groups)
    assert [ln.split(":")[0] for ln in unset_decisions(plain)] == ["lookup", "exp"]
    write_plan(tmp_path / "plan.json", plan)
    write_stats(tmp_path / "stats.npz", stats)
    onnx.save(model.proto, str(tmp_path / "m.onnx"))
    capsys.readouterr()
    assert main(["export", "--model", str(tmp_path / "m.onnx"), "--stats",
                 str(tmp_path / "stats.npz"), str(tmp_path / "plan.json"), "--format",
                 "alls", "--out", str(tmp_path / "cli.alls")]) == 0
    assert ("warning: 1 plan decision(s) NOT SET in the compiler file (cli.alls: 1): no "
            "Hailo layer name is known for Exp layers") in capsys.readouterr().out


def test_lint_warns_at_each_decision_the_script_does_not_carry(tmp_path):
    model = _lookup_exp_model()
    groups = find_groups(model)
    plan = Plan(default=Precision.A8_W8, target="hailo10h", overrides=(
        ("exp", Precision.A16_W16), ("proj", Precision.A16_W16)))
    text = export_alls(plan, groups)
    found = [p for p in lint(text, model, groups, load_target("hailo10h"))
             if p.rule == "alls.not_set"]
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "NOT SET" in ln)
    assert [(p.group, p.severity) for p in found] == [("exp", "warning")]
    assert found[0].reason.startswith(f"line {line} `# exp: a16_w16 NOT SET")


def test_scripted_plan_puts_what_the_script_cannot_name_at_the_default():
    """The plan as its Hailo script carries it: the unnamed Exp's 16-bit decision falls to
    the default; the host's lookup and the named MatMul keep theirs; an HN naming the Exp
    keeps it too."""
    model = _lookup_exp_model()
    plan = Plan(default=Precision.A8_W8, target="hailo10h", overrides=(
        ("lookup", Precision.A16_W16), ("exp", Precision.A16_W16), ("proj", Precision.A16_W16)))
    scripted, lost = scripted_plan(model, plan)
    assert lost == ("exp",) and scripted.precision_of("exp") is Precision.A8_W8
    assert scripted.precision_of("proj") is scripted.precision_of("lookup") is Precision.A16_W16
    hn = {"layers": {"n/activation1": {"original_names": ["exp"]}}}
    assert scripted_plan(model, plan, hn=hn) == (plan, ())
    at_default = Plan(default=Precision.A16_W16, target="hailo10h")
    assert scripted_plan(model, at_default) == (at_default, ())  # the default is carried



def test_scripted_plan_gives_an_unnamed_groups_range_to_the_compilers_min_max():
    """A range the script cannot pin (the unnamed Exp's MSE method at 8 bit, or a pinned
    range) falls to the compiler's own min/max: the group counts as differing. A named
    group keeps its method; an MSE range at 16 bit is min/max already and changes nothing."""
    model = _lookup_exp_model()
    plan = Plan(default=Precision.A8_W8, target="hailo10h", ranges=(("e", "mse"), ("y", "mse")))
    scripted, lost = scripted_plan(model, plan)
    assert lost == ("exp",)
    assert dict(scripted.ranges) == {"e": "minmax", "y": "mse"}
    pinned = Plan(default=Precision.A8_W8, target="hailo10h", pinned=(("e", (-1.0, 1.0)),))
    scripted, lost = scripted_plan(model, pinned)
    assert lost == ("exp",) and scripted.pinned == () and dict(scripted.ranges) == {
        "e": "minmax"}
    wide = Plan(default=Precision.A8_W8, target="hailo10h",
                overrides=(("exp", Precision.A16_W16),), ranges=(("e", "mse"),))
    scripted, lost = scripted_plan(model, wide)  # the precision falls to 8 bit: MSE moves it
    assert lost == ("exp",) and dict(scripted.ranges) == {"e": "minmax"}
    at16 = Plan(default=Precision.A16_W16, target="hailo10h", ranges=(("e", "mse"),))
    assert scripted_plan(model, at16) == (at16, ())
    hn = {"layers": {"n/activation1": {"original_names": ["exp"]}}}
    assert scripted_plan(model, plan, hn=hn) == (plan, ())

def test_unset_line_counts_per_file_with_the_op_kinds():
    warnings = [
        "model.alls: a/exp: a16_w16 NOT SET: no Hailo layer name known for its Exp layer: x",
        "model.alls: a/max: a16_w16 NOT SET: no Hailo layer name known for its ReduceMax "
        "layer: x",
        "len-64/model.alls: a/exp: a16_w16 NOT SET: no Hailo layer name known for its Exp "
        "layer: x",
        "model.alls, len-64/model.alls: Hailo layer names guessed by op order; check them"]
    line = unset_line(warnings, {"model.alls": "the single plan"})
    assert line is not None and line.startswith(
        "warning: 3 plan decision(s) NOT SET in the compiler files (model.alls (the single "
        "plan): 2, len-64/model.alls: 1): no Hailo layer name is known for Exp, ReduceMax "
        "layers, so the compiler would not apply them; give the parsed HN (--hn)")
    assert unset_line(warnings[3:]) is None
    # a verdict written before the lines named their file and kind
    old = unset_line(["g: a16_w16 NOT SET: no Hailo layer name known for it (pass the HN)"])
    assert old is not None and old.startswith(
        "warning: 1 plan decision(s) NOT SET in the compiler file: no vendor layer name")
