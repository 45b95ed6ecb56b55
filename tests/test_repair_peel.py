"""peel: an FFN's outlier hidden channels move into a small FFN of their own."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, parser

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.repair.outscale import outscale
from quantscope.repair.peel import METADATA_KEY, UNVERIFIED, peel
from quantscope.repair.tokens import sample_feeds, split_tokens
from quantscope.repair.verify import calibrate_and_quantize, quantized_error, run_all
from quantscope.types import Plan, Precision

H = 16
F = 4 * H
SEQ = 8


def _block(outlier: float = 12.0) -> onnx.ModelProto:
    """Post-LN FFN block with the exported (erf) GELU and its Constant nodes:
    y = LN(n1 + gelu(n1 @ w1 + b1) @ w2 + b2); hidden channel 5 is ``outlier`` times the
    others (an FFN's outlier hidden channel)."""
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    blk (int64[N, S] input_ids) => (float[N, S, {H}] y) {{
        e = Gather (table, input_ids)
        n1 = LayerNormalization <axis = -1, epsilon = 0.00001> (e, g1, be1)
        h = MatMul (n1, w1)
        hb = Add (b1, h)
        c = Constant <value = float {{1.4142135}}> ()
        d = Div (hb, c)
        f = Erf (d)
        c1 = Constant <value = float {{1.0}}> ()
        a = Add (f, c1)
        m = Mul (hb, a)
        c2 = Constant <value = float {{0.5}}> ()
        g = Mul (m, c2)
        o = MatMul (g, w2)
        ob = Add (b2, o)
        res = Add (ob, n1)
        y = LayerNormalization <axis = -1, epsilon = 0.00001> (res, g2, be2)
    }}
    """
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (H, F))
    w1[:, 5] *= outlier
    weights = {
        "table": rng.normal(0, 1, (1000, H)),
        "g1": 1 + rng.normal(0, 0.1, H), "be1": rng.normal(0, 0.1, H),
        "w1": w1, "b1": rng.normal(0, 0.1, F),
        "w2": rng.normal(0, 0.2, (F, H)), "b2": rng.normal(0, 0.1, H),
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


def _names(groups):
    return {g.name: g for g in groups.groups}


def test_rewrite_keeps_function_names_and_moves_the_outlier_channel():
    model, feeds, stats = _calibrated(_block())
    up = next(g for g in find_groups(model).groups if g.nodes[0] == "MatMul_2")
    r = peel(model, stats)
    assert dict(r.effect) == {"sites": 1.0, "channels": 1.0} and UNVERIFIED in r.reason
    assert next(c for c in r.changes if c.kind == "split").channels == (5,)
    new = load_proto(r.proto)
    groups = _names(find_groups(new))
    res_add = next(n.name for n in model.graph.node if n.output[0] == "res")
    assert groups[f"{res_add}/peel"].op_type == "Add"  # joins the stream: a layer of its own
    assert groups["MatMul_2/peel"].kind.value == "weighted"  # the small FFN's two Linears
    assert groups[up.name].outputs == up.outputs  # the big FFN keeps its tensor names
    assert METADATA_KEY in {p.key for p in new.proto.metadata_props}
    w1 = {t.name: numpy_helper.to_array(t) for t in new.graph.initializer}
    assert w1["w1"].shape == (H, F - 1) and w1["w1/peel"].shape == (H, 1)
    assert w1["w2"].shape == (F - 1, H) and w1["w2/peel"].shape == (1, H)
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_allclose(a[0], b[0], rtol=1e-5, atol=1e-5)
    _, _, after = _calibrated(r.proto)
    hidden = up.outputs[0]
    ratio = lambda s: s.channel_absmax.max() / np.median(s.channel_absmax)  # noqa: E731
    assert ratio(after.tensors[hidden]) < 4 <= ratio(stats.tensors[hidden])


def test_the_8_bit_hidden_grid_gets_better():
    model, feeds, stats = _calibrated(_block())
    new, _, _ = _calibrated(peel(model, stats).proto)
    res_add = next(n.name for n in model.graph.node if n.output[0] == "res")
    last = next(n.name for n in model.graph.node if n.output[0] == "y")
    stream = ("LayerNormalization_1", res_add, last)
    before = Plan(default=Precision.A8_W8,
                  overrides=tuple((g, Precision.A16_W16) for g in stream))
    after = Plan(default=Precision.A8_W8, overrides=(
        *before.overrides, (f"{res_add}/peel", Precision.A16_W16)))
    e0 = quantized_error(model.proto, calibrate_and_quantize(model, feeds, before), feeds)
    e1 = quantized_error(model.proto, calibrate_and_quantize(new, feeds, after), feeds)
    assert e1["sqnr_db"] > e0["sqnr_db"] + 2, (e0, e1)


def test_what_it_leaves_and_why():
    model, _, stats = _calibrated(_block(outlier=1.0))
    r = peel(model, stats)
    assert not r.changes and "median" in dict(r.skipped)["MatMul_2"]
    model, _, stats = _calibrated(_block())
    split = load_proto(split_tokens(model, seq_len=SEQ, chunk=4, linears=True).proto)
    _, _, split_stats = _calibrated(split.proto)
    why = dict(peel(split, split_stats).skipped)
    assert "run peel before tokensplit" in why["MatMul_2/tok0"]


def test_after_outscale_with_the_same_stats_then_tokensplit():
    model, feeds, stats = _calibrated(_block(outlier=12.0))
    scaled = load_proto(outscale(model, stats, min_ratio=1.0).proto)
    r = peel(scaled, stats)  # outscale left the hidden tensor as it was
    assert r.changes
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_allclose(a[0], b[0], rtol=1e-4, atol=1e-4)
    split = load_proto(split_tokens(load_proto(r.proto), seq_len=SEQ, chunk=4).proto)
    names = {g.name for g in find_groups(split).groups}
    res_add = next(n.name for n in model.graph.node if n.output[0] == "res")
    assert {f"{res_add}/peel/tok0", f"{res_add}/peel/tok1"} <= names


def test_cli_peel(tmp_path, capsys):
    from quantscope.serde import write_stats

    src = tmp_path / "blk.onnx"
    onnx.save(_block(), src)
    _, _, stats = _calibrated(_block())
    write_stats(tmp_path / "s.npz", stats)
    before = src.read_bytes()
    out = tmp_path / "p.onnx"
    assert main(["peel", str(src), "--stats", str(tmp_path / "s.npz"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 FFN(s)" in text and UNVERIFIED in text and "calibrate it again" in text
    assert src.read_bytes() == before
    assert any(n.name.endswith("/peel") for n in onnx.load(out).graph.node)
    capped = tmp_path / "c.onnx"
    assert main(["peel", str(src), "--stats", str(tmp_path / "s.npz"), "--factor", "1.2",
                 "--max-channels", "2", "--out", str(capped)]) == 0
    assert "2 hidden channel(s)" in capsys.readouterr().out
    bad = tmp_path / "bad.onnx"
    assert main(["peel", str(src), "--stats", str(tmp_path / "s.npz"), "--factor", "1000",
                 "--out", str(bad)]) == 2
    assert "nothing written" in capsys.readouterr().err and not bad.exists()


@pytest.mark.parametrize("factor", ["0", "-2"])
def test_cli_factor_must_be_positive(tmp_path, capsys, factor):
    src = tmp_path / "blk.onnx"
    onnx.save(_block(), src)
    assert main(["peel", str(src), "--stats", str(src), "--factor", factor,
                 "--out", str(tmp_path / "o.onnx")]) == 2
    assert "factor" in capsys.readouterr().err


def test_run_with_outscale_peel_and_tokensplit(tmp_path, capsys):
    from quantscope.serde import read_json

    onnx.save(_block(), tmp_path / "blk.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (32, SEQ)).astype(np.int64))
    argv = ["run", str(tmp_path / "blk.onnx"), "--data", str(tmp_path / "x.npz"),
            "--target", "hailo10h", "--out", str(tmp_path / "W"), "--peel",
            "--seq-len", str(SEQ), "--tokensplit", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "peel: each FFN's outlier hidden channels" in out and UNVERIFIED in out
    verdict = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert verdict["peel"] and verdict["tokensplit"] and not verdict["outscale"]
    compiled = {n.name for n in onnx.load(tmp_path / "W" / "repaired.onnx").graph.node}
    assert any(n.endswith("/peel/tok0") for n in compiled)  # rewritten, then split


def test_the_planners_residual_candidate_takes_the_new_skip_branch_layers():
    """The planner's residual-stream candidate includes the layers outscale and peel put
    on the skip branch (at 8 bit they would carry the stream's error)."""
    from test_search import _sens, _toy_target

    from quantscope.plan.search import search

    model, _, stats = _calibrated(_block())
    new = load_proto(peel(load_proto(outscale(model, stats, min_ratio=1.0).proto),
                          stats).proto)
    groups = find_groups(new)
    res_add = next(n.name for n in model.graph.node if n.output[0] == "res")
    skip = {f"{res_add}/outscale/in", f"{res_add}/peel"}
    assert skip <= set(groups.names())
    gains = {g: {"a16_w16": 0.0} for g in groups.names()}

    stream = skip | {res_add}

    def evaluate(plan):  # every prediction is 0: only the residual candidate finds these
        return 0.5 + 0.1 * len(stream & set(dict(plan.overrides)))

    r = search(groups, _sens(gains), _toy_target(), new, max_cost=3.0, evaluate=evaluate)
    assert stream <= set(dict(r.plan.overrides)) and r.measured == pytest.approx(0.8)
    assert [t.origin for t in r.trials].count("residual") == 1


def test_a_second_tier_gets_names_of_its_own():
    """peel twice (the extreme channels, then the next tier with a lower factor): the
    second pass names its nodes '/peel2', the function is unchanged, max_peel caps it."""
    proto = _block()
    w1 = next(t for t in proto.graph.initializer if t.name == "w1")
    arr = numpy_helper.to_array(w1).copy()
    arr[:, 9] *= 4.0  # a second, milder outlier channel
    w1.CopyFrom(numpy_helper.from_array(arr, "w1"))
    model, feeds, stats = _calibrated(proto)
    first = load_proto(peel(model, stats, factor=4.0, max_peel=1).proto)
    _, _, stats1 = _calibrated(first.proto)
    r = peel(first, stats1, factor=2.0, max_peel=1)
    names = [n.name for n in r.proto.graph.node]
    assert len(names) == len(set(names))
    assert any(n.endswith("/peel2") for n in names) and any(n.endswith("/peel") for n in names)
    assert "'<Add>/peel2'" in r.reason
    meta = {m.key: m.value for m in r.proto.metadata_props}[METADATA_KEY]
    assert meta.startswith("sites=1 factor=4; peel2: sites=1 factor=2;") and UNVERIFIED in meta
    split = [c for c in r.changes if c.kind == "split"]
    assert all(len(c.channels) == 1 for c in split)  # max_peel
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_allclose(a[0], b[0], rtol=1e-4, atol=1e-4)
