"""rowscale: attention weights scaled per row onto the 8-bit grid, context divided by their sum."""

import numpy as np
import onnx
import pytest
from onnx import parser
from test_repair_heads import SEQ, _encoder, _feeds

from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.model.groups import find_groups, find_mask_adds
from quantscope.model.load import load_proto
from quantscope.plan.check import check
from quantscope.repair.heads import split_heads
from quantscope.repair.rowscale import METADATA_KEY, UNVERIFIED, rowscale
from quantscope.repair.verify import calibrate_and_quantize, quantized_error, run_all
from quantscope.targets import load_target
from quantscope.types import Plan, Precision

ROW_STATS = ("rowmax", "shift", "exp", "z", "f", "sum")  # the Div "cap" joins "f"


def _split():
    return load_proto(split_heads(load_proto(_encoder())).proto)


def _same(a, b, feeds):
    for x, y in zip(run_all(a.proto, feeds), run_all(b.proto, feeds), strict=True):
        np.testing.assert_allclose(x[0], y[0], rtol=0, atol=1e-5)


def test_rowscale_keeps_function_and_names():
    model = _split()
    r = rowscale(model)
    out = load_proto(r.proto)
    groups = {g.name: g for g in find_groups(out).groups}
    for h in range(3):
        assert f"Softmax_22/head{h}" not in groups
        assert groups[f"Softmax_22/head{h}/w"].op_type == "Mul"
        assert all(f"Softmax_22/head{h}/{p}" in groups for p in ROW_STATS)
        assert groups[f"MatMul_23/head{h}/norm"].outputs == (f"c/head{h}",)  # same tensor
    nodes = {n.name: n for n in out.graph.node}
    assert nodes["MatMul_23/head1"].input[0] == "p/head1/w"
    assert [o.name for o in out.graph.output] == ["y"]
    assert METADATA_KEY in {p.key for p in out.proto.metadata_props}
    assert UNVERIFIED in r.reason and dict(r.effect) == {"sites": 3.0, "growth": 2.0}
    _same(model, out, _feeds(1))
    # the unsplit attention too (one site), and the given model is not edited
    whole = load_proto(_encoder())
    before = whole.proto.SerializeToString()
    r1 = rowscale(whole)
    assert dict(r1.effect)["sites"] == 1.0 and whole.proto.SerializeToString() == before
    _same(whole, load_proto(r1.proto), _feeds(2))


def test_the_mask_add_is_still_found():
    """The HF mask Add read by a Softmax directly: after rowscale its readers are the row
    max and the shift, and the mask keeps its place below the scores' grid."""
    proto = _encoder()
    ident = next(n for n in proto.graph.node if n.op_type == "Identity")
    for n in proto.graph.node:
        n.input[:] = [ident.input[0] if t == ident.output[0] else t for t in n.input]
    proto.graph.node.remove(ident)
    split = load_proto(split_heads(load_proto(proto)).proto)
    found = {m.node for m in find_mask_adds(split)}
    assert found == {f"Add_20/head{h}" for h in range(3)}
    assert {m.node for m in find_mask_adds(load_proto(rowscale(split).proto))} == found


def _attention_error(model, feeds, eight):
    calibrate(model, find_groups(model), iter(feeds))
    plan = Plan(default=Precision.A16_W16,
                overrides=tuple((g.name, Precision.A8_W8) for g in find_groups(model).groups
                                if eight(g)))
    return quantized_error(_encoder(), calibrate_and_quantize(model, feeds, plan), feeds)["sqnr_db"]


def test_scaled_rows_beat_the_softmax_grid():
    """Everything at 16 bit but the attention weights (the Softmax output; after rowscale
    '<Softmax>/w'): at 64 tokens the diffuse head's weights (near 1/64, four grid steps)
    use more of the 8-bit grid, and the context is renormalised by their sum."""
    rng = np.random.default_rng(3)
    feeds = [{"input_ids": rng.integers(100, 1000, (8, 64)).astype(np.int64),
              "attention_mask": np.ones((8, 64), np.int64)} for _ in range(3)]
    split = _split()
    before = _attention_error(split, feeds, lambda g: g.op_type == "Softmax")
    after = _attention_error(load_proto(rowscale(split).proto), feeds,
                             lambda g: g.name.endswith("/w"))
    assert after > before + 1.5, (before, after)  # measured +2.5 dB


def test_rules_keep_the_weights_at_8_bit_and_allow_the_row_statistics_at_16():
    out = load_proto(rowscale(_split()).proto)
    groups = find_groups(out)
    target = load_target("hailo10h")
    shapes = {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}
    stats16 = tuple((f"Softmax_22/head{h}/{p}", Precision.A16_W16)
                    for h in range(3) for p in ROW_STATS)
    ok = Plan(default=Precision.A8_W8, overrides=stats16)
    assert [p for p in check(ok, groups, out, target, shapes=shapes) if p.severity != "info"] == []  # no error
    bad = Plan(default=Precision.A8_W8, overrides=(("Softmax_22/head1/w", Precision.A16_W16),))
    problems = [p for p in check(bad, groups, out, target, shapes=shapes) if p.severity != "info"]
    assert [(p.group, p.rule) for p in problems] == [
        ("Softmax_22/head1/w", "hailo.attention_16bit")]
    assert "read by MatMul_23/head1 (matmul)" in problems[0].reason
    # weighted producers (the Q/K/V projections) stay as before: the rule names its kinds
    linears = tuple((g.name, Precision.A16_W16) for g in groups.groups if g.weight is not None)
    wide = check(Plan(default=Precision.A8_W8, overrides=linears), groups, out, target,
                 shapes=shapes)
    assert len(linears) == 4 and "hailo.attention_16bit" not in {p.rule for p in wide}


def test_a_softmax_no_matmul_reads_is_left_with_the_reason():
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    cls (float[N, 4] x) => (float[N, 3] p) {
        z = MatMul (x, w)
        p = Softmax <axis = -1> (z)
    }
    """
    model = parser.parse_model(text)
    model.graph.initializer.append(onnx.numpy_helper.from_array(
        np.ones((4, 3), np.float32), "w"))
    r = rowscale(load_proto(model))
    assert not r.changes and "no attention Softmax found" in r.reason
    assert "not read by exactly one MatMul" in dict(r.skipped)["Softmax_1"]
    with pytest.raises(ValueError, match="growth must be >= 1"):
        rowscale(load_proto(_encoder()), growth=0.5)


def test_cli_rowscale(tmp_path, capsys):
    src = tmp_path / "enc.onnx"
    onnx.save(_split().proto, src)
    before = src.read_bytes()
    out = tmp_path / "rs.onnx"
    assert main(["rowscale", str(src), "--growth", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "3 attention Softmax(es) rewritten" in text and "min(Z, 3)" in text
    assert "FP32 outputs unchanged" in text and src.read_bytes() == before
    assert "Softmax_22/head0/w" in {g.name for g in find_groups(load_proto(onnx.load(out))).groups}
    assert main(["rowscale", str(src), "--growth", "0.5", "--out", str(tmp_path / "x.onnx")]) == 2
    assert "below 1" in capsys.readouterr().err and not (tmp_path / "x.onnx").exists()
    assert main(["rowscale", str(src), "--out", str(src)]) == 2
    assert "never overwritten" in capsys.readouterr().err and src.read_bytes() == before


def test_run_with_headsplit_and_rowscale(tmp_path, capsys):
    from quantscope.serde import read_json

    onnx.save(_encoder(), tmp_path / "enc.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (32, SEQ)).astype(np.int64),
             attention_mask=np.ones((32, SEQ), np.int64))
    argv = ["run", str(tmp_path / "enc.onnx"), "--data", str(tmp_path / "x.npz"),
            "--target", "hailo10h", "--out", str(tmp_path / "W"), "--headsplit", "--rowscale"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "rowscale:" in out and UNVERIFIED in out
    verdict = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert UNVERIFIED in verdict["rowscale"]["note"] and verdict["legal"]
    compiled = onnx.load(tmp_path / "W" / "repaired.onnx")  # what the compiler gets
    assert any(n.name == "Softmax_22/head1/w" for n in compiled.graph.node)
    assert METADATA_KEY in {p.key for p in compiled.metadata_props}
