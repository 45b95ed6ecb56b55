"""Models outside the zoo, analysis side: the channel axis comes from the graph, a Concat
whose grid spans tensors of different scales is named with the reason, and notes say only
what the graph shows."""

import json
import re

import numpy as np
import onnx
import tiny_models as tm
from outside_models import feeds, mixed_scale_detector

from quantscope.analyze import analyze, find_mixed_scales, mixed_scale_lines, rank_key
from quantscope.analyze.scoring import outputs_scorer
from quantscope.calibrate.collect import calibrate
from quantscope.calibrate.observe import channel_axis as rank_rule
from quantscope.cli import main
from quantscope.model.axes import channel_axes, channel_axis
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto

CONV1D = """
<ir_version: 9, opset_import: ["" : 17]>
conv1d (float[N, 4, 32] x) => (float[N, 32, 8] y) {
    c = Conv <pads = [1, 1]> (x, w, b)
    r = Relu (c)
    y = Transpose <perm = [0, 2, 1]> (r)
}
"""

SAME_SCALE = """
<ir_version: 9, opset_import: ["" : 17]>
twins (float[N, 3, 8, 8] x) => (float[N, 8, 8, 8] y) {
    a = Conv (x, wa, ba)
    ra = Relu (a)
    b = Conv (x, wb, bb)
    rb = Relu (b)
    y = Concat <axis = 1> (ra, rb)
}
"""


def _calibrated(proto, data):
    model = load_proto(proto, "fixture")
    groups = find_groups(model)
    return model, groups, calibrate(model, groups, [data])


# ---- 1. the channel axis from the graph ------------------------------------------------


def test_detector_output_is_read_per_row_not_per_anchor():
    """``detections [N, 7, 64]`` (Concat axis 1): 7 channels, not 64 anchors."""
    model, _, stats = _calibrated(mixed_scale_detector(), feeds("mixed_scale_detector", 16))
    assert channel_axis(model, "detections") == 1
    ts = stats.tensors["detections"]
    assert ts.channel_axis == 1 and ts.channel_absmax.shape == (7,)
    # the rows keep their scales apart: 4 box rows in pixels, 3 class rows below 1
    assert ts.channel_absmax[:4].min() > 50 and ts.channel_absmax[4:].max() < 1


def test_conv1d_output_is_per_channel_and_transpose_moves_the_axis():
    r = np.random.default_rng(0)
    proto = tm._with_weights(CONV1D, {"w": r.normal(0, 0.5, (8, 4, 3)).astype(np.float32),
                                      "b": np.zeros(8, np.float32)})
    model, _, stats = _calibrated(proto, {"x": r.normal(0, 1, (4, 4, 32)).astype(np.float32)})
    axes = channel_axes(model)
    assert axes["c"] == 1 and axes["r"] == 1  # [N, C, L]: the old rank rule said 2
    assert axes["y"] == 2  # Transpose [0, 2, 1] moves the channel axis to the end
    assert stats.tensors["r"].channel_absmax.shape == (8,)


def test_token_models_keep_the_last_axis():
    """Text encoders: every calibrated tensor keeps the axis it had (last, or 1 at rank 4)."""
    for build in (tm.attention, tm.layernorm_block, tm.residual_add, tm.conv_net):
        proto = build()
        model = load_proto(proto, "tiny")
        groups = find_groups(model)
        stats = calibrate(model, groups, [tm.sample_inputs(model.proto)])
        for name, ts in stats.tensors.items():
            rank = len(model.value_shapes()[name])
            assert ts.channel_axis == rank_rule(rank), (build.__name__, name)


# ---- 2. one grid spans tensors of different scales -------------------------------------


def test_mixed_scale_concat_is_named_with_ranges_steps_and_fix():
    model, groups, stats = _calibrated(mixed_scale_detector(), feeds("mixed_scale_detector"))
    (hit,) = find_mixed_scales(model, groups, stats)
    assert (hit.tensor, hit.kind, hit.channel_axis) == ("detections", "mixed_scale", 1)
    assert hit.group == "Concat_9" and hit.channels == (4, 5, 6)  # the class rows
    assert "boxes [" in hit.reason and "classes [" in hit.reason
    assert "at 8 bit" in hit.reason and "at 16 bit" in hit.reason
    assert "below one grid step" in hit.reason
    assert "16-bit" in hit.remedies[0] and "Concat_9" in hit.remedies[0]
    assert any("split 'detections'" in r for r in hit.remedies)
    assert hit.ratio > 100


STRIDED = """
<ir_version: 9, opset_import: ["" : 17]>
strided (float[N, 8, 8, 8] x) => (float[N, 7, 64] y) {
    c = Conv (x, w, b)
    s = Sigmoid (c)
    r = Reshape (s, shape)
    y = Mul (r, scale)
}
"""


def test_output_whose_rows_one_mul_scales_apart_is_reported():
    """No Concat: a Mul by per-row strides puts 4 pixel rows and 3 probability rows in one
    output; its channels (axis 1, from the graph) show it."""
    r = np.random.default_rng(4)
    scale = np.array([640, 640, 640, 640, 1, 1, 1], np.float32).reshape(1, 7, 1)
    proto = tm._with_weights(STRIDED, {
        "w": r.normal(0, 0.5, (7, 8, 1, 1)).astype(np.float32),
        "b": np.zeros(7, np.float32),
        "shape": np.array([0, 7, -1], np.int64),
        "scale": scale,
    })
    model, groups, stats = _calibrated(
        proto, {"x": r.normal(0, 1, (8, 8, 8, 8)).astype(np.float32)})
    (hit,) = find_mixed_scales(model, groups, stats)
    assert (hit.tensor, hit.kind, hit.channel_axis) == ("y", "mixed_scale", 1)
    assert sorted(hit.channels) == [4, 5, 6]
    assert "3 of 7 channels" in hit.reason and "at 16 bit" in hit.reason


def _strided(rows):
    """STRIDED with its 7 rows scaled by ``rows``, calibrated."""
    r = np.random.default_rng(4)
    proto = tm._with_weights(STRIDED, {
        "w": r.normal(0, 0.5, (7, 8, 1, 1)).astype(np.float32),
        "b": np.zeros(7, np.float32),
        "shape": np.array([0, 7, -1], np.int64),
        "scale": np.array(rows, np.float32).reshape(1, 7, 1),
    })
    return _calibrated(proto, {"x": r.normal(0, 1, (8, 8, 8, 8)).astype(np.float32)})


def test_dead_output_channels_are_not_small_channels():
    """A channel always ~0 (max|x| 1e-31, as minilm-l6's LayerNorm leaves three) carries
    nothing a grid can lose: alone it makes no finding ("16 bit is not enough" was said)."""
    model, groups, stats = _strided([640, 640, 640, 640, 1e-31, 1e-31, 0])
    assert find_mixed_scales(model, groups, stats) == ()


def test_real_small_channels_keep_the_finding_and_dead_ones_are_counted_apart():
    model, groups, stats = _strided([640, 640, 640, 640, 1, 1, 1e-31])
    (hit,) = find_mixed_scales(model, groups, stats)
    assert sorted(hit.channels) == [4, 5]
    assert "2 of 7 channels" in hit.reason and "1 dead channel" in hit.reason


PADDED = """
<ir_version: 9, opset_import: ["" : 17]>
padded (float[N, 8, 8, 8] x) => (float[N, 12, 8, 8] y) {
    c = Conv (x, w, b)
    s = Sigmoid (c)
    big = Mul (s, px)
    z = Mul (s, zero)
    y = Concat <axis = 1> (big, s, z)
}
"""


def test_a_zero_input_does_not_hide_a_small_one_in_a_concat():
    """A Concat of pixels (0-640), probabilities (0-1) and an all-zero pad: the zero input
    was taken as the smallest, and its span 0 stopped the Concat's check (only the output's
    channel check caught it, without the Concat, its inputs and ranges); it is dead, and
    the Concat's finding names the probabilities."""
    r = np.random.default_rng(5)
    proto = tm._with_weights(PADDED, {
        "w": r.normal(0, 0.5, (4, 8, 1, 1)).astype(np.float32),
        "b": np.zeros(4, np.float32), "px": np.full((1,), 640, np.float32),
        "zero": np.zeros((1,), np.float32)})
    model, groups, stats = _calibrated(
        proto, {"x": r.normal(0, 1, (8, 8, 8, 8)).astype(np.float32)})
    (hit,) = find_mixed_scales(model, groups, stats)
    assert hit.tensor == "y" and "the whole range of s " in hit.reason, hit.reason


def test_concat_of_like_scales_is_not_reported():
    r = np.random.default_rng(1)
    proto = tm._with_weights(SAME_SCALE, {
        "wa": r.normal(0, 0.4, (4, 3, 1, 1)).astype(np.float32),
        "ba": np.zeros(4, np.float32),
        "wb": r.normal(0, 0.1, (4, 3, 1, 1)).astype(np.float32),  # 4x smaller: 64 steps
        "bb": np.zeros(4, np.float32),
    })
    model, groups, stats = _calibrated(
        proto, {"x": r.normal(0, 1, (8, 3, 8, 8)).astype(np.float32)})
    assert find_mixed_scales(model, groups, stats) == ()


def test_analyze_names_the_concat_in_json_console_and_reasons(tmp_path, capsys):
    proto = mixed_scale_detector()
    onnx.save(proto, tmp_path / "det.onnx")
    np.savez(tmp_path / "data.npz", **feeds("mixed_scale_detector"))
    assert main(["calibrate", str(tmp_path / "det.onnx"), "--data", str(tmp_path / "data.npz"),
                 "--out", str(tmp_path / "stats.npz")]) == 0
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "det.onnx"), "--data", str(tmp_path / "data.npz"),
                 "--stats", str(tmp_path / "stats.npz"), "--out",
                 str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "detections: one grid spans tensors of different scales" in out
    assert "fix: keep group 'Concat_9'" in out
    a = json.loads((tmp_path / "a.json").read_text())
    (mixed,) = [o for o in a["outliers"] if o["kind"] == "mixed_scale"]
    assert mixed["tensor"] == "detections" and mixed["group"] == "Concat_9"
    concat = next(o for o in a["offenders"] if o["group"] == "Concat_9")
    assert any("different scales" in r for r in concat["reasons"])
    lines = mixed_scale_lines(a)  # what run's verdict can print from analysis.json
    assert len(lines) == 2 and lines[0].startswith("detections: one grid spans")
    assert "outliers: 0  mixed scales: 1" in out
    # each figure in its unit (report.fmt, the one share list): detection_f1 was .4g, 0-1
    assert a["primary"] == "detection_f1"
    f1 = a["baselines"]["a16_w16"]["detection_f1"]  # the file keeps the share as 0-1
    assert 0 < f1 <= 1
    line = next(s for s in out.splitlines() if s.strip().startswith("uniform a16_w16"))
    assert f"detection_f1 {100 * f1:.1f} %" in line, line
    assert re.search(r"sqnr_db \d+\.\d dB", line), line


def test_ranking_prefers_the_worst_channel_when_the_scorer_has_it():
    assert rank_key({"sqnr_db": 40.0, "sqnr_db_channel_min": 3.0}) == "sqnr_db_channel_min"
    assert rank_key({"sqnr_db": 40.0}) == "sqnr_db"


def test_analysis_runs_on_the_detector_with_the_default_scorer():
    model, groups, stats = _calibrated(mixed_scale_detector(), feeds("mixed_scale_detector"))
    a = analyze(model, groups, stats, [feeds("mixed_scale_detector")],
                scorer=outputs_scorer(), proxy_fraction=1.0, recover_top=(1,))
    assert [o.kind for o in a.outliers] == ["mixed_scale"]


# ---- 3. notes that say what the graph shows -------------------------------------------

GATE = """
<ir_version: 9, opset_import: ["" : 17]>
gate (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) {
    c = Conv (x, w, b)
    g = HardSigmoid (c)
    d = Conv (x, w2, b2)
    e = Relu (d)
    y = Mul (g, e)
}
"""

DFL = """
<ir_version: 9, opset_import: ["" : 17]>
dfl (float[N, 8, 4, 4] x) => (float[N, 4, 16] y) {
    c = Conv (x, w, b)
    r = Reshape (c, shape)
    s = Softmax <axis = 2> (r)
    p = Conv (s, proj)
    y = Reshape (p, out_shape)
}
"""


def _gate():
    r = np.random.default_rng(0)
    return tm._with_weights(GATE, {
        "w": r.normal(0, 5000, (4, 3, 1, 1)).astype(np.float32),  # the gate saturates
        "b": np.array([-1, 0.3, 0.5, 2], np.float32),
        "w2": r.normal(0, 5, (4, 3, 1, 1)).astype(np.float32),
        "b2": np.array([-1, -0.3, -0.5, 2], np.float32),
    })


def _notes(proto, x):
    from quantscope.emulate.encode import encode
    from quantscope.types import Plan, Precision, QuantScheme

    model, groups, stats = _calibrated(proto, {"x": x})
    return encode(model, groups, stats, Plan.uniform(Precision.A8_W8),
                  scheme=QuantScheme()).notes


def test_saturated_gate_is_no_mask_fill():
    """HardSigmoid at exactly 0 or 1: the 0s are inside every grid, no mask is near."""
    x = np.random.default_rng(1).normal(0, 100, (8, 3, 8, 8)).astype(np.float32)
    notes = _notes(_gate(), x)
    assert not [n for n in notes if "mask" in n or "far below" in n], notes


def test_all_zero_calibration_says_so_and_no_mask_fill():
    notes = _notes(_gate(), np.zeros((8, 3, 8, 8), np.float32))
    assert not [n for n in notes if "mask" in n or "far below" in n], notes
    assert any(n.startswith("every calibration value is 0 in 1 tensor(s) (x)") for n in notes)


def _dfl():
    r = np.random.default_rng(2)
    proj = np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1)
    return tm._with_weights(DFL, {
        "w": r.normal(0, 0.5, (64, 8, 1, 1)).astype(np.float32),
        "b": np.zeros(64, np.float32),
        "shape": np.array([0, 4, 16, 16], np.int64),
        "proj": proj,
        "out_shape": np.array([0, 4, 16], np.int64),
    })


def test_box_distribution_softmax_is_not_called_attention():
    from quantscope.plan.check import check
    from quantscope.targets import load_target
    from quantscope.types import Plan, Precision

    model = load_proto(_dfl(), "dfl")
    groups = find_groups(model)
    probs = check(Plan.uniform(Precision.A16_W16), groups, model, load_target("hailo8"))
    (soft,) = [p for p in probs if p.rule == "hailo.attention_16bit"]
    assert soft.reason.startswith("16-bit activations on a Softmax over axis 2 of a rank-4 "
                                  "tensor, not attention"), soft.reason
    assert "keep this Softmax at 8-bit" in soft.fix
    # a real attention Softmax is still called attention
    att = load_proto(tm.attention(), "att")
    att_groups = find_groups(att)
    probs = check(Plan.uniform(Precision.A16_W16), att_groups, att, load_target("hailo8"))
    soft_groups = {g.name for g in att_groups.groups if g.op_type == "Softmax"}
    softmax = [p for p in probs if p.rule == "hailo.attention_16bit" and p.group in soft_groups]
    assert softmax and all("[attention Softmax (fed by an activation x activation MatMul)"
                           in p.reason for p in softmax)


def test_no_higher_precision_offered_at_a16_w16():
    from quantscope.plan.check import check
    from quantscope.targets import load_target
    from quantscope.types import Plan, Precision

    r = np.random.default_rng(3)
    w = r.normal(0, 0.5, (8, 3, 1, 1)).astype(np.float32)
    w[5] = 0.0  # a pruned output channel: its low byte is empty at every precision
    proto = tm._with_weights("""
    <ir_version: 9, opset_import: ["" : 17]>
    pruned (float[N, 3, 8, 8] x) => (float[N, 8, 8, 8] y) {
        c = Conv (x, w, b)
        y = Relu (c)
    }
    """, {"w": w, "b": np.zeros(8, np.float32)})
    model = load_proto(proto, "pruned")
    probs = check(Plan.uniform(Precision.A16_W16), find_groups(model), model,
                  load_target("hailo8"))
    (low,) = [p for p in probs if p.rule == "hailo.a16_low_sublayer_empty"]
    assert "use a16_w16" not in low.fix and "highest precision" in low.fix
    assert "a8_w8" in low.fix


def test_lint_with_an_hn_that_matches_nothing_says_so(tmp_path, capsys):
    from quantscope.export.hailo_alls import export_alls
    from quantscope.types import Plan, Precision

    onnx.save(mixed_scale_detector(), tmp_path / "det.onnx")
    hn = {"layers": {"net/conv1": {"type": "conv", "original_names": ["/model.0/conv/Conv"]},
                     "net/conv2": {"type": "conv", "original_names": ["other"]}}}
    (tmp_path / "other.hn").write_text(json.dumps(hn))
    (tmp_path / "s.alls").write_text("quantization_param(conv1, precision_mode=a16_w16)\n")
    code = main(["lint", str(tmp_path / "s.alls"), "--model", str(tmp_path / "det.onnx"),
                 "--target", "hailo8", "--hn", str(tmp_path / "other.hn")])
    out = capsys.readouterr().out
    assert code == 0
    (line,) = [ln for ln in out.splitlines() if "alls.hn_unmatched" in ln]
    assert "matched no node of this model" in line and "2 layer(s)" in line
    assert "conv1 <- '/model.0/conv/Conv'" in line and "op-order guesses" in line
    groups = find_groups(load_proto(mixed_scale_detector()))
    text = export_alls(Plan.uniform(Precision.A8_W8), groups, layer_names={})
    assert "no HN given" not in text and "the HN given matched no node" in text


def test_analysis_notes_all_zero_calibration():
    model, groups, stats = _calibrated(_gate(), {"x": np.zeros((4, 3, 8, 8), np.float32)})
    a = analyze(model, groups, stats, [{"x": np.zeros((4, 3, 8, 8), np.float32)}],
                scorer=outputs_scorer(), proxy_fraction=1.0, recover_top=(1,))
    assert any(n.startswith("every calibration value is 0 in 1 tensor(s) (x)") for n in a.notes)
