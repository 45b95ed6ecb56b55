"""Refined cuts (analyze/cuts.py): a U-Net's skips keep several activations crossing every
position after its first block, so the single-stream cuts left one segment holding nearly
every group and the sweeps ran nearly the whole model per candidate. The segments are
now cut where several activations cross too, within a budget; the figures are the same to
the last digit and fewer nodes run."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import tiny_models as tm
from onnx import helper

from quantscope.analyze import Scorer, sweep_naive, sweep_segments
from quantscope.analyze import cuts as cuts_mod
from quantscope.analyze import segments as seg_mod
from quantscope.analyze import sweeps as sweeps_mod
from quantscope.analyze.cuts import REFINE_GROUPS, sample_bytes
from quantscope.analyze.incremental import IncrementalRunner, crossing
from quantscope.analyze.segments import find_segments, live_tensors
from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Plan, Precision, QuantScheme

LOW, HIGH = Precision.A8_W8, Precision.A16_W16
LEVELS, CH, WIDE = 8, 4, 256


def _unet(levels: int = LEVELS) -> onnx.ModelProto:
    """A 1-D U-Net: an encoder of ``levels`` Conv+Relu blocks (each after the first
    halving the length), each output a skip read again by the decoder (deepest first: a
    ConvTranspose doubling the length, the Add of the skip, Conv+Relu). The first block's
    output crosses every position up to the last Add: no single activation crosses after
    it, and the skips crossing a decoder position hold under twice the largest tensor."""
    rng = np.random.default_rng(0)
    nodes, inits, x, skips = [], [], "x", []

    def weights(name: str, shape: tuple[int, ...]) -> list[str]:
        w = (rng.normal(0, 1, shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
        b = rng.normal(0, 0.1, CH).astype(np.float32)
        inits.extend([onnx.numpy_helper.from_array(w, f"{name}.w"),
                      onnx.numpy_helper.from_array(b, f"{name}.b")])
        return [f"{name}.w", f"{name}.b"]

    def conv(name: str, src: str, stride: int = 1) -> str:
        nodes.extend([helper.make_node("Conv", [src, *weights(name, (CH, CH, 3))],
                                       [f"{name}.c"], name=f"{name}/Conv", pads=[1, 1],
                                       strides=[stride]),
                      helper.make_node("Relu", [f"{name}.c"], [f"{name}.r"],
                                       name=f"{name}/Relu")])
        return f"{name}.r"

    for i in range(levels):
        x = conv(f"enc{i}", x, stride=1 if i == 0 else 2)
        skips.append(x)
    for i in reversed(range(levels - 1)):
        nodes.append(helper.make_node("ConvTranspose", [x, *weights(f"up{i}", (CH, CH, 2))],
                                      [f"up{i}.y"], name=f"up{i}/ConvTranspose",
                                      strides=[2]))
        nodes.append(helper.make_node("Add", [f"up{i}.y", skips[i]], [f"dec{i}.sum"],
                                      name=f"dec{i}/Add"))
        x = conv(f"dec{i}", f"dec{i}.sum")
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    shape = ["N", CH, WIDE]
    graph = helper.make_graph(nodes, "unet",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, shape)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return onnx.shape_inference.infer_shapes(model)


@pytest.fixture(scope="module")
def unet():
    model = load_proto(_unet(), "tiny-unet")
    groups = find_groups(model)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, (2, CH, WIDE)).astype(np.float32)} for _ in range(3)]
    return model, groups, calibrate(model, groups, feeds), feeds


@pytest.fixture
def single_stream(monkeypatch):
    """The cuts as before: no segment refined."""
    def off() -> None:
        monkeypatch.setattr(cuts_mod, "REFINE_GROUPS", 10**9)
    return off


def test_a_unet_is_cut_where_several_activations_cross(unet, single_stream):
    model, groups, _, _ = unet
    segments = find_segments(model, groups)
    assert sorted(x for s in segments for x in s.groups) == sorted(groups.names())
    # the refined cuts hold several activations (the skips and the stream)
    assert max(len(c) for c in crossing(model, segments)[:-1]) > 2
    single_stream()
    old = find_segments(model, groups)
    # before: the first block, then every group up to the last skip's Add in one segment
    assert [len(s.groups) for s in old] == [1, len(groups.groups) - 2, 1, 0]
    g = len(old[1].groups)
    assert g > REFINE_GROUPS
    step = math.ceil(g / math.ceil(math.sqrt(g)))
    assert len(segments) >= len(old) - 1 + math.ceil(g / step)
    assert max(len(s.groups) for s in segments) <= step


def test_a_refined_cut_fits_the_budget_and_the_estimate_counts_it(unet):
    model, groups, _, feeds = unet
    segments = find_segments(model, groups)
    size = sample_bytes(model)
    largest = CH * WIDE * 4
    assert max(size.values()) == largest
    live = live_tensors(model, groups, segments)
    for k, c in enumerate(crossing(model, segments)[:-1]):
        assert sum(size[t] for t in c) <= cuts_mod.CUT_BUDGET * largest
        # what the sweep's estimate sums while the next segment runs holds the cut's tensors
        assert set(c) <= set(live[k + 1]) | set(model.input_names())


def test_a_tight_budget_leaves_the_single_stream_cuts(unet, monkeypatch):
    model, groups, _, _ = unet
    monkeypatch.setattr(cuts_mod, "CUT_BUDGET", 1.0)  # the largest skip alone
    assert len(find_segments(model, groups)) == 4


@pytest.mark.parametrize("name", ["layernorm_block", "attention", "residual_add"])
def test_models_the_single_stream_cuts_serve_keep_their_segments(name, single_stream):
    model = load_proto(tm.ALL[name](), name)
    groups = find_groups(model)
    now = find_segments(model, groups)
    single_stream()
    assert find_segments(model, groups) == now


def _counting(monkeypatch) -> list[int]:
    """Count the model's nodes every segment run executes (Q/DQ left out)."""
    ran: list[int] = []
    size: dict[int, int] = {}
    make, run = seg_mod.make_session, seg_mod.run_segment

    def made(proto, *a, **kw):
        sess = make(proto, *a, **kw)
        size[id(sess)] = sum(n.op_type not in {"QuantizeLinear", "DequantizeLinear"}
                             for n in proto.graph.node)
        return sess

    def counted(sess, names, env):
        ran.append(size[id(sess)] if names else 0)
        return run(sess, names, env)

    monkeypatch.setattr(seg_mod, "make_session", made)
    monkeypatch.setattr(seg_mod, "run_segment", counted)
    monkeypatch.setattr(sweeps_mod, "run_segment", counted)
    return ran


def test_the_sweep_gives_the_same_figures_running_fewer_nodes(unet, single_stream,
                                                             monkeypatch):
    model, groups, stats, feeds = unet
    kw = {"scorer": Scorer(), "low": LOW, "high": HIGH}
    ran = _counting(monkeypatch)
    refined = sweep_segments(model, groups, stats, feeds, **kw)
    refined_nodes = sum(ran)
    ran.clear()
    single_stream()
    old = sweep_segments(model, groups, stats, feeds, **kw)
    old_nodes = sum(ran)
    assert [c.group for c in refined.candidates] == [c.group for c in old.candidates]
    for a, b in zip(refined.rows, old.rows, strict=True):
        np.testing.assert_array_equal(a, b)  # to the last digit
    np.testing.assert_array_equal(refined.ref_rows, old.ref_rows)
    np.testing.assert_array_equal(refined.low_rows, old.low_rows)
    assert refined.noise_cumulative == old.noise_cumulative
    assert refined.noise_isolated == old.noise_isolated
    assert refined_nodes < 0.8 * old_nodes
    naive = sweep_naive(model, groups, stats, feeds, **kw)
    for a, b in zip(refined.rows, naive.rows, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_incremental_plans_equal_the_single_stream_cuts(unet, single_stream):
    model, groups, stats, feeds = unet
    scheme = QuantScheme()
    names = groups.names()
    plans = [Plan.uniform(LOW), Plan(default=LOW, overrides=((names[-3], HIGH),)),
             Plan(default=LOW, overrides=((names[2], HIGH), (names[-3], HIGH)))]
    runner = IncrementalRunner(model, stats, feeds, scheme=scheme)
    refined = [runner.outputs(p) for p in plans]
    single_stream()
    old_runner = IncrementalRunner(model, stats, feeds, scheme=scheme)
    assert len(old_runner.segments) < len(runner.segments)
    for plan, got in zip(plans, refined, strict=True):
        want = old_runner.outputs(plan)
        for x, y in zip(got.batches, want.batches, strict=True):
            for u, v in zip(x, y, strict=True):
                np.testing.assert_array_equal(u, v)
    assert runner.counts.segments_skipped > 0


def test_the_share_of_nodes_the_candidates_run_drops(unet, single_stream):
    from quantscope.analyze.candidates import candidates, encodings_table
    from quantscope.analyze.segments import owned_segments, run_share

    model, groups, stats, _ = unet
    table = encodings_table(model, groups, stats, (LOW, HIGH))
    cands = candidates(groups, LOW, HIGH)

    def share() -> float:
        segments = find_segments(model, groups)
        return run_share(segments, owned_segments(model, groups, segments, table, cands, LOW))

    refined = share()
    single_stream()
    assert refined < 0.8 * share() <= 0.8
