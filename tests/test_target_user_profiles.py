"""A target a user writes: a copy of hailo8.toml, edited, passed as ``--target ./my.toml``.

Each edit below used to load silently and then misbehave: a misspelt op kind made a rule
that never fires, a duplicate id merged two rules in ``with_params``, a precision allowed
without a cost factor was costed as infinite (never picked, never said), a precision list
given as a string was read letter by letter, a vendor's own name with a Hailo ``formats``
list failed only at the end of a run, at its export, a ``default_precision`` that
``[precisions]`` does not allow loaded as the compiler's default. Now each is one line
naming the key, the file and the fix. A target without a16_w16 promotes to a16_w8 (it used to sweep nothing), and
one with no 16-bit precision at all still plans (it used to stop as "another model").
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load_proto
from quantscope.plan.check import check
from quantscope.plan.search import plan_from_analysis
from quantscope.targets import load_target_file, parse_target
from quantscope.types import Precision, QuantscopeError, Sensitivity

HAILO8 = Path(__file__).parents[1] / "src/quantscope/targets/hailo8.toml"
BASE = tomllib.loads(HAILO8.read_text())


def _rule(raw, rule_id):
    return next(r for r in raw["rules"] if r["id"] == rule_id)


def _set(path, value):
    def edit(raw):
        *keys, last = path
        for k in keys:
            raw = raw[k]
        raw[last] = value
    return edit


def _del(path):
    def edit(raw):
        *keys, last = path
        for k in keys:
            raw = raw[k]
        del raw[last]
    return edit


def _rule_edit(rule_id, key, value):
    return lambda raw: _rule(raw, rule_id).__setitem__(key, value)


MAXPOOL = "hailo.maxpool_16bit"
EDITS = [  # (name, edit, words the one line must hold)
    ("kind misspelt", _rule_edit(MAXPOOL, "params", {"kinds": ["max_pool"]}),
     ["'max_pool'", "does not exist", "maxpool"]),
    ("kinds a string", _rule_edit(MAXPOOL, "params", {"kinds": "maxpool"}),
     ["params.kinds", "list of op kinds"]),
    ("param missing", _rule_edit(MAXPOOL, "params", {}), ["no parameter 'kinds'"]),
    ("param unknown", _rule_edit(MAXPOOL, "params", {"kinds": ["maxpool"], "kind": ["x"]}),
     ["parameter 'kind'", "kinds"]),
    ("number a string", lambda raw: _rule(raw, "hailo.super_defuse")["params"].__setitem__(
        "max_values", {"value": "98k", "estimate": True}), ["params.max_values", "'98k'"]),
    ("params a list", _rule_edit(MAXPOOL, "params", ["maxpool"]), ["params of rule"]),
    ("duplicate id", _rule_edit(MAXPOOL, "id", "hailo.attention_16bit"),
     ["'hailo.attention_16bit'", "twice", "own id"]),
    ("id a number", _rule_edit(MAXPOOL, "id", 7), ["'id'", "wrong type"]),
    ("provenance a number", _rule_edit(MAXPOOL, "provenance", 3), ["'provenance'", "wrong type"]),
    ("reason empty", _rule_edit(MAXPOOL, "reason", " "), ["'reason'", "empty"]),
    ("precision unknown", _set(["precisions", "weighted"], ["a8_w8", "a8_w5"]),
     ["'a8_w5'", "precisions.weighted", "a16_w16"]),
    ("precisions a string", _set(["precisions", "weighted"], "a8_w8"),
     ["precisions.weighted", "a list"]),
    ("precision twice", _set(["precisions", "weighted"], ["a8_w8", "a8_w8"]),
     ["precisions.weighted", "twice"]),
    ("kind empty", _set(["precisions", "weighted"], []), ["no precision for 'weighted'"]),
    ("no other", _del(["precisions", "other"]), ["no 'other' list"]),
    ("cost missing a precision", _set(["cost", "relative", "weighted"],
                                      {"a8_w8": 1.0, "a8_w4": 0.9, "a16_w8": 3.7}),
     ["a16_w16 on weighted", "cost.relative.weighted"]),
    ("formats of another vendor", _set(["vendor"], "Acme"), ["'alls'", "a Hailo file",
                                                             "'Acme'", "formats"]),
    ("float without a cost", _set(["precisions", "other"], ["a8_w8", "a16_w16", "float"]),
     ["float on other", "cost.relative.other"]),
    # the precision of every layer a plan does not name: it must be allowed on every kind
    ("default not allowed anywhere", _set(["default_precision"], "float"),
     ["'default_precision'", "float", "weighted", "other", "allows (a8_w8, a8_w4, a16_w8,"]),
    ("default not allowed on one kind", lambda raw: (
        raw.__setitem__("default_precision", "a16_w16"),
        raw["precisions"].__setitem__("softmax", ["a8_w8"])),
     ["'default_precision'", "a16_w16", "on softmax:"]),
    # ... and not refused by an error rule on a whole op kind, whatever the model: every
    # plan not naming each such layer would be illegal (it loaded, and every plan failed)
    ("default refused by an error rule on its kinds", lambda raw: (
        raw.__setitem__("default_precision", "a16_w16"),
        _rule(raw, "hailo.attention_16bit").__setitem__("severity", "error")),
     ["'default_precision'", "a16_w16", "error rule 'hailo.attention_16bit'",
      "every softmax, matmul layer", "set default_precision to a8_w8 or a8_w4",
      'severity = "warning"']),
    ("default a16_w8 whose weight codes leave every low byte empty", lambda raw: (
        raw.__setitem__("default_precision", "a16_w8"),
        _rule(raw, "hailo.a16_low_sublayer_empty").__setitem__("severity", "error")),
     ["'default_precision'", "a16_w8", "error rule 'hailo.a16_low_sublayer_empty'",
      "every weighted layer", "whatever the weights"]),
]


@pytest.mark.parametrize(("name", "edit", "words"), EDITS, ids=[e[0] for e in EDITS])
def test_an_edited_profile_is_one_line_naming_key_and_file(name, edit, words):
    raw = copy.deepcopy(BASE)
    edit(raw)
    with pytest.raises(QuantscopeError) as err:
        parse_target(raw, source="my.toml")
    message = str(err.value)
    assert "my.toml" in message and "\n" not in message, message
    for word in words:
        assert word in message, message


def test_an_empty_exemption_list_is_a_rule_on_every_kind():
    """``exempt_kinds = []`` exempts nothing (tests' own tiny targets write it): it loads,
    where a list of kinds a rule applies to may not be empty."""
    raw = copy.deepcopy(BASE)
    _rule(raw, "hailo.super_defuse")["params"]["exempt_kinds"] = []
    rule = next(r for r in parse_target(raw, source="my.toml").rules
                if r.id == "hailo.super_defuse")
    assert list(rule.param("exempt_kinds").value) == []


def _conv_model() -> Model:
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.5, (4, 3, 3, 3))
                                .astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 6, 6])], [w])
    return load_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _write(tmp_path, raw_text: str) -> Path:
    path = tmp_path / "my.toml"
    path.write_text(raw_text)
    return path


def test_a_profile_without_a16_w16_promotes_to_a16_w8(tmp_path):
    text = HAILO8.read_text().replace('weighted = ["a8_w8", "a8_w4", "a16_w8", "a16_w16"]',
                                      'weighted = ["a8_w8", "a16_w8"]')
    target = load_target_file(_write(tmp_path, text))
    assert target.promote is Precision.A16_W8
    assert load_target_file(HAILO8).promote is Precision.A16_W16


def test_a_profile_with_no_16_bit_precision_still_plans_uniform_a8_w8(tmp_path):
    text = HAILO8.read_text().replace(', "a16_w8", "a16_w16"]', "]")
    target = load_target_file(_write(tmp_path, text))
    assert all(p.act_bits == 8 for _, ps in target.precisions for p in ps)
    model = _conv_model()
    # the analysis sweeps nothing (every promotion is illegal): no gains at all
    empty = Sensitivity.from_gains("sqnr_db", 20.0, {})
    plan, _ = plan_from_analysis(model, empty, target)
    assert plan.default is Precision.A8_W8 and not plan.overrides
    bad = [p for p in check(plan, find_groups(model), model, target) if p.severity == "error"]
    assert not bad


def test_a_profile_allowing_only_a8_w4_on_weighted_says_where_to_start(tmp_path):
    from quantscope.plan.start import PlannerError, legal_start

    text = HAILO8.read_text().replace('weighted = ["a8_w8", "a8_w4", "a16_w8", "a16_w16"]',
                                      'weighted = ["a8_w4"]')
    with pytest.raises(QuantscopeError, match="'default_precision' .* is a8_w8, .* weighted: "
                       r"set default_precision to one every op kind allows \(a8_w4\)"):
        load_target_file(_write(tmp_path, text))
    text = text.replace('default_precision = "a8_w8"', 'default_precision = "a8_w4"')
    target = load_target_file(_write(tmp_path, text))
    model = _conv_model()
    with pytest.raises(PlannerError) as err:
        legal_start(find_groups(model), model, target, None, Precision.A8_W8)
    message = str(err.value)
    assert "every precision above it" in message and "--low a8_w4" in message, message
    plan, _ = legal_start(find_groups(model), model, target, None, Precision.A8_W4)
    assert not [p for p in check(plan, find_groups(model), model, target)
                if p.severity == "error"]


def test_a_default_an_error_rule_refuses_only_by_size_or_weights_loads():
    """Rules that depend on sizes (super_defuse) or on the weights (a16_w16's low byte) are
    left to ``check``: such a default loads, as does one the error rule only warns on."""
    for default, rule in (("a16_w16", "hailo.super_defuse"),
                          ("a16_w16", "hailo.a16_low_sublayer_empty"),
                          ("a16_w16", None)):
        raw = copy.deepcopy(BASE)
        raw["default_precision"] = default
        if rule:
            _rule(raw, rule)["severity"] = "error"
        assert parse_target(raw, source="my.toml").default_precision is Precision.A16_W16
