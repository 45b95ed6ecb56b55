"""finetune.phases: one set of weights distilled for a decoder's two phase graphs under
one plan, measured in ONNX Runtime on held-out windows (tiny decoder)."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_tiny import TINY, phase_graphs, run_graph
from onnx import numpy_helper

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.qdq import quantize_model
from quantscope.finetune.phases import PhaseTuneConfig, distill_phases
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.tasks.lm import log_softmax
from quantscope.types import Plan, Precision, QuantScheme, QuantscopeError

SEQ = 12
# 4-bit weights: an error the weights can learn to compensate (on the tiny decoder a8_w8's
# KL, about 0.014, is rounding noise that 20 steps do not move)
PLAN = Plan.uniform(Precision.A8_W4)


def _windows(n, seed):
    return [np.random.default_rng(seed + i).integers(0, TINY.vocab, SEQ).astype(np.int64)
            for i in range(n)]


def _decode_feeds(prefill, windows):
    for w in windows:
        out = run_graph(prefill.proto, {"input_ids": w[None]})
        for t in (SEQ // 2, SEQ - 2):
            yield {"input_ids": w[None, t:t + 1],
                   **{k.replace("present.", "past."): v[:, :, :t] for k, v in out.items()
                      if k.startswith("present.")}}


def _stats(graphs, windows):
    return {"prefill": calibrate(graphs["prefill"], find_groups(graphs["prefill"]),
                                 [{"input_ids": w[None]} for w in windows]),
            "decode": calibrate(graphs["decode"], find_groups(graphs["decode"]),
                                list(_decode_feeds(graphs["prefill"], windows)))}


def _kl(ref, test):
    lr, lt = log_softmax(ref), log_softmax(test)
    return float((np.exp(lr) * (lr - lt)).sum(-1).mean())


def _held_out_kl(graphs, reference, windows, calib):
    """Each phase's QDQ graph (calibrated on ``calib``) against the FP32 ``reference``."""
    stats = _stats(graphs, calib)
    q = {p: quantize_model(graphs[p], stats[p], PLAN, scheme=QuantScheme(weight_signed=False))
         for p in graphs}
    pre = np.mean([_kl(run_graph(reference["prefill"].proto, {"input_ids": w[None]})["logits"],
                       run_graph(q["prefill"].proto, {"input_ids": w[None]})["logits"])
                   for w in windows])
    feeds = list(_decode_feeds(reference["prefill"], windows))
    dec = np.mean([_kl(run_graph(reference["decode"].proto, f)["logits"],
                       run_graph(q["decode"].proto, f)["logits"]) for f in feeds])
    return pre, dec


def _with(graphs, weights):
    out = {}
    for p, m in graphs.items():
        proto = type(m.proto)()
        proto.CopyFrom(m.proto)
        for t in proto.graph.initializer:
            if t.name in weights:
                t.CopyFrom(numpy_helper.from_array(weights[t.name], t.name))
        out[p] = Model(proto=proto, source=f"{m.source} tuned")
    return out


def test_both_phases_distilled_lower_their_held_out_kl_in_ort():
    graphs = phase_graphs()
    train, held = _windows(16, 0), _windows(6, 1000)
    before = _held_out_kl(graphs, graphs, held, train[:8])
    res = distill_phases(graphs, _stats(graphs, train[:8]), PLAN, train,
                         PhaseTuneConfig(steps=20, lr=6e-4, batch=2, decode_positions=2))
    names = {t.name for t in graphs["decode"].graph.initializer}
    assert set(res.weights) <= names and len(res.weights) >= TINY.layers * 7
    moved = [n for n, w in res.weights.items() if not np.array_equal(
        w, numpy_helper.to_array(next(t for t in graphs["prefill"].graph.initializer
                                      if t.name == n)))]
    assert len(moved) == len(res.weights)  # every tied weight trained
    after = _held_out_kl(_with(graphs, res.weights), graphs, held, train[:8])
    # measured: prefill 0.36 -> 0.27, decode 0.22 -> 0.11
    assert after[0] < 0.85 * before[0] and after[1] < 0.75 * before[1], (before, after)
    assert res.steps == 20 and "20 steps" in res.summary()


def test_learned_grids_come_back_per_phase_without_the_kv_cache_and_pin_in_ort():
    import dataclasses

    from quantscope.emulate.encode import encode

    graphs = phase_graphs()
    train = _windows(8, 0)
    stats = _stats(graphs, train)
    res = distill_phases(graphs, stats, PLAN, train, PhaseTuneConfig(
        steps=2, lr=6e-4, batch=2, decode_positions=2, learn_ranges=True, range_lr=0.05))
    assert set(res.ranges) == {"prefill", "decode"}
    for phase, ranges in res.ranges.items():
        assert ranges and not any(k.startswith(("present.", "past.")) for k in ranges)
        pinned = dataclasses.replace(PLAN, pinned=tuple(sorted(ranges.items())))
        scheme = QuantScheme(weight_signed=False)
        groups = find_groups(graphs[phase])
        calibrated = encode(graphs[phase], groups, stats[phase], PLAN, scheme=scheme).activations
        learned = encode(graphs[phase], groups, stats[phase], pinned, scheme=scheme).activations

        def grid(e):
            qmin = -(2 ** (e.bits - 1)) if e.signed else 0
            z, sc = float(e.zero_point), float(e.scale)
            return (qmin - z) * sc, (qmin + 2 ** e.bits - 1 - z) * sc

        moved = [k for k in ranges if grid(calibrated[k]) != grid(learned[k])]
        assert len(moved) >= len(ranges) // 2, (phase, len(moved), len(ranges))
        for k in moved:  # the grid ORT runs is the one learned: its (lo, hi) comes back
            assert grid(learned[k]) == pytest.approx(ranges[k], rel=1e-5, abs=1e-7), k
    assert not distill_phases(graphs, stats, PLAN, train, PhaseTuneConfig(
        steps=1, batch=2, decode_positions=1)).ranges


def test_regridding_sets_the_grids_a_fresh_calibration_of_the_current_weights_gives():
    from quantscope.finetune.phases import _students, set_grids

    graphs = phase_graphs()
    train = _windows(8, 0)
    stats = _stats(graphs, train)
    pre, dec, _ = _students(graphs, stats, PLAN)
    # the same calibration changes nothing: set_grids writes what the student was built with
    assert set_grids(pre, graphs["prefill"], stats["prefill"], PLAN) == 0
    assert set_grids(dec, graphs["decode"], stats["decode"], PLAN) == 0
    seen = []

    def regrid(weights):
        seen.append(weights)
        return _stats(_with(graphs, weights), train)

    res = distill_phases(graphs, stats, PLAN, train, PhaseTuneConfig(
        steps=3, lr=3e-3, batch=2, decode_positions=2, regrid_every=2), regrid=regrid)
    assert [r["step"] for r in res.regrids] == [2] and len(seen) == 1
    assert all(r["grids_changed"] > 0 for r in res.regrids), res.regrids
    assert set(seen[0]) == set(res.weights)  # the tied weights, by initializer name


def test_a_decode_graph_with_weights_prefill_lacks_is_refused():
    graphs = phase_graphs()
    other = phase_graphs(seed=1)
    dec = other["decode"].proto  # one weight renamed, with its uses
    renamed = {t.name: t.name + ".other" for t in dec.graph.initializer
               if "q_proj.weight" in t.name}
    assert renamed
    for t in dec.graph.initializer:
        t.name = renamed.get(t.name, t.name)
    for node in dec.graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
    with pytest.raises(QuantscopeError, match="not one model's two phases"):
        distill_phases({"prefill": graphs["prefill"], "decode": other["decode"]},
                       _stats(graphs, _windows(4, 0)), PLAN, _windows(4, 0),
                       PhaseTuneConfig(steps=1))


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_the_first_step_sees_the_cpu_losses_and_the_weights_come_back():
    graphs = phase_graphs()
    train = _windows(4, 0)
    stats = _stats(graphs, train)
    runs = {d: distill_phases(graphs, stats, PLAN, train, PhaseTuneConfig(
        steps=2, lr=6e-4, batch=2, decode_positions=2, device=d)) for d in ("cpu", "cuda")}
    assert runs["cuda"].device.startswith("cuda") and runs["cpu"].device == "cpu"
    for key in ("prefill_kl", "decode_kl"):  # before any update: the same graphs, same feeds
        assert runs["cuda"].log[0][key] == pytest.approx(runs["cpu"].log[0][key], rel=1e-3)
    assert set(runs["cuda"].weights) == set(runs["cpu"].weights)
    assert all(isinstance(w, np.ndarray) for w in runs["cuda"].weights.values())


def test_the_schedule_anneals_within_the_steps_or_the_budget_whichever_ends_first():
    from quantscope.finetune.phases import schedule

    # by steps: a linear warm-up over the first tenth, then cosine to zero
    assert schedule(0, 20) == pytest.approx(0.5 * (1 + np.cos(0)) * 0.5)
    assert schedule(1, 20) == pytest.approx(0.5 * (1 + np.cos(np.pi / 20)))
    assert schedule(19, 20) < 0.01 and schedule(10, 20) == pytest.approx(0.5)
    # a time budget spent faster than the steps: the budget's share drives the cosine
    assert schedule(1, 3000, spent=50.0, budget=100.0) == pytest.approx(0.5)
    assert schedule(2, 3000, spent=99.0, budget=100.0) < 0.001
    # steps running out first: their share drives it, the budget is a bound
    assert schedule(10, 20, spent=1.0, budget=1e6) == pytest.approx(0.5)
