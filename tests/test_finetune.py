"""finetune: ONNX -> torch conversion, fake-quant parity with ORT, distillation, write-back."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
import tiny_models as tm
import torch

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import build_qdq
from quantscope.emulate.session import make_session
from quantscope.finetune.apply import finetuned_model, finetuned_plan, fp32_weights
from quantscope.finetune.distill import Distiller, FinetuneConfig, distill
from quantscope.finetune.fakequant import ActQuant, weight_qparams
from quantscope.finetune.graph import to_torch
from quantscope.finetune.objectives import OutputsLoss
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.numerics import qparams, sqnr_db, weight_encoding
from quantscope.serde import plan_from_dict, plan_to_dict
from quantscope.stages import forced_ranges
from quantscope.types import Plan, Precision, QuantScheme, QuantscopeError

HAILO = QuantScheme(weight_signed=False)  # hailo10h: unsigned symmetric weights


def _prepared(name, n=6, seed=0):
    model = load_proto(tm.ALL[name](), name)
    groups = find_groups(model)
    feeds = [tm.sample_inputs(model.proto, seed=seed + i) for i in range(n)]
    return model, groups, calibrate(model, groups, feeds), feeds


def _qdq(model, groups, stats, plan, scheme=None):
    return build_qdq(model, encode(model, groups, stats, plan, scheme=scheme or QuantScheme()))


def _torch_out(module, feeds):
    with torch.no_grad():
        return module(feeds)[0][0].numpy()


@pytest.mark.parametrize("name", list(tm.ALL))
def test_fp32_conversion_matches_ort(name):
    model, _, _, feeds = _prepared(name)
    ours = _torch_out(to_torch(model.proto), feeds[0])
    ref = make_session(model.proto).run(None, feeds[0])[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4)  # float32 sum order differs


def test_prelu_conversion_matches_ort():
    """PRelu (MobileFaceNet's activation): per-channel slopes, negative inputs scaled."""
    from onnx import helper, numpy_helper

    r = np.random.default_rng(5)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("PRelu", ["c", "slope"], ["y"])],
        "prelu", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 4, 8, 8])],
        [numpy_helper.from_array(r.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(np.array([0.1, 0.25, -0.5, 2.0], np.float32)
                                 .reshape(4, 1, 1), "slope")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": r.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)}
    ours = _torch_out(to_torch(proto), feeds)
    ref = make_session(proto).run(None, feeds)[0]
    assert (ref < 0).any() and (ref > 0).any()
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_row_statistics_conversion_matches_ort(op, keepdims):
    """ReduceMax / ReduceMin / ReduceSum (rowscale's row statistics, its softmax sum);
    opset 17: axes an attribute of Max/Min, an input of Sum."""
    from onnx import helper, numpy_helper

    r = np.random.default_rng(7)
    axes = [-1, 1]
    node = (helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims) if op == "ReduceSum"
            else helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims))
    graph = helper.make_graph(
        [node],
        "reduce", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 5])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(axes, np.int64), "axes")] if op == "ReduceSum" else [])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": r.normal(0, 1, (2, 3, 5)).astype(np.float32)}
    ours = _torch_out(to_torch(proto), feeds)
    ref = make_session(proto).run(None, feeds)[0]
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_position_ops_conversion_matches_ort(exclusive, reverse):
    """MPNet's position ids and relative-position buckets: CumSum over the mask, then
    Log and Min of distances (mpnet-base)."""
    from onnx import helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("CumSum", ["ids", "axis"], ["pos"], exclusive=exclusive,
                          reverse=reverse),
         helper.make_node("Cast", ["pos"], ["posf"], to=onnx.TensorProto.FLOAT),
         helper.make_node("Abs", ["x"], ["ax"]),
         helper.make_node("Add", ["ax", "one"], ["ax1"]),
         helper.make_node("Log", ["ax1"], ["lg"]),
         helper.make_node("Min", ["lg", "cap", "posf"], ["y"])],
        "positions",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["N", 6]),
         helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 6])],
        [numpy_helper.from_array(np.array(1, np.int64), "axis"),
         numpy_helper.from_array(np.array(1.0, np.float32), "one"),
         numpy_helper.from_array(np.array(1.5, np.float32), "cap")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"ids": np.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], np.int64),
             "x": np.random.default_rng(3).normal(0, 3, (2, 6)).astype(np.float32)}
    ours = _torch_out(to_torch(proto), feeds)
    ref = make_session(proto).run(None, feeds)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", list(tm.ALL))
@pytest.mark.parametrize("precision", [Precision.A8_W8, Precision.A8_W4])
@pytest.mark.parametrize("scheme", [None, HAILO])
def test_qdq_student_matches_ort_on_the_same_graph(name, precision, scheme):
    model, groups, stats, feeds = _prepared(name)
    qdq = _qdq(model, groups, stats, Plan.uniform(precision), scheme)
    student = to_torch(qdq, float_weights=fp32_weights(model), scheme=scheme)
    assert student.act_quants and student.weight_quants
    for f in feeds[:3]:
        ref = make_session(qdq).run(None, f)[0]
        np.testing.assert_allclose(_torch_out(student, f), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("signed,symmetric", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_weight_scales_equal_numerics(signed, symmetric, axis):
    w = np.random.default_rng(0).normal(0, 0.3, (6, 5)).astype(np.float32)
    ref = weight_encoding(w, 8, axis=axis, signed=signed, symmetric=symmetric)
    scale, zp = weight_qparams(torch.from_numpy(w), axis, 8, signed, symmetric)
    np.testing.assert_array_equal(scale.numpy().reshape(-1), ref.scale.reshape(-1))
    np.testing.assert_array_equal(zp.numpy().reshape(-1), ref.zero_point.reshape(-1))


@pytest.mark.parametrize("bits", [8, 16])
def test_learned_range_reencodes_to_the_same_grid(bits):
    enc = qparams(-1.3, 4.1, bits, signed=False, symmetric=False)
    q = ActQuant("t", enc.scale, enc.zero_point, bits, False)
    with torch.no_grad():
        q.log_scale.fill_(-0.37)
        q.zp_shift.fill_(5.4)
    scale, zp = (v.detach() for v in q.scale_zp())
    again = qparams(*q.range(), bits, signed=False, symmetric=False)
    assert float(again.scale) == float(scale) and int(again.zero_point) == int(zp)
    assert int(zp) == int(enc.zero_point) + 5


def test_alls_pins_a_range_method_only_where_it_moves_the_range():
    """An ``mse`` range on an 8-bit output is pinned (it clips); on a 16-bit output it is
    the calibrated min/max, which the compiler takes anyway: no line; a pinned range is
    written at any precision."""
    model, groups, stats, _ = _prepared("residual_add")
    g = groups.groups[0]
    t = g.outputs[0]
    for precision, pins in ((Precision.A8_W8, True), (Precision.A16_W16, False)):
        plan = Plan(default=Precision.A8_W8, overrides=((g.name, precision),),
                    ranges=((t, "mse"),))
        enc = encode(model, groups, stats, plan, scheme=QuantScheme())
        assert (g.name in forced_ranges(groups, plan, enc)) is pins, precision
        plan = Plan(default=Precision.A8_W8, overrides=((g.name, precision),),
                    ranges=((t, "minmax"),))
        assert g.name not in forced_ranges(groups, plan, encode(model, groups, stats, plan,
                                                                 scheme=QuantScheme()))
    plan = Plan(default=Precision.A16_W16, pinned=((t, (-0.5, 2.0)),))
    enc = encode(model, groups, stats, plan, scheme=QuantScheme())
    assert g.name in forced_ranges(groups, plan, enc)


def test_pinned_ranges_round_trip_and_drive_encode_and_alls():
    model, groups, stats, _ = _prepared("residual_add")
    t = groups.groups[0].outputs[0]
    plan = Plan(default=Precision.A8_W8, pinned=((t, (-0.5, 2.0)),))
    again = plan_from_dict(plan_to_dict(plan))
    assert again.pinned == plan.pinned
    enc = encode(model, groups, stats, plan, scheme=QuantScheme())
    lo, hi = enc.activations[t].range()
    assert abs(lo + 0.5) < 1e-2 and abs(hi - 2.0) < 1e-2
    assert any(abs(v[0] - lo) < 1e-5 for v in forced_ranges(groups, plan, enc).values())
    with pytest.raises(QuantscopeError, match="pinned"):
        plan_from_dict({"default": "a8_w8", "pinned": {"hb": [2.0, 1.0]}})


def test_unsupported_op_is_one_clear_error():
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    g = onnx.helper.make_graph([onnx.helper.make_node("Selu", ["x"], ["y"])], "g", [x], [y])
    with pytest.raises(QuantscopeError, match="Selu"):
        to_torch(onnx.helper.make_model(g))


def _distilled(name="layernorm_block", precision=Precision.A8_W4, steps=60, device="cpu",
               **kw):
    model, groups, stats, _ = _prepared(name, n=4)
    train = [tm.sample_inputs(model.proto, n=16, seed=100 + i) for i in range(12)]
    hold = [tm.sample_inputs(model.proto, n=16, seed=200 + i) for i in range(3)]
    plan = Plan.uniform(precision)
    student = to_torch(_qdq(model, groups, stats, plan), float_weights=fp32_weights(model))
    cfg = FinetuneConfig(steps=steps, lr=3e-3, range_lr=1e-2, eval_every=20, warmup=5,
                         device=device)
    res = distill(student, to_torch(model.proto), OutputsLoss(), train, hold, cfg, **kw)
    return model, groups, stats, plan, hold, student, res


def _ort_sqnr(model_proto, qdq, feeds):
    return np.mean([sqnr_db(make_session(model_proto).run(None, f)[0],
                            make_session(qdq).run(None, f)[0]) for f in feeds])


def test_finetune_improves_ort_metric_and_ort_matches_torch():
    model, groups, stats, plan, hold, student, res = _distilled()
    ft, ft_plan = finetuned_model(model, res), finetuned_plan(plan, res)
    qdq_after = _qdq(ft, groups, stats, ft_plan)
    before = _ort_sqnr(model.proto, _qdq(model, groups, stats, plan), hold)
    after = _ort_sqnr(model.proto, qdq_after, hold)
    assert after > before + 1.0, (before, after)
    assert res.holdout_best > res.holdout_before and res.steps == 60
    for f in hold:  # what ORT measures is what torch computed
        np.testing.assert_allclose(make_session(qdq_after).run(None, f)[0],
                                   _torch_out(student, f), rtol=1e-4, atol=1e-4)


def test_write_back_keeps_the_graph_and_writes_every_weight_by_name():
    model, _, _, plan, _, _, res = _distilled(steps=20)
    before = model.proto.SerializeToString()
    ft = finetuned_model(model, res)
    assert model.proto.SerializeToString() == before  # the input model is untouched
    assert [(n.op_type, list(n.input), list(n.output)) for n in ft.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    old, new = fp32_weights(model), fp32_weights(ft)
    assert {k: (v.shape, v.dtype) for k, v in old.items()} == \
        {k: (v.shape, v.dtype) for k, v in new.items()}
    assert set(res.weights) == {"w1", "w2", "b1", "g1", "be1", "g2", "be2"}
    for name, w in res.weights.items():
        np.testing.assert_array_equal(new[name], w)
    assert not np.array_equal(new["w1"], old["w1"])
    assert dict(finetuned_plan(plan, res).pinned) == res.ranges
    bad = dataclasses.replace(res, weights={**res.weights, "nope": np.zeros(1, np.float32)})
    with pytest.raises(QuantscopeError, match="not in the model"):
        finetuned_model(model, bad)


def test_checkpoint_resumes(tmp_path):
    ck = tmp_path / "ck.pt"
    _, _, _, _, _, _, first = _distilled(steps=20, checkpoint=ck)
    assert ck.is_file() and first.steps == 20
    _, _, _, _, _, _, second = _distilled(steps=40, checkpoint=ck)
    assert [h["step"] for h in second.history] == [0, 20, 40]
    assert second.steps == 40 and second.samples == 40 * 16


def test_finetune_repair_on_a_dataset_reports_holdout_and_pins_ranges():
    from quantscope.finetune.apply import finetune_repair, split_holdout
    from quantscope.stages import Dataset, evaluate_plans

    model, groups, stats, _ = _prepared("conv_net", n=4)
    batches = tuple(tm.sample_inputs(model.proto, n=8, seed=300 + i) for i in range(10))
    train, hold = split_holdout(batches)
    assert len(hold) == 1 and len(train) == 9
    data = Dataset(name="tiny", calibration=batches, evaluation=batches[:3])
    plan = Plan.uniform(Precision.A8_W4)
    cfg = FinetuneConfig(steps=30, lr=3e-3, range_lr=1e-2, eval_every=10, warmup=3)
    ft, ft_plan, res = finetune_repair(model, data, stats, plan, config=cfg)
    assert res.holdout_rows == 8 and res.train_rows == 72 and res.metric == "output_sqnr_db"
    assert set(dict(ft_plan.pinned)) == set(res.ranges) and res.ranges
    after = evaluate_plans(ft, data, stats, {"p": ft_plan}, reference=model)["p"]["metrics"]
    before = evaluate_plans(model, data, stats, {"p": plan})["p"]["metrics"]
    assert "finetune" in dict(ft_plan.meta)
    assert res.holdout_best > res.holdout_before
    assert after["sqnr_db"] > before["sqnr_db"], (before["sqnr_db"], after["sqnr_db"])


def test_time_budget_stops_after_an_evaluation():
    model, groups, stats, _ = _prepared("residual_add", n=2)
    train = [tm.sample_inputs(model.proto, n=8, seed=i) for i in range(3)]
    student = to_torch(_qdq(model, groups, stats, Plan.uniform(Precision.A8_W8)),
                       float_weights=fp32_weights(model))
    cfg = FinetuneConfig(steps=50, eval_every=20, max_seconds=0.0)
    res = distill(student, to_torch(model.proto), OutputsLoss(), train, train[:1], cfg)
    assert res.steps == 1 and [h["step"] for h in res.history] == [0, 1]


def test_the_schedule_anneals_by_the_end_of_the_time_budget():
    import time

    from quantscope.finetune.distill import Distiller

    model, groups, stats, _ = _prepared("residual_add", n=2)
    student = to_torch(_qdq(model, groups, stats, Plan.uniform(Precision.A8_W8)),
                       float_weights=fp32_weights(model))
    teacher = to_torch(model.proto)
    by_steps = Distiller(student, teacher, OutputsLoss(), FinetuneConfig(steps=1000, warmup=5))
    timed = Distiller(student, teacher, OutputsLoss(),
                      FinetuneConfig(steps=1000, warmup=5, max_seconds=100.0))
    timed.started = time.perf_counter() - 50.0  # half the budget spent at step 20
    assert by_steps._schedule(20) > 0.99  # 1.5 % of the steps: still at the top
    assert timed._schedule(20) == pytest.approx(0.5, abs=0.01)  # half-way down the cosine
    timed.started = time.perf_counter() - 100.0
    assert timed._schedule(20) == pytest.approx(0.0, abs=1e-6)  # budget spent: annealed


def test_intermediate_taps_are_distilled():
    from quantscope.finetune.objectives import layernorm_outputs, tap_loss

    model, groups, stats, _ = _prepared("layernorm_block", n=4)
    taps = layernorm_outputs(model)
    assert len(taps) == 2
    train = [tm.sample_inputs(model.proto, n=16, seed=100 + i) for i in range(8)]
    plan = Plan.uniform(Precision.A8_W4)
    student = to_torch(_qdq(model, groups, stats, plan), float_weights=fp32_weights(model))
    teacher = to_torch(model.proto)

    def gap():
        with torch.no_grad():
            return float(tap_loss(student(train[0], taps)[1], teacher(train[0], taps)[1],
                                  train[0], None))

    first = gap()
    cfg = FinetuneConfig(steps=40, lr=3e-3, range_lr=1e-2, eval_every=20, warmup=3,
                         taps=taps, tap_weight=1.0)
    distill(student, teacher, OutputsLoss(), train, train[:2], cfg)
    assert gap() < first


def test_score_weighted_loss_is_the_cosine_loss_when_isotropic_and_sees_the_subspace():
    from quantscope.finetune.objectives import EmbeddingLoss, score_weights

    rng = np.random.default_rng(0)
    t = torch.nn.functional.normalize(torch.from_numpy(rng.normal(0, 1, (32, 6))), dim=1)
    s = torch.nn.functional.normalize(t + 0.05 * torch.from_numpy(rng.normal(0, 1, (32, 6))),
                                      dim=1)
    plain = EmbeddingLoss(0, None)
    iso = plain.with_scores(np.eye(6, dtype=np.float32))
    assert iso.metric == "embedding_score_cosine"
    assert float(iso.loss([s], [t])) == pytest.approx(float(plain.loss([s], [t])), rel=1e-5)
    assert iso.score([s], [t]) == pytest.approx(plain.score([s], [t]), abs=1e-6)
    # embeddings living near one direction: an error along it moves scores, one across it
    # (same cosine) hardly does
    emb = np.zeros((200, 6))
    emb[:, 0] = 1.0
    emb[:, 1] = rng.normal(0, 0.1, 200)
    c = score_weights(emb / np.linalg.norm(emb, axis=1, keepdims=True))
    assert np.trace(c) == pytest.approx(6.0, rel=1e-5) and np.allclose(c, c.T)
    base = torch.tensor([[0.6, 0.8, 0, 0, 0, 0]], dtype=torch.float64)
    along = torch.tensor([[0.62, 0.78, 0, 0, 0, 0]], dtype=torch.float64)
    across = torch.tensor([[0.6, 0.8, 0.02, 0, 0, 0]], dtype=torch.float64)
    weighted = plain.with_scores(c)
    assert float(weighted.loss([along], [base])) > 50 * float(weighted.loss([across], [base]))
    with pytest.raises(ValueError, match="two rows"):
        score_weights(emb[:1])


def test_finetune_with_the_score_weighted_loss():
    from quantscope.finetune.objectives import EmbeddingLoss

    model, groups, stats, _ = _prepared("layernorm_block", n=4)
    train = [tm.sample_inputs(model.proto, n=16, seed=100 + i) for i in range(8)]
    hold = [tm.sample_inputs(model.proto, n=16, seed=200 + i) for i in range(2)]
    plan = Plan.uniform(Precision.A8_W4)
    student = to_torch(_qdq(model, groups, stats, plan), float_weights=fp32_weights(model))
    cfg = FinetuneConfig(steps=40, lr=3e-3, range_lr=1e-2, eval_every=20, warmup=3,
                         score_loss=True)
    res = distill(student, to_torch(model.proto), EmbeddingLoss(0, None), train, hold, cfg)
    assert res.metric == "embedding_score_cosine"
    assert res.holdout_best > res.holdout_before
    with pytest.raises(QuantscopeError, match="embedding model"):
        distill(student, to_torch(model.proto), OutputsLoss(), train, hold, cfg)


def test_ranking_term_is_zero_at_the_teacher_and_sees_the_order_of_neighbours():
    from quantscope.finetune.objectives import EmbeddingLoss, rank_bank

    rng = np.random.default_rng(1)
    bank = rng.normal(0, 1, (64, 6))
    bank /= np.linalg.norm(bank, axis=1, keepdims=True)
    plain = EmbeddingLoss(0, None)
    ranked = plain.with_bank(rank_bank(bank), tau=0.05, weight=10.0)
    assert ranked.metric == "embedding_cosine_rank"
    t = torch.from_numpy(bank[:4].astype(np.float32))  # rows that are in the bank themselves
    assert float(ranked._rank_kl([t], [t]).abs().max()) < 1e-6  # own entry masked, no NaN
    assert ranked.score([t], [t]) == pytest.approx(1.0, abs=1e-6)
    # two errors of the same cosine: the one that swaps the two nearest neighbours costs more
    q = torch.tensor([[1.0, 0, 0, 0, 0, 0]])
    near = np.array([[0.9, 0.1, 0, 0, 0, 0], [0.9, -0.1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1.0]])
    near /= np.linalg.norm(near, axis=1, keepdims=True)
    two = plain.with_bank(near, tau=0.02, weight=1.0)
    swap = torch.nn.functional.normalize(torch.tensor([[1.0, -0.03, 0, 0, 0, 0]]), dim=1)
    aside = torch.nn.functional.normalize(torch.tensor([[1.0, 0, 0.03, 0, 0, 0]]), dim=1)
    assert float(plain.loss([swap], [q])) == pytest.approx(float(plain.loss([aside], [q])))
    assert float(two._rank_kl([swap], [q])) > 10 * float(two._rank_kl([aside], [q]))
    assert len(rank_bank(bank, rows=10)) == 10
    with pytest.raises(ValueError, match="positive"):
        plain.with_bank(bank, tau=0.0, weight=1.0)


def test_finetune_with_the_ranking_term():
    from quantscope.finetune.objectives import EmbeddingLoss

    model, groups, stats, _ = _prepared("layernorm_block", n=4)
    train = [tm.sample_inputs(model.proto, n=16, seed=100 + i) for i in range(8)]
    hold = [tm.sample_inputs(model.proto, n=16, seed=200 + i) for i in range(2)]
    student = to_torch(_qdq(model, groups, stats, Plan.uniform(Precision.A8_W4)),
                       float_weights=fp32_weights(model))
    cfg = FinetuneConfig(steps=40, lr=3e-3, range_lr=1e-2, eval_every=20, warmup=3,
                         rank_weight=5.0, rank_tau=0.05)
    res = distill(student, to_torch(model.proto), EmbeddingLoss(0, None), train, hold, cfg)
    assert res.metric == "embedding_cosine_rank"
    assert res.holdout_best > res.holdout_before
    for bad in ({"rank_weight": -1.0}, {"rank_tau": 0.0}, {"average": 1.0}):
        with pytest.raises(QuantscopeError, match="finetune"):
            distill(student, to_torch(model.proto), EmbeddingLoss(0, None), train, hold,
                    dataclasses.replace(cfg, **bad))


def test_moving_average_is_what_is_evaluated_and_kept(tmp_path):
    model, groups, stats, _ = _prepared("layernorm_block", n=4)
    train = [tm.sample_inputs(model.proto, n=16, seed=100 + i) for i in range(8)]
    hold = [tm.sample_inputs(model.proto, n=16, seed=200 + i) for i in range(2)]
    qdq = _qdq(model, groups, stats, Plan.uniform(Precision.A8_W4))
    cfg = FinetuneConfig(steps=40, lr=3e-3, range_lr=1e-2, eval_every=20, warmup=3,
                         average=0.9)
    student = to_torch(qdq, float_weights=fp32_weights(model))
    res = distill(student, to_torch(model.proto), OutputsLoss(), train, hold, cfg,
                  checkpoint=tmp_path / "ck.pt")
    assert res.holdout_best > res.holdout_before
    # the kept state is the average: evaluating the returned student gives the best score
    d = Distiller(student, to_torch(model.proto), OutputsLoss(), FinetuneConfig())
    assert d.evaluate(hold) == pytest.approx(res.holdout_best, abs=1e-9)
    assert torch.load(tmp_path / "ck.pt", weights_only=False)["average"] is not None


def _embedding_graph() -> onnx.ModelProto:
    """Token + position embeddings with the shape arithmetic exported encoders carry:
    Shape -> Gather -> Range (CPU integers) indexing a float table, a Reshape whose shape
    is a Concat of Shape pieces, a MatMul and a Where on the mask."""
    from onnx import helper, numpy_helper

    r = np.random.default_rng(11)
    T = onnx.TensorProto
    nodes = [
        helper.make_node("Shape", ["ids"], ["shp"]),
        helper.make_node("Gather", ["shp", "one_i"], ["seq"], axis=0),
        helper.make_node("Range", ["zero_i", "seq", "one_i"], ["pos"]),
        helper.make_node("Gather", ["words", "ids"], ["we"]),
        helper.make_node("Gather", ["places", "pos"], ["pe"]),
        helper.make_node("Add", ["we", "pe"], ["e"]),
        helper.make_node("Gather", ["shp", "zero_i"], ["bsz"], axis=0),
        helper.make_node("Unsqueeze", ["bsz", "ax0"], ["bsz1"]),
        helper.make_node("Unsqueeze", ["seq", "ax0"], ["seq1"]),
        helper.make_node("Concat", ["bsz1", "seq1", "two"], ["shp3"], axis=0),
        helper.make_node("MatMul", ["e", "w"], ["h"]),
        helper.make_node("Reshape", ["h", "shp3"], ["h3"]),
        helper.make_node("ReduceMean", ["h3"], ["m"], axes=[3], keepdims=0),
        helper.make_node("Cast", ["mask"], ["mb"], to=T.BOOL),
        helper.make_node("Unsqueeze", ["mb", "ax2"], ["mb3"]),
        helper.make_node("Where", ["mb3", "m", "neg"], ["y"]),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("one_i", np.array(1, np.int64)), ("zero_i", np.array(0, np.int64)),
        ("ax0", np.array([0], np.int64)),
        ("ax2", np.array([2], np.int64)), ("two", np.array([4, 2], np.int64)),
        ("words", r.normal(0, 1, (20, 8)).astype(np.float32)),
        ("places", r.normal(0, 1, (16, 8)).astype(np.float32)),
        ("w", r.normal(0, 0.5, (8, 8)).astype(np.float32)),
        ("neg", np.array(-1.0, np.float32))]]
    graph = helper.make_graph(
        nodes, "embeddings",
        [helper.make_tensor_value_info("ids", T.INT64, ["N", "S"]),
         helper.make_tensor_value_info("mask", T.INT64, ["N", "S"])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N", "S", 4])], inits)
    # IR 10: what every onnxruntime >= 1.20 reads (a newer onnx writes a newer IR by default)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _embedding_feeds(seed: int) -> dict:
    r = np.random.default_rng(seed)
    mask = np.ones((3, 7), np.int64)
    mask[0, 5:] = 0
    return {"ids": r.integers(0, 20, (3, 7)).astype(np.int64), "mask": mask}


def test_shape_arithmetic_conversion_matches_ort():
    proto = _embedding_graph()
    feeds = _embedding_feeds(0)
    np.testing.assert_allclose(_torch_out(to_torch(proto), feeds),
                               make_session(proto).run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_device_is_cuda_when_present_else_the_cpu_and_is_recorded():
    from quantscope.finetune.distill import resolve_device

    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    for bad in ("tpu", "nonsense"):
        with pytest.raises(QuantscopeError, match="use cpu or cuda"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(QuantscopeError, match="sees no CUDA GPU"):
            resolve_device("cuda")
    *_, student, res = _distilled(steps=10, device=None)
    assert res.device == str(resolve_device(None)) and f"on {res.device}" in res.summary()
    assert all(p.device.type == "cpu" for p in student.parameters())  # handed back on the CPU
    assert all(isinstance(w, np.ndarray) for w in res.weights.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", [*tm.ALL, "embeddings"])
def test_cuda_student_matches_ort_and_the_cpu(name):
    """On a GPU the QDQ student (float tensors and feeds on the device, shape integers on
    the CPU) computes what ORT computes on the CPU, and what the CPU student computes."""
    if name == "embeddings":
        proto, feeds = _embedding_graph(), _embedding_feeds(1)
        student, ref = to_torch(proto), make_session(proto).run(None, feeds)[0]
    else:
        model, groups, stats, feeds_all = _prepared(name)
        feeds = feeds_all[0]
        qdq = _qdq(model, groups, stats, Plan.uniform(Precision.A8_W8))
        student = to_torch(qdq, float_weights=fp32_weights(model))
        ref = make_session(qdq).run(None, feeds)[0]
    cpu = _torch_out(student, feeds)
    student.place("cuda")
    with torch.no_grad():
        gpu = student(feeds)[0][0].cpu().numpy()
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gpu, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_finetune_improves_ort_metric_and_resumes(tmp_path):
    ck = tmp_path / "ck.pt"
    model, groups, stats, plan, hold, student, res = _distilled(
        steps=40, device="cuda", checkpoint=ck)
    assert res.device.startswith("cuda") and res.holdout_best > res.holdout_before
    ft, ft_plan = finetuned_model(model, res), finetuned_plan(plan, res)
    qdq_after = _qdq(ft, groups, stats, ft_plan)
    assert _ort_sqnr(model.proto, qdq_after, hold) > \
        _ort_sqnr(model.proto, _qdq(model, groups, stats, plan), hold) + 1.0
    for f in hold:
        np.testing.assert_allclose(make_session(qdq_after).run(None, f)[0],
                                   _torch_out(student, f), rtol=1e-4, atol=1e-4)
    *_, again = _distilled(steps=60, device="cuda", checkpoint=ck)
    assert [h["step"] for h in again.history] == [0, 20, 40, 60]


def test_an_empty_tap_is_left_out_not_nan():
    """A token-split encoder's second chunk is empty for short texts (found on a GPU run:
    the training loss printed NaN while the other taps trained)."""
    from quantscope.finetune.objectives import tap_loss

    r = torch.Generator().manual_seed(0)
    full = torch.randn(2, 5, 4, generator=r)
    empty = torch.zeros(2, 0, 4)
    mask = np.ones((2, 5), np.int64)
    student = {"a": full + 0.1, "b": empty}
    teacher = {"a": full, "b": empty}
    loss = tap_loss(student, teacher, {"m": mask}, "m")
    assert torch.isfinite(loss) and float(loss) > 0
    np.testing.assert_allclose(float(loss), float(tap_loss({"a": full + 0.1}, {"a": full},
                                                           {"m": mask}, "m")))
    assert float(tap_loss({"b": empty}, {"b": empty}, {"m": mask}, "m")) == 0.0


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bits,signed", [(8, False), (8, True), (16, False)])
def test_fused_fake_quant_equals_the_composed_definition(per_channel, bits, signed):
    """One autograd node: the forward to the bit, the gradients of x, scale and
    zero-point as the composed ops give them (clipped values, exact grid points and an
    additive-mask -3.4e38 included). The scale's gradient is compared with the composed
    form in float64: in float32 the composed form sums ``g (q - zp)`` and ``-g x / s``
    separately, two large sums that cancel (at 16 bit off by up to 8 % here); the fused
    form subtracts per element first."""
    from quantscope.finetune.fakequant import fake_quant, fake_quant_reference, qlimits

    qmin, qmax = qlimits(bits, signed)
    g = torch.Generator().manual_seed(bits + signed + per_channel)
    x = torch.randn(4, 7, 6, generator=g) * 3
    x[0, 0, 0], x[1, 2, 3] = -3.4e38, 1e6
    shape = (1, 1, 6) if per_channel else ()
    scale = (0.02 + torch.rand(shape, generator=g) * 0.05) * (256 / (qmax - qmin + 1))
    zp = torch.full(shape, float(qmin if signed else (qmin + qmax) // 3))
    x[2, 0, :] = (torch.arange(6) - 3.0) * scale.reshape(-1)[0]  # on grid points
    grad = torch.randn(4, 7, 6, generator=g)
    outs, grads = [], []
    for fn, dtype in ((fake_quant, torch.float32), (fake_quant_reference, torch.float32),
                      (fake_quant_reference, torch.float64)):
        xs, ss, zs = (t.to(dtype).clone().requires_grad_(True) for t in (x, scale, zp))
        out = fn(xs, ss, zs, qmin, qmax)
        out.backward(grad.to(dtype))
        outs.append(out.detach())
        grads.append([t.grad for t in (xs, ss, zs)])
    assert torch.equal(outs[0], outs[1])
    with torch.no_grad():  # the forward alone, without the autograd node
        assert torch.equal(fake_quant(x, scale, zp, qmin, qmax), outs[0])
    assert (outs[0] == outs[0].clamp((qmin - zp) * scale, (qmax - zp) * scale)).all()
    # x: the same mask; the composed form's g * s / s is g to the last bit or so
    assert torch.equal(grads[0][0] == 0, grads[1][0] == 0)
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-6, atol=0.0)
    torch.testing.assert_close(grads[0][2], grads[1][2], rtol=1e-5, atol=1e-5)  # zero-point
    # float32 holds x / s to ~6e-8 of itself: at 16 bit (|x / s| up to 65535) that is
    # ~4e-3 of a grid step per element, in both forms
    tol = 1e-4 if bits == 8 else 1e-2
    for k in (1, 2):  # scale, zero-point
        ours, exact = grads[0][k].double(), grads[2][k]
        assert ours.shape == exact.shape
        torch.testing.assert_close(ours, exact, rtol=tol, atol=tol)
    assert (grads[0][0] == 0).any() and (grads[0][0] != 0).any()  # some clipped, some not


def test_batches_are_split_to_fit_the_fine_tunes_memory_budget():
    """Each batch split along its rows so TRAIN_FACTOR x its forward activations fit the
    budget; the rows are the same, in order; no budget, or one that fits, splits nothing."""
    from quantscope.analyze.memory import tensor_sizer
    from quantscope.finetune.apply import TRAIN_FACTOR, bounded_batches

    model = load_proto(tm.conv_net())
    rng = np.random.default_rng(0)
    name = model.graph.input[0].name
    shape = [d.dim_value or 1 for d in model.graph.input[0].type.tensor_type.shape.dim]
    batches = [{name: rng.normal(size=(10, *shape[1:])).astype(np.float32)},
               {name: rng.normal(size=(3, *shape[1:])).astype(np.float32)}]
    outs = [o for n in model.graph.node for o in n.output if o]
    per_row = TRAIN_FACTOR * tensor_sizer(model, batches[:1])(outs) / 10
    assert bounded_batches(model, batches, None) == (batches, None)
    assert bounded_batches(model, batches, int(per_row * 20))[1] is None
    split, said = bounded_batches(model, batches, int(per_row * 4.5))
    assert [len(b[name]) for b in split] == [4, 4, 2, 3]
    np.testing.assert_array_equal(np.concatenate([b[name] for b in split]),
                                  np.concatenate([b[name] for b in batches]))
    assert said is not None and "split into 4 of at most 4 rows" in said
    # the samples on another axis (arrays of different first dims): kept whole
    odd = [{name: batches[0][name], "h": np.zeros((1, 10, 2), np.float32)}]
    assert bounded_batches(model, odd, int(per_row * 4.5))[0] == odd
