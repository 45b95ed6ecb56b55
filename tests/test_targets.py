"""Target profiles: every built-in loads, rules carry provenance, unknown keys rejected."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from quantscope.plan.check import CHECKS
from quantscope.targets import BUILTIN_TARGETS, load_target, op_kind, parse_target, with_params
from quantscope.types import Group, GroupKind, Precision, QuantscopeError

HERE = Path(__file__).parent.parent / "src" / "quantscope" / "targets"


@pytest.mark.parametrize("name", sorted(BUILTIN_TARGETS))
def test_builtin_profile_loads_with_complete_rules(name):
    t = load_target(name)
    assert t.name == name and t.vendor and t.sdk and t.cost.basis
    assert t.is_allowed("weighted", Precision.A8_W8)
    for rule in t.rules:
        assert rule.check in CHECKS
        assert rule.reason and rule.provenance and rule.fix
        assert rule.severity in ("error", "warning")
    for kind, table in t.cost.relative:
        assert dict(table)[Precision.A8_W8] == 1.0, kind


def test_aliases_and_unknown_target():
    assert load_target("qnn-htp-v73").name == "qnn_htp_v73"
    assert load_target("HAILO10H").name == "hailo10h"
    with pytest.raises(QuantscopeError, match="unknown target 'tpu'"):
        load_target("tpu")


def test_hailo10h_encodes_the_three_walls_and_maxpool():
    t = load_target("hailo10h")
    rules = {r.id: r for r in t.rules}
    assert set(rules) == {
        "hailo.attention_16bit",
        "hailo.a16_low_sublayer_empty",
        "hailo.super_defuse",
        "hailo.maxpool_16bit",
    }
    limit = rules["hailo.super_defuse"].param("max_values")
    assert limit.value == 256 * 384 and limit.estimate and limit.note
    assert "community.hailo.ai/t/19530" in rules["hailo.attention_16bit"].provenance
    assert rules["hailo.maxpool_16bit"].severity == "warning"
    assert not t.is_allowed("weighted", Precision.FLOAT)
    # non-weighted kinds: only activation bits matter
    assert t.is_allowed("softmax", Precision.A8_W4)


def test_hailo8_walls_are_unconfirmed_warnings():
    t = load_target("hailo8")
    assert "3.33" in t.sdk
    assert all(r.severity == "warning" for r in t.rules)
    assert all("unconfirmed" in r.provenance for r in t.rules if "field report 000" in r.provenance)


def test_cost_of_16_bit_on_hailo_matches_the_pose_measurement():
    t = load_target("hailo10h")
    assert t.cost.factor("weighted", Precision.A16_W16) == pytest.approx(104 / 14, rel=0.01)
    assert t.cost.factor("softmax", Precision.A8_W4) == 1.0  # same act bits as a8_w8
    assert t.cost.factor("weighted", Precision.FLOAT) is None


def _raw(name="hailo10h"):
    return tomllib.loads((HERE / BUILTIN_TARGETS[name]).read_text())


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda r: r.__setitem__("colour", "red"), "colour"),
        (lambda r: r["scheme"].__setitem__("signed_acts", True), "signed_acts"),
        (lambda r: r["rules"][0].__setitem__("severty", "error"), "severty"),
        (lambda r: r["rules"][2]["params"]["max_values"].__setitem__("estmate", True), "estmate"),
        (lambda r: r["precisions"].__setitem__("convolution", ["a8_w8"]), "convolution"),
        (lambda r: r["cost"].__setitem__("boundary", 1.0), "boundary"),
    ],
)
def test_unknown_keys_are_rejected_with_key_and_file(mutate, key):
    raw = _raw()
    mutate(raw)
    with pytest.raises(QuantscopeError) as err:
        parse_target(raw, source="my.toml")
    message = str(err.value)
    assert f"'{key}'" in message and "my.toml" in message and "\n" not in message


def test_bad_files_are_one_line_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed\n")
    with pytest.raises(QuantscopeError, match="not valid TOML"):
        load_target(bad)
    with pytest.raises(QuantscopeError, match="does not exist"):
        load_target(tmp_path / "missing.toml")
    raw = _raw()
    raw["rules"][0]["severity"] = "fatal"
    with pytest.raises(QuantscopeError, match="severity 'fatal'"):
        parse_target(raw, source="x.toml")
    raw = _raw()
    del raw["rules"][0]["provenance"]
    with pytest.raises(QuantscopeError, match="missing key 'provenance'"):
        parse_target(raw, source="x.toml")


def test_user_profile_file_round_trip(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text((HERE / "ort_cpu.toml").read_text().replace('"ort_cpu"', '"mine"'))
    assert load_target(path).name == "mine"


def test_with_params_overrides_an_estimate():
    t = with_params(load_target("hailo10h"), {"hailo.super_defuse.max_values": 65536})
    p = {r.id: r for r in t.rules}["hailo.super_defuse"].param("max_values")
    assert p.value == 65536 and not p.estimate
    with pytest.raises(QuantscopeError, match="no rule parameter"):
        with_params(t, {"hailo.super_defuse.nope": 1})


def test_op_kind_registry():
    def g(op, kind=GroupKind.ACTIVATION):
        return Group(name="n", op_type=op, kind=kind, nodes=("n",), inputs=(), outputs=())

    assert op_kind(g("MatMul", GroupKind.WEIGHTED)) == "weighted"
    assert op_kind(g("MatMul")) == "matmul"
    assert op_kind(g("Softmax")) == "softmax"
    assert op_kind(g("LayerNormalization")) == "normalization"
    assert op_kind(g("MaxPool")) == "maxpool"
    assert op_kind(g("Concat")) == "other"


def test_the_promotion_precision_is_target_data():
    """``[promotion]``: a16_w8 on HTP (W8A16, with its reason and source), a16_w16 where a
    profile has none; a promotion without 16-bit activations or a source is one line."""
    qnn = load_target("qnn-htp-v73")
    assert qnn.promote == Precision.A16_W8 and "W8A16" in qnn.promotion.reason
    assert "003" in qnn.promotion.provenance
    assert load_target("hailo10h").promote == Precision.A16_W16
    assert load_target("hailo10h").promotion is None
    raw = tomllib.loads(Path(qnn.source).read_text())
    raw["promotion"]["precision"] = "a8_w4"
    with pytest.raises(QuantscopeError, match="promotion.precision .* 16-bit activations"):
        parse_target(raw, source="x.toml")
    raw["promotion"] = {"precision": "a16_w16", "reason": "r"}
    with pytest.raises(QuantscopeError, match="provenance"):
        parse_target(raw, source="x.toml")


def test_max_legal_promotes_to_the_target_promotion():
    """The max-legal candidate's ``high`` is the target's promotion unless given (the run's
    analysis at it: tests/test_rewrites_auto.py, the QNN run)."""
    import tiny_models as tm

    from quantscope.model.load import load_proto
    from quantscope.plan.candidates import max_legal

    model = load_proto(tm.ALL["conv_net"](), "tiny")
    qnn = load_target("qnn-htp-v73")
    assert max_legal(model, qnn, None).plan.default == Precision.A16_W8
    assert max_legal(model, qnn, None, high=Precision.A16_W16).plan.default == \
        Precision.A16_W16
    assert max_legal(model, load_target("hailo10h"), None).plan.default == Precision.A16_W16
