"""headsplit: multi-head attention split into one layer per head (own 8-bit grid per head)."""

import numpy as np
import onnx
import pytest
import tiny_models
from onnx import numpy_helper, parser

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.check import check
from quantscope.repair.heads import METADATA_KEY, UNVERIFIED, split_heads
from quantscope.repair.tokens import sample_feeds
from quantscope.repair.verify import calibrate_and_quantize, quantized_error, run_all
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

HEADS, D = 3, 4
W = HEADS * D
SEQ = 8


def _encoder(head_bias: bool = False) -> onnx.ModelProto:
    """A BERT-like attention layer: Q/K/V, heads by Reshape/Transpose, the HF additive
    mask [B,1,1,S], one sharp head and one diffuse one (so one grid fits neither)."""
    bias = "    sb = Add (sm, hbias)\n" if head_bias else "    sb = Identity (sm)\n"
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    enc (int64[N, S] input_ids, int64[N, S] attention_mask) => (float[N, S, {W}] y) {{
        e = Gather (table, input_ids)
        q0 = MatMul (e, wq)
        q = Add (bq, q0)
        k0 = MatMul (e, wk)
        k = Add (bk, k0)
        v0 = MatMul (e, wv)
        v = Add (bv, v0)
        qr = Reshape (q, hshape)
        qh = Transpose <perm = [0, 2, 1, 3]> (qr)
        kr = Reshape (k, hshape)
        kt = Transpose <perm = [0, 2, 3, 1]> (kr)
        vr = Reshape (v, hshape)
        vh = Transpose <perm = [0, 2, 1, 3]> (vr)
        s = MatMul (qh, kt)
        ss = Mul (s, scale)
        ax = Constant <value = int64[2] {{1, 2}}> ()
        m1 = Unsqueeze (attention_mask, ax)
        mf = Cast <to = 1> (m1)
        inv = Sub (one, mf)
        madd = Mul (inv, big)
        sm = Add (ss, madd)
    {bias}
        p = Softmax <axis = -1> (sb)
        c = MatMul (p, vh)
        ct = Transpose <perm = [0, 2, 1, 3]> (c)
        cr = Reshape (ct, tshape)
        o = MatMul (cr, wo)
        y = Add (e, o)
    }}
    """
    rng = np.random.default_rng(0)
    wq = rng.normal(0, 0.5, (W, W))
    wk = rng.normal(0, 0.5, (W, W))
    wq[:, :D] *= 6.0  # head 0: sharp (scores over tens of logits)
    wk[:, :D] *= 6.0
    wq[:, D:2 * D] *= 0.05  # head 1: diffuse (probabilities near 1/S)
    weights = {
        "table": rng.normal(0, 1, (1000, W)), "wq": wq, "wk": wk,
        "wv": rng.normal(0, 0.5, (W, W)), "wo": rng.normal(0, 0.5, (W, W)),
        "bq": rng.normal(0, 0.1, W), "bk": rng.normal(0, 0.1, W),
        "bv": rng.normal(0, 0.1, W), "scale": np.array(1 / np.sqrt(D)),
        "one": np.array(1.0), "big": np.array(-10000.0),
        "hbias": rng.normal(0, 1.0, (HEADS, 1, 1)),
    }
    model = parser.parse_model(text)
    model.graph.initializer.extend(
        numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items())
    model.graph.initializer.extend([
        numpy_helper.from_array(np.array([0, 0, HEADS, D], np.int64), "hshape"),
        numpy_helper.from_array(np.array([0, 0, W], np.int64), "tshape")])
    onnx.checker.check_model(model)
    return model


def _feeds(seed: int, n: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for length in (SEQ, SEQ, 5):
        mask = np.ones((n, length), np.int64)
        mask[1:, length - 2:] = 0  # padded rows
        out.append({"input_ids": rng.integers(100, 1000, (n, length)).astype(np.int64),
                    "attention_mask": mask})
    return out


def _names(model):
    return {g.name: g for g in find_groups(model).groups}


def test_split_keeps_function_names_and_kinds():
    model = load_proto(_encoder())
    r = split_heads(model)
    split = load_proto(r.proto)
    groups = _names(split)
    for g in ("MatMul_13", "Softmax_22", "MatMul_23"):  # scores, Softmax, context
        assert all(f"{g}/head{h}" in groups for h in range(HEADS)) and g not in groups
    assert groups["MatMul_23/concat"].op_type == "Concat"
    nodes = {n.name: n for n in split.graph.node}
    assert nodes["MatMul_13/head1"].input[:] == ["qh/head1", "kt/head1"]
    assert nodes["Add_20/head1"].input[1] == "madd"  # the mask is shared, not sliced
    assert [i.name for i in split.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in split.graph.output] == ["y"]
    assert METADATA_KEY in {p.key for p in split.proto.metadata_props}
    assert UNVERIFIED in r.reason and dict(r.effect) == {"attentions": 1.0, "heads": 3.0}
    feeds = _feeds(1)
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-5)


def test_a_per_head_bias_is_sliced_with_the_heads():
    model = load_proto(_encoder(head_bias=True))
    r = split_heads(model)
    nodes = {n.name: n for n in r.proto.graph.node}
    assert "hbias/head2" in nodes["Add_21/head2"].input
    feeds = _feeds(2)
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-5)


def test_per_head_grids_beat_one_grid_with_attention_at_8_bit():
    """Everything at 16 bit but attention (hailo.attention_16bit): one 8-bit grid per head
    fits the diffuse head that one grid for all heads rounds away."""
    model = load_proto(_encoder())
    split = load_proto(split_heads(model).proto)
    feeds = _feeds(3, n=16)
    out = {}
    for name, m in (("whole", model), ("split", split)):
        calibrate(m, find_groups(m), iter(feeds))
        attention = [g.name for g in find_groups(m).groups
                     if g.op_type in ("Softmax", "MatMul") and g.weight is None]
        plan = Plan(default=Precision.A16_W16,
                    overrides=tuple((g, Precision.A8_W8) for g in attention))
        if name == "split":
            plan = Plan(default=plan.default, overrides=(*plan.overrides,
                                                         ("MatMul_23/concat", Precision.A8_W8)))
        out[name] = quantized_error(model.proto, calibrate_and_quantize(m, feeds, plan), feeds)
    assert out["split"]["sqnr_db"] > out["whole"]["sqnr_db"] + 3, out


def test_the_head_layers_keep_their_kinds_for_the_rules():
    model = load_proto(_encoder())
    split = load_proto(split_heads(model).proto)
    groups = find_groups(split)
    target = load_target("hailo10h")
    shapes = {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}
    assert [p for p in check(Plan.uniform(Precision.A8_W8), groups, split, target, shapes=shapes) if p.severity != "info"] == []  # no error
    wide = Plan(default=Precision.A8_W8, overrides=(("Softmax_22/head0", Precision.A16_W16),))
    assert [p.rule for p in check(wide, groups, split, target, shapes=shapes) if p.severity != "info"] == [
        "hailo.attention_16bit"]


def test_attention_it_cannot_split_is_left_whole_with_the_reason():
    single = load_proto(tiny_models.attention())  # [N, S, S] scores: no head axis
    r = split_heads(single)
    assert not r.changes and "no multi-head attention" in r.reason
    assert "is not [B, H, Tq, Tk]" in dict(r.skipped)["Softmax_6"]


def test_cli_headsplit(tmp_path, capsys):
    src = tmp_path / "enc.onnx"
    onnx.save(_encoder(), src)
    before = src.read_bytes()
    out = tmp_path / "split.onnx"
    assert main(["headsplit", str(src), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 attention(s) split into 3 per-head layers" in text and UNVERIFIED in text
    assert "Softmax_22/head2" in _names(load_proto(onnx.load(out)))
    assert src.read_bytes() == before
    none = tmp_path / "single.onnx"
    onnx.save(tiny_models.attention(), none)
    bad = tmp_path / "bad.onnx"
    assert main(["headsplit", str(none), "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "no multi-head attention" in err and "Traceback" not in err and not bad.exists()
    assert main(["headsplit", str(src), "--out", str(src)]) == 2
    assert "never overwritten" in capsys.readouterr().err and src.read_bytes() == before


def test_run_with_headsplit_and_tokensplit(tmp_path, capsys):
    from quantscope.serde import read_json

    onnx.save(_encoder(), tmp_path / "enc.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (32, SEQ)).astype(np.int64),
             attention_mask=np.ones((32, SEQ), np.int64))
    argv = ["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
            "--target", "hailo10h", "--out", str(tmp_path / "W"), "--headsplit"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "headsplit: each attention head a layer of its own" in out and UNVERIFIED in out
    verdict = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert verdict["headsplit"] and verdict["tokensplit"] is None
    compiled = onnx.load(tmp_path / "W" / "repaired.onnx")  # what the compiler gets: split
    assert any(n.name == "Softmax_22/head1" for n in compiled.graph.node)
    assert METADATA_KEY in {p.key for p in compiled.metadata_props}
    # both rewrites: heads first, then the residual Add in chunks; every stage reruns
    assert main([*argv, "--seq-len", str(SEQ), "--tokensplit", "4"]) == 0
    out = capsys.readouterr().out
    assert "stages run: calibrate," in out and "tokensplit:" in out
    compiled = onnx.load(tmp_path / "W" / "repaired.onnx")
    names = {n.name for n in compiled.graph.node}
    assert {"Softmax_22/head1", "Add_27/tok1"} <= names


def test_a_head_split_model_sweeps_exactly():
    from quantscope.analyze import Scorer, sweep_naive, sweep_segments

    model = load_proto(split_heads(load_proto(_encoder())).proto)
    groups = find_groups(model)
    feeds = sample_feeds(model, (SEQ, SEQ), seed=2)
    stats = calibrate(model, groups, iter(feeds))
    kw = {"scorer": Scorer(), "low": Precision.A8_W8, "high": Precision.A16_W16}
    fast = sweep_segments(model, groups, stats, feeds, **kw, optimize_float=False)
    naive = sweep_naive(model, groups, stats, feeds, **kw)
    for a, b in zip(fast.rows, naive.rows, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", [0])
def test_heads_of_a_vit_block_split_by_static_shape(seed):
    import tiny_vit

    model = load_proto(tiny_vit.vit_block(seed=7 + seed))
    r = split_heads(model)
    assert dict(r.effect)["heads"] == 2.0
    feeds = [tiny_vit.tokens(3, seed=i) for i in range(2)]
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-5)
