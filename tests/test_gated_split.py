"""A decoder's MLPs split along the tokens in prefill only (``repair.gated``): the FP32
function is the same, the weights stay shared by name with decode, each chunk's gated
product is 16-bit legal where the whole was not, and the phase planner promotes a split
group and its whole decode group as one unit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from decoder_tiny import byte_decoder

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.model.phases import phase_shapes
from quantscope.plan.check import check
from quantscope.plan.phase_search import candidate_plans, rank_by_range
from quantscope.plan.phases import check_phases
from quantscope.repair.gated import gated_mlps, split_gated
from quantscope.rewrites.phases import same_weights, weight_digests
from quantscope.stages_llm import open_phase_models
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

SEQ, CHUNK = 32, 16
A16 = Precision.A16_W16


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The tiny decoder, its prefill split, and hailo10h with the 16-bit size limit at
    1,000 values: prefill's [32, 48] gated products are over it, a [16, 48] chunk and
    decode's [1, 48] under it."""
    import quantscope.targets as targets

    folder = tmp_path_factory.mktemp("gated")
    models = open_phase_models(byte_decoder(folder))
    text = (Path(targets.__file__).parent / "hailo10h.toml").read_text()
    toml = folder / "small10h.toml"
    toml.write_text(text.replace("max_values = { value = 98304", "max_values = { value = 1000")
                    .replace('name = "hailo10h"', 'name = "small10h"'))
    pre = models["prefill"]
    r = split_gated(pre, seq_len=SEQ, shapes=phase_shapes(pre, "prefill", SEQ), chunk=CHUNK)
    return models, load_proto(r.proto, "<split>"), load_target(toml), r


def test_each_mlp_is_found_and_split_into_chunks(setup) -> None:
    models, split, _, r = setup
    assert gated_mlps(models["prefill"]) == {
        f"layers.{i}.mlp.gated": (f"layers.{i}.gate_proj", f"layers.{i}.up_proj",
                                  f"layers.{i}.mlp.gated", f"layers.{i}.down_proj")
        for i in range(2)}
    names = {g.name for g in find_groups(split).groups}
    for part in ("gate_proj", "up_proj", "mlp.gated", "down_proj"):
        assert {f"layers.0.{part}/tok0", f"layers.0.{part}/tok1"} <= names
        assert f"layers.0.{part}" not in names
    assert "layers.0.down_proj/concat" in names  # the Concat comes after the down projection
    assert dict(r.effect)["mlps"] == 2 and dict(r.effect)["chunks"] == 2
    # nothing else is split: attention, norms and residual Adds keep their names
    assert {"layers.0.q_proj", "layers.0.mlp_norm", "layers.0.mlp_residual"} <= names


def test_fp32_is_the_same_and_the_weights_shared(setup) -> None:
    models, split, _, _ = setup
    a = ort.InferenceSession(models["prefill"].proto.SerializeToString())
    b = ort.InferenceSession(split.proto.SerializeToString())
    for length in (SEQ, CHUNK // 2, SEQ + 5):  # longer inputs: a wider last chunk
        ids = np.random.default_rng(length).integers(0, 256, (1, length)).astype(np.int64)
        for x, y in zip(a.run(None, {"input_ids": ids}), b.run(None, {"input_ids": ids}),
                        strict=True):
            np.testing.assert_allclose(y, x, atol=1e-4, rtol=1e-4)
    same_weights("gatedsplit", {"prefill": weight_digests(split.proto),
                                "decode": weight_digests(models["decode"].proto)})
    whole = {n.name: n for n in models["prefill"].graph.node}
    for n in split.graph.node:
        if n.op_type == "MatMul" and "/tok" in n.name:  # each chunk reads the same weight
            assert n.input[1] == whole[n.name.rsplit("/", 1)[0]].input[1]


def test_the_chunks_are_legal_at_16_bit_where_the_whole_was_not(setup) -> None:
    models, split, target, _ = setup
    pre = models["prefill"]
    shapes = phase_shapes(pre, "prefill", SEQ)
    whole = Plan(default=Precision.A8_W8, target=target.name,
                 overrides=(("layers.0.mlp.gated", A16),))
    assert {p.rule for p in check(whole, find_groups(pre), pre, target, shapes=shapes)
            if p.severity == "error"} == {"hailo.super_defuse"}
    chunks = Plan(default=Precision.A8_W8, target=target.name,
                  overrides=(("layers.0.mlp.gated/tok0", A16), ("layers.0.mlp.gated/tok1", A16)))
    assert not [p for p in check(chunks, find_groups(split), split, target, shapes=shapes)
                if p.severity == "error"]


def test_the_down_projection_reads_the_16_bit_chunk(setup) -> None:
    """No 8-bit Concat between a 16-bit gated chunk and the down projection: the chunk
    Linear reads the gated chunk's own (16-bit) encoding."""
    from quantscope.calibrate.collect import calibrate
    from quantscope.emulate.qdq import plan_encodings, scheme_for

    _, split, target, _ = setup
    ids = np.random.default_rng(0).integers(0, 256, (1, SEQ)).astype(np.int64)
    groups = find_groups(split)
    stats = calibrate(split, groups, [{"input_ids": ids}])
    plan = Plan(default=Precision.A8_W8, target="hailo10h",
                overrides=(("layers.0.mlp.gated/tok0", A16), ("layers.0.mlp.gated/tok1", A16)))
    enc, _ = plan_encodings(split, stats, plan, scheme=scheme_for(plan), groups=groups)
    down = {n.name: n for n in split.graph.node}["layers.0.down_proj/tok0"]
    assert down.input[0] == "layers.0.mlp.gated/tok0"
    assert enc.activations[down.input[0]].bits == 16


def test_the_planner_promotes_a_split_group_with_its_whole_decode_group(setup) -> None:
    models, split, target, _ = setup
    phases = {"prefill": split, "decode": models["decode"]}
    ranked = rank_by_range(find_groups(split), [])
    plans = candidate_plans(phases, target, ranked, SEQ, 1.5)
    plan = plans["act16"]
    pre = dict(plan.for_phase("prefill").overrides)
    dec = dict(plan.for_phase("decode").overrides)
    assert pre["layers.0.mlp.gated/tok0"] is A16 and pre["layers.0.mlp.gated/tok1"] is A16
    assert dec["layers.0.mlp.gated"] is A16
    assert "layers.0.mlp.gated" not in dict(plan.overrides)  # not in the prefill graph
    # no longer decode-only: the gated products are 16 bit in both phases
    for p in plans.values():
        assert not any(n.endswith("mlp.gated") for n in p.phase_overrides().get("decode", {})
                       if n not in dec)
    for label, p in plans.items():
        if not label.startswith("act16"):
            continue  # uniform 16 bit, residual16: refused here, as on the unsplit graphs
        checks = check_phases(p, phases, target, SEQ)
        assert all(c.errors == 0 for c in checks), label
        assert all(c.cost <= 1.5 for c in checks), label
        # a weighted unit has one precision in both phases (one set of weights)
        pre_p, dec_p = dict(p.for_phase("prefill").overrides), dict(p.for_phase("decode").overrides)
        for name, prec in dec_p.items():
            if name.endswith("_proj"):
                for i in range(2):
                    assert pre_p.get(f"{name}/tok{i}", pre_p.get(name)) is prec, (label, name)


def test_gptq_rounds_a_chunked_weight_once_as_the_whole_layer(setup) -> None:
    """The chunks of one Linear read one weight: GPTQ rounds it once on H over all the
    chunks' rows, which is the whole layer's H, so the split graph gets the unsplit
    graph's weights."""
    from quantscope.repair.gptq import gptq

    models, split, _, _ = setup
    feeds = [{"input_ids": np.random.default_rng(i).integers(0, 256, (1, SEQ)).astype(np.int64)}
             for i in range(3)]
    plan = Plan(default=Precision.A8_W4, target="hailo10h")
    whole = gptq(models["prefill"], feeds, plan)
    chunked = gptq(split, feeds, plan)
    weight = {n.name: n for n in split.graph.node}["layers.0.down_proj/tok0"].input[1]
    assert weight in {c.tensor for c in chunked.changes}
    assert not [s for s in chunked.skipped if "more than one node" in s[1]]
    a = {t.name: t for t in whole.proto.graph.initializer}
    b = {t.name: t for t in chunked.proto.graph.initializer}
    from onnx import numpy_helper

    for c in whole.changes:
        np.testing.assert_allclose(numpy_helper.to_array(b[c.tensor]),
                                   numpy_helper.to_array(a[c.tensor]), atol=1e-6)


def test_a_unit_plan_at_4_bit_weights_checks_on_both_phases(setup) -> None:
    """w4_variant's plan: a split layer's chunks in prefill and the whole layer in decode
    at a8_w4, their Concat left alone; every name exists in its phase graph."""
    from quantscope.plan.phase_search import phase_units, with_units

    models, split, target, _ = setup
    phases = {"prefill": split, "decode": models["decode"]}
    units = phase_units({p: find_groups(m) for p, m in phases.items()})
    base = Plan(default=Precision.A8_W8, target="hailo10h",
                overrides=(("layers.0.mlp_norm", A16),))
    four = with_units(base, ["layers.0.down_proj", "layers.1.q_proj"], Precision.A8_W4, units)
    pre, dec = dict(four.for_phase("prefill").overrides), dict(four.for_phase("decode").overrides)
    assert dict(four.overrides) == {"layers.0.mlp_norm": A16, "layers.1.q_proj": Precision.A8_W4}
    assert pre["layers.0.down_proj/tok0"] is pre["layers.0.down_proj/tok1"] is Precision.A8_W4
    assert "layers.0.down_proj/concat" not in pre and dec["layers.0.down_proj"] is Precision.A8_W4
    check_phases(four, phases, load_target("hailo10h"), SEQ)  # no unknown group name


def test_the_recipe_step_splits_prefill_only_where_the_rule_refuses(setup, tmp_path) -> None:
    """``gatedsplit`` in the decoder recipe: the prefill MLPs in chunks of the largest
    token count the target allows at 16 bit (the 1,000-value rule at 32 tokens: 16),
    decode unchanged; not applied where the whole fits (hailo10h at 32 tokens)."""
    from quantscope.stages_llm import recipe_phase_files

    _, _, target, _ = setup
    model = byte_decoder(tmp_path)
    out = tmp_path / "r" / "model.prefill.onnx"
    out.parent.mkdir()
    notes = recipe_phase_files(model, ("gatedsplit",), out, seq_len=SEQ,
                               target=str(target.source))
    assert "2 chunks of 16 tokens" in notes["gatedsplit"]["prefill"]
    assert "FP32 max relative diff" in notes["gatedsplit"]["prefill"]
    assert notes["gatedsplit"]["decode"].startswith("unchanged")
    split = open_phase_models(out)
    names = {g.name for g in find_groups(split["prefill"]).groups}
    assert {"layers.1.mlp.gated/tok0", "layers.1.mlp.gated/tok1"} <= names
    assert "layers.1.mlp.gated" in {g.name for g in find_groups(split["decode"]).groups}
    assert (out.parent / "model.tokenizer.json").is_file()
    whole = tmp_path / "w" / "model.prefill.onnx"
    whole.parent.mkdir()
    notes = recipe_phase_files(model, ("gatedsplit",), whole, seq_len=SEQ, target="hailo10h")
    assert notes["gatedsplit"]["prefill"].startswith("not applied")
    assert "layers.1.mlp.gated" in {g.name for g in find_groups(
        open_phase_models(whole)["prefill"]).groups}


def test_the_verdict_counts_a_split_layer_once() -> None:
    """A layer at 16 bit as chunks in prefill and whole in decode is one of the plan's
    16-bit groups (and one split), not a prefill-only and a decode-only one."""
    from quantscope.pipeline.decoder_report import _counts

    doc = {"default": "a8_w8", "groups": {"a": "a16_w16", "b": "a16_w16"}}
    own = {"prefill": {"l.gated/tok0": "a16_w16", "l.gated/tok1": "a16_w16", "x": "a16_w16"},
           "decode": {"l.gated": "a16_w16", "y": "a16_w16"}}
    assert _counts(doc, own) == {"overrides": 3, "split": 1,
                                 "phase_only": {"prefill": 1, "decode": 1}}
