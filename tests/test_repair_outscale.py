"""outscale: a residual-branch Linear with outlier output channels writes equalized channels."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, parser

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.repair.outscale import METADATA_KEY, UNVERIFIED, outscale
from quantscope.repair.tokens import sample_feeds, split_tokens
from quantscope.repair.verify import calibrate_and_quantize, quantized_error, run_all
from quantscope.types import Plan, Precision

H = 16
SEQ = 8


def _block(outlier: float = 60.0) -> onnx.ModelProto:
    """Post-LN FFN block: y = LN(n1 + relu(n1 @ w1 + b1) @ w2 + b2); channel 3 of the FFN
    output is ``outlier`` times the others (the residual stream's outlier channel)."""
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    blk (int64[N, S] input_ids) => (float[N, S, {H}] y) {{
        e = Gather (table, input_ids)
        n1 = LayerNormalization <axis = -1, epsilon = 0.00001> (e, g1, be1)
        h = MatMul (n1, w1)
        hb = Add (h, b1)
        r = Relu (hb)
        o = MatMul (r, w2)
        ob = Add (o, b2)
        res = Add (n1, ob)
        y = LayerNormalization <axis = -1, epsilon = 0.00001> (res, g2, be2)
    }}
    """
    rng = np.random.default_rng(0)
    w2 = rng.normal(0, 0.2, (2 * H, H))
    w2[:, 3] *= outlier
    weights = {
        "table": rng.normal(0, 1, (1000, H)),
        "g1": 1 + rng.normal(0, 0.1, H), "be1": rng.normal(0, 0.1, H),
        "w1": rng.normal(0, 0.3, (H, 2 * H)), "b1": rng.normal(0, 0.1, 2 * H),
        "w2": w2, "b2": rng.normal(0, 0.1, H),
        "g2": 1 + rng.normal(0, 0.1, H), "be2": rng.normal(0, 0.1, H),
    }
    model = parser.parse_model(text)
    model.graph.initializer.extend(
        numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items())
    onnx.checker.check_model(model)
    return model


def _calibrated(proto):
    model = load_proto(proto)
    feeds = sample_feeds(model, (SEQ, SEQ, SEQ, SEQ), seed=1)
    return model, feeds, calibrate(model, find_groups(model), iter(feeds))


def test_rewrite_keeps_function_and_names():
    model, feeds, stats = _calibrated(_block())
    r = outscale(model, stats)
    assert dict(r.effect) == {"sites": 1.0} and UNVERIFIED in r.reason
    new = load_proto(r.proto)
    groups = {g.name: g for g in find_groups(new).groups}
    add = "Add_7"  # the residual Add
    assert groups[f"{add}/outscale/in"].op_type == "Mul"  # the skip branch: its own layer
    assert groups[add].outputs == ("res",)  # the * s fuses into the Add: same tensor out
    assert groups["MatMul_5"].outputs == ("ob",)  # the Linear still writes its tensor
    assert METADATA_KEY in {p.key for p in new.proto.metadata_props}
    assert [o.name for o in new.graph.output] == ["y"]
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5)
    # the Linear's output channels now have about the same range
    _, _, after = _calibrated(r.proto)
    absmax = after.tensors["ob"].channel_absmax
    assert absmax.max() / np.median(absmax) < 4 < (
        stats.tensors["ob"].channel_absmax.max() / np.median(stats.tensors["ob"].channel_absmax))


def test_the_8_bit_linear_output_gets_better_with_the_scaled_basis_at_16_bit():
    model, feeds, stats = _calibrated(_block())
    new, _, new_stats = _calibrated(outscale(model, stats).proto)
    stream = ("LayerNormalization_1", "Add_7", "LayerNormalization_8")
    before = Plan(default=Precision.A8_W8,
                  overrides=tuple((g, Precision.A16_W16) for g in stream))
    after = Plan(default=Precision.A8_W8, overrides=(
        *before.overrides, ("Add_7/outscale/in", Precision.A16_W16)))
    e0 = quantized_error(model.proto, calibrate_and_quantize(model, feeds, before), feeds)
    e1 = quantized_error(model.proto, calibrate_and_quantize(new, feeds, after), feeds)
    assert e1["sqnr_db"] > e0["sqnr_db"] + 3, (e0, e1)


def test_what_it_leaves_and_why():
    model, _, stats = _calibrated(_block(outlier=1.0))
    r = outscale(model, stats)
    assert not r.changes and "ratio" in dict(r.skipped)["MatMul_5"]
    model, _, stats = _calibrated(_block())
    split = load_proto(split_tokens(model, seq_len=SEQ, chunk=4, linears=True).proto)
    _, _, split_stats = _calibrated(split.proto)
    why = dict(outscale(split, split_stats).skipped)
    assert "run outscale before tokensplit" in why["MatMul_5/tok0"]


def test_tokensplit_after_outscale_splits_the_new_muls():
    model, _, stats = _calibrated(_block())
    new = load_proto(outscale(model, stats).proto)
    split = load_proto(split_tokens(new, seq_len=SEQ, chunk=4).proto)
    names = {g.name for g in find_groups(split).groups}
    assert {"Add_7/outscale/in/tok0", "Add_7/outscale/in/tok1", "Add_7/tok1"} <= names


def test_cli_outscale(tmp_path, capsys):
    from quantscope.serde import write_stats

    src = tmp_path / "blk.onnx"
    onnx.save(_block(), src)
    model, _, stats = _calibrated(_block())
    write_stats(tmp_path / "s.npz", stats)
    before = src.read_bytes()
    out = tmp_path / "o.onnx"
    assert main(["outscale", str(src), "--stats", str(tmp_path / "s.npz"), "--out",
                 str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 residual-branch Linear(s)" in text and UNVERIFIED in text
    assert "calibrate it again" in text and src.read_bytes() == before
    assert any(n.name == "Add_7/outscale/in" for n in onnx.load(out).graph.node)
    other = tmp_path / "other.onnx"
    import tiny_models
    onnx.save(tiny_models.conv_net(), other)
    bad = tmp_path / "bad.onnx"
    assert main(["outscale", str(other), "--stats", str(tmp_path / "s.npz"), "--out",
                 str(bad)]) == 2
    err = capsys.readouterr().err
    assert "calibrated on another model" in err and not bad.exists()


@pytest.mark.parametrize("ratio", ["0", "-1"])
def test_cli_min_ratio_must_be_positive(tmp_path, capsys, ratio):
    src = tmp_path / "blk.onnx"
    onnx.save(_block(), src)
    assert main(["outscale", str(src), "--stats", str(src), "--min-ratio", ratio,
                 "--out", str(tmp_path / "o.onnx")]) == 2
    assert "min-ratio" in capsys.readouterr().err


def test_run_with_outscale_and_tokensplit(tmp_path, capsys):
    from quantscope.serde import read_json

    onnx.save(_block(), tmp_path / "blk.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (32, SEQ)).astype(np.int64))
    argv = ["run", str(tmp_path / "blk.onnx"), "--data", str(tmp_path / "x.npz"),
            "--target", "hailo10h", "--out", str(tmp_path / "W"), "--outscale",
            "--seq-len", str(SEQ), "--tokensplit", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "outscale: the FFN down-projections" in out and UNVERIFIED in out
    verdict = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert verdict["outscale"] and verdict["tokensplit"]
    compiled = {n.name for n in onnx.load(tmp_path / "W" / "repaired.onnx").graph.node}
    assert {"Add_7/outscale/in/tok0", "Add_7/tok1"} <= compiled  # rewritten, then split
