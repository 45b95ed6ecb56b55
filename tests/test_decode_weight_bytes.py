"""a8_w4 for a decoder: weight bytes at the plan's precisions, charged in the decode cost
(decode reads every weight for one token), not in prefill."""

from __future__ import annotations

import pytest
from decoder_tiny import TINY, tiny_weights

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.model.phases import phase_shapes
from quantscope.plan.cost import plan_cost, uniform_a8_cost
from quantscope.plan.phases import check_phases
from quantscope.targets import load_target
from quantscope.types import GroupKind, Plan, Precision
from quantscope.zoo.decoder import build_decoder


@pytest.fixture(scope="module")
def models():
    w = tiny_weights()
    return {p: load_proto(build_decoder(TINY, w, p), source=p) for p in ("prefill", "decode")}


def _w4(models) -> Plan:
    weighted = [g.name for g in find_groups(models["prefill"]).groups
                if g.kind is GroupKind.WEIGHTED]
    return Plan(default=Precision.A8_W8, target="hailo10h",
                overrides=tuple((n, Precision.A8_W4) for n in weighted))


def _weights(cfg=TINY) -> int:
    """Weights of the Linears the tiny decoder runs (the embedding is a Gather: no group)."""
    h, kv = cfg.hidden, cfg.kv_heads * cfg.head_dim
    per_layer = h * h + 2 * kv * h + h * h + 3 * cfg.ffn * h
    return cfg.layers * per_layer + cfg.vocab * h


def test_weight_bytes_halve_at_a8_w4(models) -> None:
    target = load_target("hailo10h")
    w8 = {c.phase: c for c in check_phases(Plan(default=Precision.A8_W8, target="hailo10h"),
                                           models, target, 16)}
    w4 = {c.phase: c for c in check_phases(_w4(models), models, target, 16)}
    assert w8["decode"].weight_bytes == _weights() == w8["prefill"].weight_bytes
    assert w4["decode"].weight_bytes == _weights() / 2
    assert w4["decode"].errors == 0 and w4["prefill"].errors == 0  # legal on hailo10h


def test_decode_cost_charges_the_weight_bytes_and_prefill_does_not(models) -> None:
    target, plan = load_target("hailo10h"), _w4(models)
    assert target.cost.weight_byte_macs == 1.0
    got = {c.phase: c.cost for c in check_phases(plan, models, target, 16)}
    dec = models["decode"]
    groups, shapes = find_groups(dec), phase_shapes(dec, "decode", 16)
    # by hand: one token reads each weight once; its MACs equal its weights (W); the other
    # groups' work R is the old unit minus W. a8_w8: W MACs + W bytes; a8_w4: 0.9 W + W / 2
    weights = float(_weights())
    rest = uniform_a8_cost(groups, target, shapes, model=dec) - weights
    assert got["decode"] == pytest.approx((0.9 * weights + 0.5 * weights + rest)
                                          / (2 * weights + rest), rel=1e-9)
    old = plan_cost(plan, groups, target, shapes, model=dec)  # compute only: 0.9 x weights
    assert got["decode"] < old < 1.0
    pre = models["prefill"]
    assert got["prefill"] == plan_cost(plan, find_groups(pre), target,
                                       phase_shapes(pre, "prefill", 16), model=pre)


def test_a_target_without_a_weight_byte_cost_keeps_its_decode_cost(models) -> None:
    target, plan = load_target("ort_cpu"), _w4(models)
    dec = models["decode"]
    groups, shapes = find_groups(dec), phase_shapes(dec, "decode", 16)
    assert plan_cost(plan, groups, target, shapes, model=dec, weight_reads=True) == \
        plan_cost(plan, groups, target, shapes, model=dec)


def test_the_search_table_charges_the_same_weight_bytes(models) -> None:
    from quantscope.plan.cost import cost_table

    target, plan, dec = load_target("hailo10h"), _w4(models), models["decode"]
    groups, shapes = find_groups(dec), phase_shapes(dec, "decode", 16)
    table = cost_table(groups, target, dec, (Precision.A8_W4,), shapes, weight_reads=True)
    prec = {g.name: plan.precision_of(g.name) for g in groups.groups}
    assert table.total(prec) == pytest.approx(
        plan_cost(plan, groups, target, shapes, model=dec, weight_reads=True), rel=1e-12)
