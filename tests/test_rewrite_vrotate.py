"""R2 (``vrotate``: each attention head's values rotated in the value and output
projections) on the tiny decoder (GQA 4/2): FP32-identical within 1e-4 on both phases with
the V cache in the rotated basis, the same weights in both phase graphs, together with R1,
and its precondition says no on an encoder."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from decoder_tiny import TINY, phase_graphs, prefill_then_decode, run_graph
from numpy import testing
from test_repair_heads import _encoder as attention_encoder

from quantscope.model.load import load_proto
from quantscope.repair.rotate import rotation_matrix
from quantscope.repair.rotate_heads import find_value_heads, value_basis
from quantscope.rewrites.base import run_rewrite
from quantscope.rewrites.phases import rewrite_phases
from quantscope.rewrites.registry import REWRITES
from quantscope.targets import load_target

IDS = np.array([3, 7, 11, 5, 2, 9, 40, 17], np.int64)
VROTATE = REWRITES["vrotate"]


_graphs, _run = phase_graphs, run_graph  # the shared tiny-decoder helpers


def _prefill_then_decode(graphs: dict[str, onnx.ModelProto]
                         ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Logits of a 5-token prefill, then of 3 decode steps on its own cache; the last cache."""
    return prefill_then_decode(graphs, IDS)


def _close(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for x, y in zip(a, b, strict=True):
        assert float(np.abs(x - y).max()) <= 1e-4 * float(np.abs(x).max())


def test_r2_keeps_both_phases_fp32_identical_with_the_v_cache_rotated() -> None:
    models = _graphs()
    results = rewrite_phases(VROTATE, models, seq_len=8)  # raises if shared weights differ
    for r in results.values():
        assert r.applied and r.fp32_diff <= 1e-4
        assert "R2 (hadamard, 8 wide) on the value heads of 2 attention(s)" in r.reason
        assert {c.tensor for c in r.changes} == {
            f"layers.{i}.{p}_proj.weight.T" for i in range(2) for p in ("v", "o")}
    before, cache = _prefill_then_decode({p: m.proto for p, m in models.items()})
    after, cache_r = _prefill_then_decode({p: r.proto for p, r in results.items()})
    _close(before, after)
    h = rotation_matrix(TINY.head_dim)[0]
    for i in range(TINY.layers):  # the V cache holds the old values times H per head
        testing.assert_allclose(cache_r[f"present.{i}.value"], cache[f"present.{i}.value"] @ h,
                                atol=1e-5)
        testing.assert_allclose(cache_r[f"present.{i}.key"], cache[f"present.{i}.key"],
                                atol=1e-5)


def test_without_the_cache_basis_the_decode_check_refuses_it() -> None:
    """The decode graph's FP32 check needs its V cache fed rotated: without the entry's
    ``basis`` the rewrite is refused (the check is not vacuous), with it it passes."""
    decode = _graphs()["decode"]
    assert set(value_basis(decode)) == {f"{k}.{i}.value" for k in ("past", "present")
                                        for i in range(2)}
    bare = dataclasses.replace(VROTATE, basis=None)
    refused = run_rewrite(bare, decode, seq_len=8,
                          input_shapes=(("input_ids", (1, 1)),
                                        *((f"past.{i}.{k}", (1, 2, 8, 8)) for i in range(2)
                                          for k in ("key", "value"))))
    assert refused.failed is not None and "changed the FP32 outputs" in refused.failed
    assert refused.proto is decode.proto


def test_r2_with_r1_and_with_grouped_heads_of_three() -> None:
    """With the residual rotation (R1) first, and on a decoder whose query heads share a
    KV head three to one (smollm2-135m's 9/3), FP32 is unchanged on both phases."""
    cfg = dataclasses.replace(TINY, hidden=48, heads=6, kv_heads=2)
    models = _graphs(cfg, seed=1)
    rotated = rewrite_phases(REWRITES["rotate"], models, seq_len=8)
    r1 = {p: load_proto(r.proto, source=p) for p, r in rotated.items()}
    both = rewrite_phases(VROTATE, r1, seq_len=8)
    assert all(r.applied for r in both.values())
    before, _ = _prefill_then_decode({p: m.proto for p, m in models.items()})
    after, _ = _prefill_then_decode({p: r.proto for p, r in both.items()})
    _close(before, after)


def test_the_precondition_says_no_on_an_encoder_in_words() -> None:
    encoder = load_proto(attention_encoder())
    pre = VROTATE.applies(encoder, load_target("hailo10h"), 16, None)
    assert not pre.holds and "reach no KV cache" in pre.reason
    r = run_rewrite(VROTATE, encoder, seq_len=16)
    assert not r.applied and r.proto is encoder.proto
    decoder = _graphs()["prefill"]
    yes = VROTATE.applies(decoder, None, 8, None)
    assert yes.holds and "2 attention(s) with 8-wide value heads" in yes.reason
    heads = find_value_heads(decoder)
    assert not isinstance(heads, str) and [h.caches for h in heads] == [
        ("present.0.value",), ("present.1.value",)]


def test_a_decoder_run_with_r2_says_the_v_cache_is_rotated(tmp_path) -> None:
    """``run --rewrites vrotate`` on the tiny decoder: both phase graphs rewritten, and the
    host's KV cache layout says the values are stored rotated (a cache made by the
    un-rotated graph would be read wrong)."""
    import json

    from decoder_tiny import AMOUNTS, SEQ, byte_decoder, run_cli

    out = tmp_path / "run"
    code, _ = run_cli(["run", str(byte_decoder(tmp_path)), "--data", "stdlib-docs",
                       "--target", "hailo10h", "--seq-len", str(SEQ), "--rewrites", "vrotate",
                       "--w4", "off", *AMOUNTS, "--out", str(out)])
    assert code == 0
    notes = json.loads((out / "rewrite.json").read_text())["notes"]["vrotate"]
    assert all("R2 (hadamard, 8 wide)" in notes[p] for p in ("prefill", "decode"))
    layout = json.loads((out / "host.json").read_text())["kv_cache"]["layout"]
    assert "the values are stored rotated per head (vrotate, QuaRot R2)" in layout
    assert "stored rotated" in (out / "host.md").read_text()


def test_a_second_reader_of_the_values_stops_it_in_words() -> None:
    """A node outside the attention reading the value projection's output would see the
    rotated values: the precondition names it and nothing is rewritten."""
    prefill = _graphs()["prefill"]
    proto = onnx.ModelProto()
    proto.CopyFrom(prefill.proto)
    proto.graph.node.append(onnx.helper.make_node("Relu", ["layers.1.v_proj"], ["v_peek"],
                                                  name="v_peek"))
    proto.graph.output.append(onnx.helper.make_tensor_value_info(
        "v_peek", onnx.TensorProto.FLOAT, [1, "sequence", 16]))
    model = load_proto(proto)
    pre = VROTATE.applies(model, None, 8, None)
    assert not pre.holds and pre.reason == "'v_peek' (Relu) also reads the values"
    assert not run_rewrite(VROTATE, model, seq_len=8).applied


def test_a_computed_head_split_is_said_not_guessed() -> None:
    """A head split whose shape is computed (as a torch export's ``Concat`` of shape
    pieces) gives no constant head_dim: the precondition says which Reshape."""
    proto = onnx.ModelProto()
    proto.CopyFrom(_graphs()["prefill"].proto)
    split = next(n for n in proto.graph.node if n.name == "layers.0.attn.v.split")
    proto.graph.node.insert(0, onnx.helper.make_node("Identity", [split.input[1]],
                                                     ["v_shape"], name="v_shape"))
    split.input[1] = "v_shape"
    pre = VROTATE.applies(load_proto(proto), None, 8, None)
    assert not pre.holds and pre.reason.startswith(
        "the head split of the values 'layers.0.attn.v.split' has a computed shape")
