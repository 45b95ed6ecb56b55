"""The rewrite registry: each entry's precondition both ways, the one runner (FP32 check,
input untouched on failure, the metadata record), and a sixth rewrite registered here
running through a whole run and its verdict with no other edit."""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from test_repair_heads import SEQ as HEAD_SEQ
from test_repair_heads import _encoder as attention_encoder
from test_repair_outscale import _block as outscale_block
from test_repair_outscale import _calibrated
from test_repair_peel import _block as peel_block
from test_repair_tokens import SEQ, SMALL
from test_repair_tokens import _encoder as token_encoder

from quantscope.model.load import Model, load_proto
from quantscope.repair import Change, Repair, RepairError
from quantscope.rewrites.base import (
    RECORD_KEY,
    Precondition,
    Rewrite,
    RewriteInput,
    legacy,
    recorded,
    run_rewrite,
)
from quantscope.rewrites.registry import REWRITES, applied_rewrites, hint_for
from quantscope.targets import load_target


def test_the_registry_lists_the_rewrites_in_run_order_with_their_defaults():
    assert list(REWRITES) == ["outscale", "peel", "headsplit", "rowscale", "tokensplit",
                              "rotate", "vrotate", "smooth", "gatedsplit"]
    assert REWRITES["tokensplit"].config() == REWRITES["tokensplit"].config(chunk=None,
                                                                           linears=False)
    assert dataclasses.asdict(REWRITES["rowscale"].config()) == {"growth": 2.0}
    assert dataclasses.asdict(REWRITES["outscale"].config()) == {"min_ratio": 8.0}
    assert dataclasses.asdict(REWRITES["peel"].config()) == {"factor": 4.0, "max_channels": 8}
    legacy_flags = {o.run_flag: o.run_field for rw in REWRITES.values()
                    for o in rw.cli_options if o.run_flag}
    assert legacy_flags == {"--tokensplit": "token_chunk", "--tokensplit-linears":
                            "token_linears", "--headsplit": "heads", "--rowscale": "rowscale",
                            "--outscale": "outscale", "--peel": "peel"}
    for rw in REWRITES.values():
        assert dataclasses.is_dataclass(rw.config) and rw.config.__dataclass_params__.frozen
        assert rw.switches() and rw.unverified.startswith("unverified on a device")
        assert rw.configure() == rw.config()  # an option not given keeps the default


def test_tokensplit_applies_where_the_size_rule_refuses_16_bit_at_that_length():
    model = load_proto(token_encoder())
    small = REWRITES["tokensplit"].applies(model, SMALL, SEQ, None)
    assert small.holds and "hailo.super_defuse refuses 16 bit" in small.reason
    real = REWRITES["tokensplit"].applies(model, load_target("hailo10h"), SEQ, None)
    assert not real.holds and "allows 16 bit on every token-wise layer" in real.reason
    cpu = REWRITES["tokensplit"].applies(model, load_target("ort_cpu"), SEQ, None)
    assert not cpu.holds and "no size rule" in cpu.reason
    unknown = REWRITES["tokensplit"].applies(model, SMALL, None, None)
    assert not unknown.holds and "--seq-len" in unknown.reason


def test_attention_rewrites_apply_where_there_are_softmax_chains():
    attention, ffn = load_proto(attention_encoder()), load_proto(outscale_block())
    for name in ("headsplit", "rowscale"):
        yes = REWRITES[name].applies(attention, None, HEAD_SEQ, None)
        no = REWRITES[name].applies(ffn, None, HEAD_SEQ, None)
        assert yes == Precondition(True, yes.reason) and "1 attention Softmax" in yes.reason
        assert not no.holds and "no Softmax" in no.reason
    # a classifier's Softmax over its logits is no attention chain (a face model's age
    # head read as "1 attention Softmax chain(s)" before)
    head = load_proto(_classifier())
    for name in ("headsplit", "rowscale"):
        got = REWRITES[name].applies(head, None, HEAD_SEQ, None)
        assert not got.holds and "1 Softmax(es) read no activation x activation" in got.reason


def _classifier() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.eye(4, 3, dtype=np.float32), "w")
    nodes = [onnx.helper.make_node("MatMul", ["x", "w"], ["z"]),
             onnx.helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    graph = onnx.helper.make_graph(
        nodes, "head", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3])], [w])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("name", "block"), [("outscale", outscale_block),
                                             ("peel", peel_block)])
def test_stats_rewrites_apply_where_the_stats_show_outlier_channels(name, block):
    rw = REWRITES[name]
    model, _, stats = _calibrated(block())
    yes = rw.applies(model, None, SEQ, stats)
    assert yes.holds and "Linear output(s) have a channel" in yes.reason
    flat, _, flat_stats = _calibrated(block(outlier=1.0))
    no = rw.applies(flat, None, SEQ, flat_stats)
    assert not no.holds and "no Linear output has a channel" in no.reason
    assert not rw.applies(model, None, SEQ, None).holds  # no stats: cannot tell


def _broken(model: Model, config, inp: RewriteInput) -> Repair:
    """Scales one weight: the FP32 function changes (what the runner must catch)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    w = proto.graph.initializer[1]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 3, w.name))
    return Repair(name="broken", reason="scaled a weight", proto=proto,
                  changes=(Change(w.name, "multiply"),))


@dataclasses.dataclass(frozen=True)
class NoConfig:
    pass


def _entry(name: str, transform) -> Rewrite:
    return Rewrite(name=name, config=NoConfig, summary=f"{name} (a test rewrite)",
                   unverified="unverified on a device: a test rewrite",
                   what=f"the {name} rewrite's model", metadata_key=f"test.{name}",
                   transform=transform,
                   applies=lambda m, t, s, st: Precondition(True, "always"))


def test_a_failed_fp32_check_returns_the_input_untouched_with_one_line():
    model = load_proto(token_encoder())
    before = model.proto.SerializeToString()
    r = run_rewrite(_entry("broken", _broken), model, seq_len=SEQ)
    assert r.failed and not r.applied and r.proto is model.proto and r.record is None
    assert model.proto.SerializeToString() == before
    assert len(r.notes) == 1 and "\n" not in r.notes[0]
    assert r.notes[0].startswith("broken: not applied: broken changed the FP32 outputs")
    with pytest.raises(RepairError, match="not function-preserving"):
        legacy(r)  # the stage functions and the run refuse it in one line, as before


def test_each_applied_rewrite_is_recorded_in_the_model_metadata():
    model = load_proto(attention_encoder())
    heads = run_rewrite(REWRITES["headsplit"], model, seq_len=HEAD_SEQ)
    assert heads.applied and heads.fp32_diff <= 1e-5 and not recorded(model.proto)
    split = run_rewrite(REWRITES["tokensplit"], load_proto(heads.proto),
                        REWRITES["tokensplit"].configure(chunk=4), seq_len=HEAD_SEQ)
    records = recorded(split.proto)
    assert [r["name"] for r in records] == ["headsplit", "tokensplit"]
    assert records[1]["config"] == {"chunk": 4, "linears": False, "full_width": False,
                                   "relay_values": False}
    assert records[1]["seq_len"] == HEAD_SEQ and records[1]["changes"] == len(split.changes)
    assert sum(p.key == RECORD_KEY for p in split.proto.metadata_props) == 1
    assert applied_rewrites(split.proto) == {"headsplit", "tokensplit"}
    # the plan's hint skips a rewrite the model carries already
    assert "quantscope headsplit" in hint_for("hailo.attention_16bit")
    assert hint_for("hailo.attention_16bit", applied_rewrites(split.proto)) is None


def test_outscale_lifts_the_skip_branch_and_its_residual_add():
    model, _, stats = _calibrated(outscale_block())
    r = run_rewrite(REWRITES["outscale"], model, stats=stats, seq_len=SEQ)
    assert r.lift == ("Add_7/outscale/in", "Add_7")


def _mirror(model: Model, config, inp: RewriteInput) -> Repair:
    """A function-preserving rewrite: the first output passes through an Identity."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    y = proto.graph.output[0].name
    for node in proto.graph.node:
        node.output[:] = [f"{y}/pre" if o == y else o for o in node.output]
    proto.graph.node.append(helper.make_node("Identity", [f"{y}/pre"], [y], name="mirror/id"))
    return Repair(name="mirror", reason="the output passes through an Identity", proto=proto,
                  changes=(Change(y, "insert"),))


def test_a_sixth_rewrite_runs_through_a_run_and_its_verdict_with_no_other_edit(
        tmp_path, monkeypatch, capsys):
    from quantscope.pipeline import RunOptions, run_pipeline
    from quantscope.pipeline.context import Context
    from quantscope.pipeline.verdict import format_verdict, format_verdict_details
    from quantscope.serde import read_json

    # the edits adding a rewrite takes: its module (here: _mirror and _entry) + one entry
    monkeypatch.setitem(REWRITES, "mirror", _entry("mirror", _mirror))
    onnx.save(attention_encoder(), tmp_path / "enc.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", input_ids=rng.integers(100, 1000, (16, HEAD_SEQ)),
             attention_mask=np.ones((16, HEAD_SEQ), np.int64))
    opts = RunOptions(model=str(tmp_path / "enc.onnx"), data=str(tmp_path / "x.npz"),
                      target="hailo10h", out=str(tmp_path / "W"), pairs=None,
                      rewrites=("mirror",))
    assert Context(opts, tmp_path / "W").model_digest().endswith("/mirror")
    out = run_pipeline(opts, progress=False)
    verdict = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert verdict["mirror"] == {"note": "the mirror rewrite's model (repaired.onnx is the "
                                 "rewritten model); unverified on a device: a test rewrite"}
    assert verdict["headsplit"] is None and verdict["tokensplit"] is None
    assert f"  mirror: {verdict['mirror']['note']}" in format_verdict_details(out.verdict)
    assert "rewrites: mirror" in format_verdict(out.verdict)  # the short form names it
    compiled = onnx.load(tmp_path / "W" / "repaired.onnx")
    assert "mirror/id" in {n.name for n in compiled.graph.node}
    assert [r["name"] for r in recorded(compiled)] == ["mirror"]
    with pytest.raises(Exception, match="unknown rewrite 'nope'"):
        dataclasses.replace(opts, rewrites=("nope",)).check()


def test_a_sixth_rewrite_is_a_command_with_no_cli_edit(tmp_path, monkeypatch, capsys):
    from quantscope.cli import main
    from quantscope.cli.commands import COMMANDS, markdown_table

    monkeypatch.setitem(REWRITES, "mirror", _entry("mirror", _mirror))
    assert COMMANDS["mirror"].group == "rewrites"
    assert "| rewrites | `mirror` | mirror (a test rewrite) |" in markdown_table()
    with pytest.raises(SystemExit) as exc:
        main(["mirror", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "Mirror (a test rewrite)." in text and "quantscope mirror MODEL --out" in text
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "mirror (a test rewrite)" in capsys.readouterr().out
    onnx.save(attention_encoder(), tmp_path / "enc.onnx")
    out = tmp_path / "m.onnx"
    assert main(["mirror", str(tmp_path / "enc.onnx"), "--seq-len", str(HEAD_SEQ), "--out",
                 str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "the output passes through an Identity"
    assert lines[1].startswith("FP32 outputs unchanged (max relative diff")
    assert lines[2].startswith(f"wrote {out} (") and "calibrate it again" not in lines[2]
    assert "mirror/id" in {n.name for n in onnx.load(out).graph.node}


def _help(argv, capsys) -> str:
    from quantscope.cli import main

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return "".join(capsys.readouterr().out.split())  # argparse wraps: compare unwrapped


def test_the_option_data_is_what_the_commands_and_run_flags_say(capsys):
    """Each entry's ``cli_options`` hold the flags and help texts the CLI shows today
    (enough to generate the rewrite commands' parsers and the run flags from them)."""
    run, face = _help(["run"], capsys), _help([], capsys)
    for name, rw in REWRITES.items():
        own = _help([name], capsys)
        assert "".join(rw.summary.split()) in face and "".join(rw.description.split()) in own
        for o in rw.cli_options:
            for flag in o.flags:
                assert flag in own and "".join(o.help.split()) in own
            if o.run_flag:
                assert o.run_flag in run and "".join(o.run_help.split()) in run


def test_rewrites_are_named_none_or_a_comma_list_in_run_order():
    from quantscope.rewrites.registry import parse_rewrites
    from quantscope.types import QuantscopeError

    assert parse_rewrites("none") == ()
    assert parse_rewrites("tokensplit,headsplit") == ("headsplit", "tokensplit")
    with pytest.raises(QuantscopeError, match="unknown rewrite 'heads'"):
        parse_rewrites("heads")
    r = REWRITES["headsplit"].apply(load_proto(attention_encoder()), seq_len=HEAD_SEQ)
    assert r.applied and r.record["name"] == "headsplit"
