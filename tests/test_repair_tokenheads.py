"""tokensplit --linears on a head-split model, per head: Q/K/V and the heads' context never
pass through a full-width [T, C] Concat (repair/heads.keep_heads), so their 16-bit grids fit
hailo.super_defuse where the full-width form's do not."""

import dataclasses

import numpy as np
import onnx
from test_cli_rewrites import _options, _run_args
from test_repair_heads import HEADS, SEQ, W
from test_repair_heads import _encoder as attention_encoder

from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.model.shapes import frame_values, resolve_shapes
from quantscope.plan.candidates import max_legal
from quantscope.plan.check import check
from quantscope.repair.heads import split_heads
from quantscope.repair.tokens import sample_feeds, split_tokens
from quantscope.repair.verify import calibrate_and_quantize, quantized_error, run_all
from quantscope.rewrites.registry import REWRITES
from quantscope.targets import load_target, with_params
from quantscope.types import Precision

CHUNK = 4
LIMIT = SEQ * W  # a [SEQ, W] tensor is at the size limit, a chunk's [CHUNK, W] below it
SMALL = with_params(load_target("hailo10h"), {"hailo.super_defuse.max_values": LIMIT})
SHAPES = {"input_ids": (1, SEQ), "attention_mask": (1, SEQ)}


def _heads():
    return load_proto(split_heads(load_proto(attention_encoder())).proto)


def _split(model, **kw):
    return split_tokens(model, seq_len=SEQ, chunk=CHUNK, linears=True, **kw)


def _concats(model):
    return {g.name: g for g in find_groups(model).groups if g.op_type == "Concat"}


def _sixteen_bit_sizes(model, plan):
    """Output values per frame of every non-weighted group the plan keeps at 16 bit (but
    the embedding lookup, which a target may run on the host)."""
    shapes = resolve_shapes(model, SHAPES)
    return {g.name: frame_values(shapes[g.outputs[0]]) for g in find_groups(model).groups
            if g.outputs and g.kind.value != "weighted" and g.op_type != "Gather"
            and plan.precision_of(g.name).act_bits == 16}


def test_per_head_keeps_fp32_and_writes_no_full_width_concat():
    original = load_proto(attention_encoder())
    heads = _heads()
    r = _split(heads, per_head=True)
    assert dict(r.effect)["per_head_qkv"] == 3 and dict(r.effect)["per_head_contexts"] == 1
    assert "per head: 3 Q/K/V and 1 context Concat(s) kept per head" in r.reason
    split = load_proto(r.proto)
    concats = _concats(split)
    # Q/K/V: one Concat over the tokens per head; the context: one over the heads per chunk;
    # the graph output's Concat (y) is the one full-width Concat left
    assert {f"Add_{n}/concat/head{h}" for n in (2, 4, 6) for h in range(HEADS)} \
        | {"MatMul_23/concat/tok0", "MatMul_23/concat/tok1", "Add_27/concat"} == set(concats)
    shapes = resolve_shapes(split, SHAPES)
    assert shapes["q/head1"] == (1, SEQ, W // HEADS)
    assert shapes["c/tok0"] == (1, HEADS, CHUNK, W // HEADS)
    # headsplit's copies read the per-head tensors under the names headsplit gave them
    nodes = {n.name: n for n in split.graph.node}
    assert nodes["MatMul_13/head1"].input[:] == ["qh/head1", "kt/head1"]
    assert nodes["MatMul_26/tok1"].input[0] == "cr/tok1"  # the output projection, chunk 1
    assert [i.name for i in split.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in split.graph.output] == ["y"]
    # FP32 unchanged at the length, a shorter one (chunk 1 empty) and a longer one
    feeds = sample_feeds(original, (SEQ, 3, 11))
    for a, b in zip(run_all(original.proto, feeds), run_all(r.proto, feeds), strict=True):
        np.testing.assert_allclose(b[0], a[0], rtol=0, atol=1e-5 * np.abs(a[0]).max())


def test_the_max_legal_plan_keeps_the_per_head_concats_under_the_size_limit():
    heads = _heads()
    models = {"full": load_proto(_split(heads, per_head=False).proto),
              "per": load_proto(_split(heads, per_head=True).proto),
              "relay": load_proto(_split(heads, per_head=True, relay_values=True).proto)}
    plans = {name: max_legal(m, SMALL, SHAPES).plan for name, m in models.items()}
    demoted = {name: {g for g, p in plan.overrides if p is Precision.A8_W8}
               for name, plan in plans.items()}
    # full width: the Q/K/V and context Concats are at the size limit: demoted
    assert {"Add_2/concat", "Add_4/concat", "Add_6/concat", "MatMul_23/concat"} <= demoted["full"]
    uniform16 = {name: check(dataclasses.replace(plans[name], overrides=()),
                             find_groups(m), m, SMALL, shapes=SHAPES)
                 for name, m in models.items()}
    assert "MatMul_23/concat" in {p.group for p in uniform16["full"]
                                  if p.rule == "hailo.super_defuse"}
    for name in ("per", "relay"):
        # per head: super_defuse refuses only the graph output's Concat (and the embedding
        # lookup, [SEQ, W] too, where the target judges it on the device) ...
        wide = {p.group for p in uniform16[name] if p.rule == "hailo.super_defuse"}
        assert "Add_27/concat" in wide and wide <= {"Add_27/concat", "Gather_0"}
        # ... the context's chunk Concats are 16 bit; attention_16bit keeps the Concats
        # an attention MatMul reads at 8 bit (Q, K; V too unless relayed by a Linear)
        assert not {"MatMul_23/concat/tok0", "MatMul_23/concat/tok1"} & demoted[name]
        sizes = _sixteen_bit_sizes(models[name], plans[name])
        assert all(v is not None and v < LIMIT for v in sizes.values()), sizes
        assert [p for p in check(plans[name], find_groups(models[name]), models[name], SMALL,
                                 shapes=SHAPES) if p.severity == "error"] == []
    assert {f"Add_{n}/concat/head{h}" for n in (2, 4, 6) for h in range(HEADS)} <= demoted["per"]
    values = {f"Add_6/concat/head{h}" for h in range(HEADS)}
    relays = {f"{g}/relay" for g in values}
    assert not (values | relays) & demoted["relay"]
    assert relays <= {g.name for g in find_groups(models["relay"]).groups
                      if g.kind.value == "weighted"}


def test_per_head_at_max_legal_is_closer_to_fp32_than_full_width():
    original = load_proto(attention_encoder())
    heads = _heads()
    feeds = sample_feeds(original, (SEQ, SEQ, SEQ, SEQ), seed=3)
    sqnr = {}
    for name, kw in (("full", {"per_head": False}), ("per", {"per_head": True}),
                     ("relay", {"per_head": True, "relay_values": True})):
        m = load_proto(_split(heads, **kw).proto)
        plan = max_legal(m, SMALL, SHAPES).plan
        sqnr[name] = quantized_error(original.proto, calibrate_and_quantize(m, feeds, plan),
                                     feeds)["sqnr_db"]
    assert sqnr["relay"] > sqnr["per"] > sqnr["full"] + 1, sqnr


def test_per_head_needs_a_head_split_model_and_linears_and_says_why():
    plain = load_proto(attention_encoder())
    r = _split(plain, per_head=True)
    assert "per head: not applied: the model is not head-split (run headsplit" in r.reason
    assert "per_head_qkv" not in dict(r.effect)
    assert "Add_2/concat" in _concats(load_proto(r.proto))  # the full-width form
    r = split_tokens(_heads(), seq_len=SEQ, chunk=CHUNK, linears=False, per_head=True)
    assert "per head: not applied: needs --linears" in r.reason
    # the registry's default is per head; full_width keeps the form before it
    rw = REWRITES["tokensplit"]
    on = rw.apply(_heads(), rw.configure(chunk=CHUNK, linears=True), seq_len=SEQ)
    off = rw.apply(_heads(), rw.configure(chunk=CHUNK, linears=True, full_width=True),
                   seq_len=SEQ)
    assert "Add_2/concat/head0" in _concats(load_proto(on.proto))
    assert "Add_2/concat" in _concats(load_proto(off.proto)) and "per head" not in off.reason
    assert on.record["config"] == {"chunk": CHUNK, "linears": True, "full_width": False,
                                   "relay_values": False}


def test_cli_tokensplit_per_head_and_full_width(tmp_path, capsys):
    src = tmp_path / "heads.onnx"
    onnx.save(_heads().proto, src)
    before = src.read_bytes()
    base = ["tokensplit", str(src), "--seq-len", str(SEQ), "--chunk", str(CHUNK), "--linears"]
    assert main([*base, "--out", str(tmp_path / "per.onnx")]) == 0
    assert "per head: 3 Q/K/V and 1 context Concat(s)" in capsys.readouterr().out
    assert main([*base, "--full-width", "--out", str(tmp_path / "full.onnx")]) == 0
    assert "per head" not in capsys.readouterr().out
    assert "Add_2/concat" in _concats(load_proto(onnx.load(tmp_path / "full.onnx")))
    assert src.read_bytes() == before


def test_run_option_full_width_is_generated_and_changes_the_run_key(tmp_path):
    from quantscope.pipeline.context import Context

    argv = [*_run_args(tmp_path), "--rewrites", "headsplit,tokensplit", "--tokensplit-chunk",
            "4", "--tokensplit-linears"]
    per, full = _options(argv), _options([*argv, "--tokensplit-full-width"])
    config = dict(per.rewrite_configs())[REWRITES["tokensplit"]]
    assert config.full_width is False
    assert dict(full.rewrite_configs())[REWRITES["tokensplit"]].full_width is True
    folder = tmp_path / "W"
    assert Context(per, folder).model_digest().endswith(":linears:per_head")
    assert Context(full, folder).model_digest().endswith(":linears")
