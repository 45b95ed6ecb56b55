"""tokensplit: token-wise layers split along the sequence (hailo.super_defuse) on a tiny encoder."""

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
from quantscope.repair.tokens import METADATA_KEY, UNVERIFIED, sample_feeds, split_tokens
from quantscope.repair.verify import calibrate_and_quantize, quantized_error, run_all
from quantscope.targets import load_target, with_params
from quantscope.types import Plan, Precision, QuantscopeError

H = 24
SEQ = 8
# a post-LN block: the residual stream (Adds, LayerNorms) is 16-bit-worthy and token-wise
SMALL = with_params(load_target("hailo10h"), {"hailo.super_defuse.max_values": SEQ * H})


def _encoder(whole: bool = False) -> onnx.ModelProto:
    """``whole``: the first LayerNorm normalises over tokens and channels (not token-wise)."""
    axis = 1 if whole else -1
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    enc (int64[N, S] input_ids, int64[N, S] attention_mask) => (float[N, S, {H}] y) {{
        e = Gather (table, input_ids)
        p = Identity (e)
        n1 = LayerNormalization <axis = {axis}, epsilon = 0.00001> (p, g1, be1)
        h = MatMul (n1, w1)
        hb = Add (h, b1)
        r = Relu (hb)
        o = MatMul (r, w2)
        res = Add (n1, o)
        y = LayerNormalization <axis = -1, epsilon = 0.00001> (res, g2, be2)
    }}
    """
    rng = np.random.default_rng(0)
    model = parser.parse_model(text)
    weights = {
        "table": rng.normal(0, 1, (1000, H)),
        "g1": 1 + rng.normal(0, 0.1, H), "be1": rng.normal(0, 0.1, H),
        "w1": rng.normal(0, 0.2, (H, 2 * H)), "b1": rng.normal(0, 0.1, 2 * H),
        "w2": rng.normal(0, 0.2, (2 * H, H)),
        "g2": 1 + rng.normal(0, 0.1, H), "be2": rng.normal(0, 0.1, H),
    }
    weights["g1"][3] = 40.0  # an outlier channel in the residual stream
    model.graph.initializer.extend(
        numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items())
    onnx.checker.check_model(model)
    return model


def _names(model):
    return {g.name: g for g in find_groups(model).groups}


def test_split_keeps_function_names_and_stream():
    model = load_proto(_encoder())
    r = split_tokens(model, seq_len=SEQ, chunk=4)
    split = load_proto(r.proto)
    groups = _names(split)
    # every residual Add and LayerNorm became two chunk groups; Q/K/V-like readers get a Concat
    for g in ("LayerNormalization_2", "Add_7", "LayerNormalization_8"):
        assert f"{g}/tok0" in groups and f"{g}/tok1" in groups and g not in groups
    assert groups["LayerNormalization_2/concat"].op_type == "Concat"
    # the residual stream stays in chunks: Add/tok0 reads the LayerNorm's chunk 0 directly
    nodes = {n.name: n for n in split.graph.node}
    assert "n1/tok0" in nodes["Add_7/tok0"].input
    assert [i.name for i in split.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in split.graph.output] == ["y"]
    assert METADATA_KEY in {p.key for p in split.proto.metadata_props}
    assert UNVERIFIED in r.reason and dict(r.effect)["chunks"] == 2
    # FP32 unchanged at the length, at a shorter one (chunk 1 empty) and a longer one
    feeds = sample_feeds(model, (SEQ, 3, 11))
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_array_equal(a[0], b[0])


def test_split_makes_the_16_bit_residual_stream_legal():
    model = load_proto(_encoder())
    stream = ("LayerNormalization_2", "Add_7", "LayerNormalization_8")
    shapes = {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}
    plan = Plan(default=Precision.A8_W8,
                overrides=tuple((g, Precision.A16_W16) for g in stream))
    before = check(plan, find_groups(model), model, SMALL, shapes=shapes)
    assert sorted(p.group for p in before if p.rule == "hailo.super_defuse") == sorted(stream)
    split = load_proto(split_tokens(model, seq_len=SEQ, chunk=4).proto)
    chunked = Plan(default=Precision.A8_W8, overrides=tuple(
        (f"{g}/tok{i}", Precision.A16_W16) for g in stream for i in range(2)))
    assert [p for p in check(chunked, find_groups(split), split, SMALL, shapes=shapes) if p.severity != "info"] == []  # no error
    # the Concat that feeds the FFN is as wide as before: at 16 bit it is still refused
    wide = Plan(default=Precision.A8_W8,
                overrides=(("LayerNormalization_2/concat", Precision.A16_W16),))
    assert [p.rule for p in check(wide, find_groups(split), split, SMALL, shapes=shapes) if p.severity != "info"] == [
        "hailo.super_defuse"]


def test_chunked_plan_quantizes_and_beats_8_bit_on_the_residual_stream():
    model = load_proto(_encoder())
    split = load_proto(split_tokens(model, seq_len=SEQ, chunk=4).proto)
    feeds = sample_feeds(model, (SEQ, SEQ, 3), seed=1)  # a batch shorter than a chunk too
    calibrate(split, find_groups(split), iter(feeds))  # empty chunks calibrate
    stream = [g for g in _names(split) if g.rsplit("/", 1)[-1] in ("tok0", "tok1")]
    a8 = quantized_error(model.proto, calibrate_and_quantize(split, feeds, Plan.uniform(
        Precision.A8_W8)), feeds)
    a16 = quantized_error(model.proto, calibrate_and_quantize(split, feeds, Plan(
        default=Precision.A8_W8, overrides=tuple((g, Precision.A16_W16) for g in stream))),
        feeds)
    # 20.6 -> 23.6 dB before the word lookup's range was its table's (h47); since, 21.4 ->
    # 22.6 dB: the stream at 16 bit still beats 8 bit, by less (the lookup feeding it is
    # on its table's wider 8-bit grid)
    assert np.isfinite(a8["sqnr_db"]) and a16["sqnr_db"] > a8["sqnr_db"] + 1


def test_non_token_wise_layers_are_left_whole_with_the_reason():
    model = load_proto(_encoder(whole=True))
    r = split_tokens(model, seq_len=SEQ, chunk=4)
    why = dict(r.skipped)
    assert "not over the last axis" in why["LayerNormalization_2"]
    names = _names(load_proto(r.proto))
    assert "LayerNormalization_2" in names and "Add_7/tok0" in names  # the rest is split
    with pytest.raises(QuantscopeError, match="give --input-shape"):
        sample_feeds(load_proto(tiny_models.layernorm_block()), (SEQ,))
    with pytest.raises(QuantscopeError, match="give --seq-len"):
        split_tokens(model, chunk=4)  # the token count is symbolic
    with pytest.raises(QuantscopeError, match="below --seq-len"):
        split_tokens(model, seq_len=SEQ, chunk=SEQ)


def test_cli_tokensplit(tmp_path, capsys):
    src = tmp_path / "enc.onnx"
    onnx.save(_encoder(), src)
    before = src.read_bytes()
    out = tmp_path / "split.onnx"
    assert main(["tokensplit", str(src), "--seq-len", str(SEQ), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3 token-wise layer(s)" in text and "unverified on a device" in text
    assert "max relative diff 0" in text
    assert "LayerNormalization_2/tok1" in _names(load_proto(onnx.load(out)))
    assert src.read_bytes() == before
    bad = tmp_path / "bad.onnx"
    assert main(["tokensplit", str(src), "--seq-len", "4", "--chunk", "4",
                 "--out", str(bad)]) == 2
    assert "below --seq-len" in capsys.readouterr().err and not bad.exists()
    assert main(["tokensplit", str(src), "--seq-len", str(SEQ), "--out", str(src)]) == 2
    assert "never overwritten" in capsys.readouterr().err and src.read_bytes() == before


def test_cli_tokensplit_takes_the_tokenizer_along(tmp_path, capsys):
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    onnx.save(_encoder(), a / "enc.onnx")
    (a / "tokenizer.json").write_text('{"mine": 1}')
    argv = ["tokensplit", str(a / "enc.onnx"), "--seq-len", str(SEQ), "--out"]
    assert main([*argv, str(b / "split.onnx")]) == 0
    assert "copied its tokenizer tokenizer.json" in capsys.readouterr().out
    assert (b / "tokenizer.json").read_text() == '{"mine": 1}'
    (c / "tokenizer.json").write_text('{"other": 2}')  # never overwritten
    assert main([*argv, str(c / "split.onnx")]) == 2
    assert "is not the tokenizer" in capsys.readouterr().err
    assert not (c / "split.onnx").exists() and (c / "tokenizer.json").read_text() == '{"other": 2}'


def test_run_with_tokensplit_works_on_the_split_model(tmp_path, capsys):
    from quantscope.serde import read_json

    onnx.save(_encoder(), tmp_path / "enc.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (32, SEQ)).astype(np.int64),
             attention_mask=np.ones((32, SEQ), np.int64))
    # --repairs none: what is checked is the split, not the repairs (run --tokensplit with
    # the default repairs: test_repair_outscale's test_run_with_outscale_and_tokensplit)
    argv = ["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
            "--target", "hailo10h", "--repairs", "none", "--out", str(tmp_path / "W")]
    # no --seq-len: the token count is every sample's in the data, said (it was refused
    # with 'give --seq-len' before run took the size from the data)
    assert main([*argv[:-1], str(tmp_path / "W0"), "--tokensplit", "4"]) == 0
    assert f"input-shape: input_ids=1x{SEQ}, attention_mask=1x{SEQ}, the size of every " \
        "sample" in capsys.readouterr().err
    assert main([*argv, "--tokensplit-linears"]) == 2
    assert "needs --tokensplit" in capsys.readouterr().err and not (tmp_path / "W").exists()
    assert main([*argv, "--seq-len", str(SEQ), "--tokensplit", "4"]) == 0
    out = capsys.readouterr().out
    assert "tokensplit: LayerNorms and residual Adds split" in out and UNVERIFIED in out
    verdict = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert verdict["tokensplit"]["chunk"] == 4 and verdict["legal"]
    compiled = onnx.load(tmp_path / "W" / "repaired.onnx")  # what the compiler gets: split
    assert any(n.name == "LayerNormalization_2/tok1" for n in compiled.graph.node)
    assert METADATA_KEY in {p.key for p in compiled.metadata_props}
    # with the Linears: a changed split reruns every stage (the model digest includes it)
    assert main([*argv, "--seq-len", str(SEQ), "--tokensplit", "4", "--tokensplit-linears"]) == 0
    out = capsys.readouterr().out
    assert "stages run: calibrate," in out
    compiled = onnx.load(tmp_path / "W" / "repaired.onnx")
    assert any(n.name == "MatMul_3/tok1" for n in compiled.graph.node)


def test_auto_tokensplit_judges_at_the_size_the_data_gives(tmp_path, capsys):
    """run without --seq-len takes input_ids' size from the data (8 tokens); the auto
    trial of tokensplit said "the token-wise layers' size is unknown: give --seq-len N or
    --input-shape" and was not tried. Now it judges the size rule at those 8 tokens."""
    from pathlib import Path

    import quantscope.targets as targets
    from quantscope.serde import read_json

    text = (Path(targets.__file__).parent / "hailo10h.toml").read_text()
    small = tmp_path / "small10h.toml"  # the 16-bit size limit of SMALL: binds at 8 tokens
    small.write_text(text.replace("max_values = { value = 98304",
                                  f"max_values = {{ value = {SEQ * H}")
                     .replace('name = "hailo10h"', 'name = "small10h"'))
    onnx.save(_encoder(), tmp_path / "enc.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (32, SEQ)).astype(np.int64),
             attention_mask=np.ones((32, SEQ), np.int64))
    # --repairs none: the auto rewrites' trial is what is checked, not the repairs (the
    # default repairs beside the auto rewrites: test_plan_between's runs)
    assert main(["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", str(small), "--repairs", "none", "--out",
                 str(tmp_path / "W")]) == 0
    assert f"input-shape: input_ids=1x{SEQ}" in capsys.readouterr().err
    rows = read_json(tmp_path / "W" / "verdict.json", "verdict")["rewrites_auto"]["rows"]
    row = next(r for r in rows if r["rewrite"] == "tokensplit")
    assert "unknown" not in row["why"] and f"at {SEQ} tokens" in row["why"], row
    assert row["decision"] in ("kept", "dropped"), row


def test_a_vit_block_splits_by_its_static_token_count(tmp_path, capsys):
    """A ViT's residual stream [B, 5 tokens, 16] (decomposed LayerNorms, layer-scale Adds)."""
    import tiny_vit

    src = tmp_path / "vit.onnx"
    onnx.save(tiny_vit.vit_block(), src)
    out = tmp_path / "split.onnx"
    assert main(["tokensplit", str(src), "--out", str(out)]) == 0  # chunk: ceil(5 / 2) = 3
    text = capsys.readouterr().out
    assert "on [B, 5, H] split into 2 chunks of 3 tokens" in text and "random inputs" in text
    model, split = load_proto(tiny_vit.vit_block()), load_proto(onnx.load(out))
    feeds = [tiny_vit.tokens(4, seed=i) for i in range(2)]
    for a, b in zip(run_all(model.proto, feeds), run_all(split.proto, feeds), strict=True):
        np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-6)
    groups = _names(split)
    assert {groups[g].op_type for g in groups if g.endswith("/tok1")} >= {
        "Add", "LayerNormalization"}  # residual Adds and the decomposed LayerNorms


def test_a_split_model_is_still_cut_into_segments_and_sweeps_exactly():
    """The analysis cuts at the residual stream; split, the stream is a tensor and its
    chunks: still a cut (else one segment: every candidate a whole-model session)."""
    from quantscope.analyze import Scorer, sweep_naive, sweep_segments
    from quantscope.analyze.segments import find_segments

    model = load_proto(split_tokens(load_proto(_encoder()), seq_len=SEQ, chunk=4).proto)
    groups = find_groups(model)
    assert len(find_segments(model, groups)) >= 3
    feeds = sample_feeds(model, (SEQ, SEQ, SEQ), seed=2)
    stats = calibrate(model, groups, iter(feeds))
    kw = {"scorer": Scorer(), "low": Precision.A8_W8, "high": Precision.A16_W16}
    fast = sweep_segments(model, groups, stats, feeds, **kw, optimize_float=False)
    naive = sweep_naive(model, groups, stats, feeds, **kw)
    for a, b in zip(fast.rows, naive.rows, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_linears_read_the_chunks_directly():
    model = load_proto(_encoder())
    r = split_tokens(model, seq_len=SEQ, chunk=4, linears=True)
    split = load_proto(r.proto)
    groups = _names(split)
    assert {"MatMul_3/tok0", "MatMul_6/tok1"} <= set(groups)  # the FFN in chunks
    assert "LayerNormalization_2/concat" not in groups  # every reader of n1 is split
    nodes = {n.name: n for n in split.graph.node}
    assert "n1/tok0" in nodes["MatMul_3/tok0"].input
    assert [g for g in groups if g.endswith("/concat")] == ["LayerNormalization_8/concat"]
    feeds = sample_feeds(model, (SEQ, 3, 11))
    for a, b in zip(run_all(model.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_array_equal(a[0], b[0])
    # a 16-bit LayerNorm feeding 8-bit Linears is legal: no full-width 16-bit tensor left
    plan = Plan(default=Precision.A8_W8, overrides=tuple(
        (g, Precision.A16_W16) for g in groups if g.startswith(("LayerNorm", "Add_7"))
        and not g.endswith("/concat")))
    shapes = {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}
    assert [p for p in check(plan, find_groups(split), split, SMALL, shapes=shapes) if p.severity != "info"] == []  # no error


def test_bias_correction_gives_each_chunk_of_a_shared_linear_its_own_bias():
    from quantscope.repair.bias_correction import correct_biases

    split = load_proto(split_tokens(load_proto(_encoder()), seq_len=SEQ, chunk=4,
                                    linears=True).proto)
    feeds = sample_feeds(split, (SEQ, SEQ), seed=3)
    r = correct_biases(split, feeds, Plan.uniform(Precision.A8_W8))
    onnx.checker.check_model(r.proto)  # no initializer name twice
    inits = {t.name for t in r.proto.graph.initializer}
    # MatMul_3's chunks shared the bias b1 (chunk 0 gets a copy, chunk 1 keeps b1 alone);
    # MatMul_6 had none: each chunk gets one
    assert {"b1", "b1/MatMul_3/tok0", "MatMul_6/tok0/bias", "MatMul_6/tok1/bias"} <= inits
    nodes = {n.name: n for n in r.proto.graph.node}
    assert "b1/MatMul_3/tok0" in nodes["Add_4/tok0"].input and "b1" in nodes["Add_4/tok1"].input


def test_a_static_token_input_is_checked_at_its_own_length(tmp_path, capsys):
    model = _encoder()
    for inp in model.graph.input:  # [1, 8]: no --seq-len needed
        for d, v in zip(inp.type.tensor_type.shape.dim, (1, SEQ), strict=True):
            d.ClearField("dim_param")
            d.dim_value = v
    for out in model.graph.output:
        out.type.tensor_type.shape.dim[0].dim_value = 1
        out.type.tensor_type.shape.dim[1].dim_value = SEQ
    src = tmp_path / "static.onnx"
    onnx.save(model, src)
    assert main(["tokensplit", str(src), "--out", str(tmp_path / "s.onnx")]) == 0
    assert "on [B, 8, H] split into 2 chunks of 4 tokens" in capsys.readouterr().out


def test_bias_correction_leaves_a_chunk_no_text_reaches_unshifted():
    """Feeds shorter than one chunk: chunk 1 sees no values; its bias stays finite (no
    0/0 mean) and unchanged."""
    import warnings

    from onnx import numpy_helper as nh

    from quantscope.repair.bias_correction import correct_biases

    split = load_proto(split_tokens(load_proto(_encoder()), seq_len=SEQ, chunk=4,
                                    linears=True).proto)
    feeds = sample_feeds(split, (3, 2), seed=3)  # every chunk 1 empty
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = correct_biases(split, feeds, Plan.uniform(Precision.A8_W8))
    arrays = {t.name: nh.to_array(t) for t in r.proto.graph.initializer}
    assert all(np.isfinite(a).all() for a in arrays.values() if a.dtype.kind == "f")
    np.testing.assert_array_equal(arrays["MatMul_6/tok1/bias"], 0.0)
