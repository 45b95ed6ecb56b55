"""An analysis of a model whose tensors are large (IS-Net at 1024 x 1024: feature maps of
64-268 MB, 118.5 MB of output values a sample) in bounded memory, with the same figures:

* the fidelity metrics and collapse indicators sum their float64 copies a block of
  columns at a time (``numerics.BLOCK_VALUES``);
* a chain's segment returns the group outputs only where a noise is summed, and those
  of the cumulative noise ``sweeps.TAP_BYTES`` at a time, in the chains' own pass before
  any candidate's sessions are built;
* disable-one's windows run the all-``low`` chain alone, and only up to the segment their
  candidates start from;
* a model of large tensors runs its sessions without an ONNX Runtime arena.
"""

import numpy as np
import onnx
import pytest
from onnx import helper
from sweep_helpers import assert_same_sweep, prepared

from quantscope import numerics
from quantscope.analyze import Scorer, sweep_segments
from quantscope.emulate.session import LARGE_TENSOR_BYTES, use_arena
from quantscope.tasks import metrics
from quantscope.types import Precision

WIDTH, ROWS = 32, 256


def _skip_model() -> onnx.ModelProto:
    """x -> mm0 -> relu (h0) -> mm1 -> relu -> mm2, + h0 (a skip, as a U-Net's), -> mm3:
    the skip keeps two tensors live, so one segment holds three groups and their outputs
    are taps, not crossing tensors."""
    rng = np.random.default_rng(1)
    inits, nodes = [], []
    for i in range(4):
        w = (rng.normal(0, 1, (WIDTH, WIDTH)) / np.sqrt(WIDTH)).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(w, f"w{i}"))
    nodes += [helper.make_node("MatMul", ["x", "w0"], ["m0"], name="mm0"),
              helper.make_node("Relu", ["m0"], ["h0"], name="relu0"),
              helper.make_node("MatMul", ["h0", "w1"], ["m1"], name="mm1"),
              helper.make_node("Relu", ["m1"], ["h1"], name="relu1"),
              helper.make_node("MatMul", ["h1", "w2"], ["m2"], name="mm2"),
              helper.make_node("Add", ["h0", "m2"], ["s"], name="add"),
              helper.make_node("MatMul", ["s", "w3"], ["y"], name="mm3")]
    graph = helper.make_graph(
        nodes, "skip", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", WIDTH])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _prepared():
    return prepared(_skip_model(), "skip", ROWS, WIDTH)


KW = {"scorer": Scorer(), "low": Precision.A8_W8, "high": Precision.A16_W16}


def test_taps_in_parts_and_one_candidate_windows_give_the_same_sweep(monkeypatch):
    from quantscope.analyze import sweeps

    model, groups, stats, feeds = _prepared()
    whole = sweep_segments(model, groups, stats, feeds, **KW)
    assert len(whole.noise_cumulative) >= 3 and len(whole.noise_isolated) >= 3
    asked: list[list[str]] = []
    real = sweeps.run_segment

    def recorded(sess, names, env):
        asked.append(list(names))
        return real(sess, names, env)

    monkeypatch.setattr(sweeps, "run_segment", recorded)
    monkeypatch.setattr(sweeps, "TAP_BYTES", 1)  # every tap a part of its own
    parts = sweep_segments(model, groups, stats, feeds, session_budget=1, **KW)
    assert_same_sweep(whole, parts)
    from quantscope.analyze.segments import find_segments

    segments = find_segments(model, groups)
    crossing = {t for seg in segments for t in seg.outputs}
    taps = {t for g in groups.groups for t in g.outputs} - crossing  # taps alone
    assert taps  # the skip keeps them inside one segment
    asked_taps = [t for names in asked for t in names if t in taps]
    windows = len(parts.candidates)  # one candidate a window
    enable = sum(c.sweep == "enable_one" for c in parts.candidates)
    # every chain returned every tap in every window before: now each tap once per chain
    # and batch in a sweep's first window (the cumulative noise; enable-one has one
    # chain), and later only what a window's enable-one candidate kept
    assert max(len(set(names) & taps) for names in asked if set(names) & taps) == 1
    assert len(asked_taps) <= (3 * len(taps) + enable) * len(feeds)
    assert len(asked_taps) < windows * 2 * len(taps) * len(feeds) / 2


def test_sessions_without_an_arena_give_the_same_sweep(monkeypatch):
    from quantscope.analyze import sweeps

    model, groups, stats, feeds = _prepared()
    with_arena = sweep_segments(model, groups, stats, feeds, **KW)
    monkeypatch.setattr(sweeps, "use_arena", lambda largest: False)
    assert_same_sweep(with_arena, sweep_segments(model, groups, stats, feeds, **KW))


def test_the_arena_rule_follows_the_largest_tensor():
    assert use_arena(LARGE_TENSOR_BYTES - 1) and not use_arena(LARGE_TENSOR_BYTES)


@pytest.mark.parametrize("shape", [(4, 3000), (3, 5, 7, 11), (6, 1)])
def test_metrics_summed_in_blocks_equal_the_whole_array(monkeypatch, shape):
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 3, shape).astype(np.float32)
    test = (ref + rng.normal(0, 0.1, shape)).astype(np.float32)
    test[0] = ref[0]  # an identical row: cosine exactly 1
    whole = (numerics.sqnr_db(ref, test), numerics.row_cosines(ref, test),
             numerics.squared_error_rows(ref, test))
    monkeypatch.setattr(numerics, "BLOCK_VALUES", 7)
    assert len(numerics.column_blocks(ref.reshape(len(ref), -1))) > 1 or shape[1] == 1
    blocks = (numerics.sqnr_db(ref, test), numerics.row_cosines(ref, test),
              numerics.squared_error_rows(ref, test))
    assert blocks[0] == pytest.approx(whole[0], rel=1e-12)
    np.testing.assert_allclose(blocks[1], whole[1], rtol=1e-12)
    assert blocks[1][0] == 1.0
    np.testing.assert_allclose(blocks[2], whole[2], rtol=1e-12)


def test_collapse_indicators_from_the_gram_equal_the_rows(monkeypatch):
    rng = np.random.default_rng(2)
    ref = rng.normal(0, 1, (6, 500)).astype(np.float32)
    test = (ref + rng.normal(0, 0.3, ref.shape)).astype(np.float32)
    test[5] = 0.0  # a zero row: cosine 0 with every other row
    metrics._REF_INDICATORS.clear()
    whole = metrics.collapse_report(test, ref)
    monkeypatch.setattr(numerics, "BLOCK_VALUES", 64)
    metrics._REF_INDICATORS.clear()
    gram = metrics.collapse_report(test, ref)
    for key in ("norm_cv", "mean_pairwise_cosine", "effective_rank", "ref_norm_cv",
                "ref_mean_pairwise_cosine", "ref_effective_rank"):
        assert getattr(gram, key) == pytest.approx(getattr(whole, key), rel=1e-9), key
    assert gram.collapsed == whole.collapsed and gram.reasons == whole.reasons


def test_the_estimate_counts_what_the_process_holds_before_the_sweep():
    from quantscope.analyze.memory import plan_memory

    model, _, _, feeds = _prepared()
    bare = plan_memory(model, [1 << 20] * 3, feeds, [], chains=2, available=1 << 40)
    held = plan_memory(model, [1 << 20] * 3, feeds, [], chains=2, available=1 << 40,
                       resident=700 << 20)
    assert held.peak == bare.peak + (700 << 20) and held.windows == bare.windows
    assert "~700 MB held before it" in held.text() and "held before" not in bare.text()


def test_disable_one_windows_run_the_low_chain_alone_up_to_their_candidates(monkeypatch):
    from quantscope.analyze import sweeps
    from quantscope.analyze.segments import find_segments

    model, groups, stats, feeds = _prepared()
    whole = sweep_segments(model, groups, stats, feeds, sweeps=("disable_one",), **KW)
    chains: dict[int, str] = {}  # session id -> the chain it belongs to
    real_chain, real_run = sweeps.build_chain, sweeps.run_segment

    def chain(model_, groups_, segments, encodings, **kw):
        c = real_chain(model_, groups_, segments, encodings, **kw)
        chains.update({id(s): "fp" if encodings is None else "lo" for s in c.sessions})
        return c

    runs: list[str] = []

    def run(sess, names, env):
        runs.append(chains.get(id(sess), "candidate"))
        return real_run(sess, names, env)

    monkeypatch.setattr(sweeps, "build_chain", chain)
    monkeypatch.setattr(sweeps, "run_segment", run)
    monkeypatch.setattr(sweeps, "TAP_BYTES", 1)
    windowed = sweep_segments(model, groups, stats, feeds, sweeps=("disable_one",),
                              session_budget=1, **KW)  # one candidate a window
    assert_same_sweep(whole, windowed)
    segments = find_segments(model, groups)
    seg_of = {g: s.index for s in segments for g in s.groups}
    taps = sum(len({t for g in s.groups for t in groups.by_name()[g].outputs}
                   - set(s.outputs)) or 1 for s in segments)
    # FP32's chain ran in the chains' own pass only (every segment, once per tap part)
    assert 0 < runs.count("fp") <= taps * len(feeds)
    # the all-low chain: that pass, then in each window up to its candidate's segment
    starts = sum(seg_of[c.names[0]] for c in windowed.candidates)
    assert runs.count("lo") <= (taps + starts) * len(feeds)
    assert runs.count("lo") < (taps + len(segments) * len(windowed.candidates)) * len(feeds)


def test_the_estimate_takes_the_larger_of_the_chains_pass_and_a_window():
    from quantscope.analyze.memory import plan_memory

    model, _, _, feeds = _prepared()
    window = plan_memory(model, [1 << 20] * 3, feeds, [], chains=1, available=1 << 40)
    small = plan_memory(model, [1 << 20] * 3, feeds, [], chains=1, available=1 << 40,
                        prepass=(2, 1 << 10))
    large = plan_memory(model, [1 << 20] * 3, feeds, [], chains=1, available=1 << 40,
                        prepass=(2, 900 << 20))
    assert small.peak == window.peak and small.windows == window.windows
    assert large.peak == window.peak - (window.model_bytes + window.session_bytes
                                        + window.activation_bytes + window.row_bytes) \
        + 2 * (window.model_bytes + (900 << 20))
    assert "the chains' own pass ~1800 MB" in large.text()


def test_a_disable_one_sweep_of_no_candidate_gives_the_chains_figures():
    model, groups, stats, feeds = _prepared()
    whole = sweep_segments(model, groups, stats, feeds, sweeps=("disable_one",), **KW)
    none = sweep_segments(model, groups, stats, feeds, sweeps=("disable_one",), only=(), **KW)
    assert none.candidates == () and none.rows == ()
    np.testing.assert_array_equal(none.ref_rows, whole.ref_rows)
    np.testing.assert_array_equal(none.low_rows, whole.low_rows)
    assert none.noise_cumulative == whole.noise_cumulative
