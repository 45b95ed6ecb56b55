"""A tiny decoder (2 layers, GQA 4/2, RMSNorm, KV cache): prefill and decode graphs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from decoder_tiny import TINY, tiny_weights

from quantscope.emulate.session import make_session
from quantscope.model.groups import find_groups
from quantscope.model.load import load, load_proto
from quantscope.model.phases import parse_phases, phase_of, phase_path
from quantscope.plan.phases import check_phases
from quantscope.targets import load_target
from quantscope.types import Plan, Precision, QuantscopeError
from quantscope.zoo.decoder import build_decoder, numpy_forward

IDS = np.array([3, 7, 11, 5, 2, 9, 40, 17], np.int64)


@pytest.fixture(scope="module")
def graphs() -> dict[str, onnx.ModelProto]:
    w = tiny_weights()
    return {p: build_decoder(TINY, w, p) for p in ("prefill", "decode")}


def _run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = make_session(proto)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds), strict=True))


def test_prefill_matches_full_sequence_numpy(graphs: dict[str, onnx.ModelProto]) -> None:
    ref = numpy_forward(TINY, tiny_weights(), IDS)
    out = _run(graphs["prefill"], {"input_ids": IDS[None]})
    np.testing.assert_allclose(out["logits"][0], ref, atol=1e-4)
    assert out["present.1.key"].shape == (1, TINY.kv_heads, len(IDS), TINY.head_dim)


def test_decode_steps_match_full_sequence(graphs: dict[str, onnx.ModelProto]) -> None:
    """Prefill 5 tokens, then decode the other 3 one at a time against the cache."""
    full = _run(graphs["prefill"], {"input_ids": IDS[None]})["logits"][0]
    out = _run(graphs["prefill"], {"input_ids": IDS[None, :5]})
    np.testing.assert_allclose(out["logits"][0], full[:5], atol=1e-5)
    for t in range(5, len(IDS)):
        past = {k.replace("present.", "past."): v for k, v in out.items() if k != "logits"}
        out = _run(graphs["decode"], {"input_ids": IDS[None, t:t + 1], **past})
        np.testing.assert_allclose(out["logits"][0, 0], full[t], atol=1e-5)
        assert out["present.0.value"].shape[2] == t + 1
    # the cache after the last step is the full run's cache
    whole = _run(graphs["prefill"], {"input_ids": IDS[None]})
    np.testing.assert_allclose(out["present.1.key"], whole["present.1.key"], atol=1e-5)


def test_same_layer_names_in_both_graphs(graphs: dict[str, onnx.ModelProto]) -> None:
    names = {p: [n.name for n in g.graph.node if not n.name.startswith("pos.")]
             for p, g in graphs.items()}
    assert names["prefill"] == names["decode"]
    groups = {p: find_groups(load_proto(g, source=p)).names() for p, g in graphs.items()}
    assert groups["prefill"] == groups["decode"]
    assert "layers.1.attn.k_cache" in groups["prefill"]


def test_plan_checked_on_both_phases(graphs: dict[str, onnx.ModelProto], tmp_path) -> None:
    """A 16-bit residual Add is too wide for a long prompt but not for one token."""
    for p, g in graphs.items():
        onnx.save(g, str(tmp_path / f"tiny.{p}.onnx"))
    models = {p: load(phase_path(tmp_path / "tiny.prefill.onnx", p)) for p in parse_phases(
        "prefill,decode")}
    assert {p: phase_of(m) for p, m in models.items()} == {"prefill": "prefill", "decode": "decode"}
    plan = Plan(default=Precision.A8_W8, target="hailo10h",
                overrides=(("layers.0.attn_residual", Precision.A16_W16),))
    result = {r.phase: r for r in check_phases(plan, models, load_target("hailo10h"), 4096)}
    rules = {ph: [p.rule for p in r.problems if not p.rule.startswith("ops.")]
             for ph, r in result.items()}
    assert rules == {"prefill": ["hailo.super_defuse"], "decode": []}
    # the operators hailo10h's list does not name: warnings on both phases, never errors
    assert all(p.severity == "warning" for r in result.values() for p in r.problems
               if p.rule.startswith("ops."))
    assert result["decode"].errors == 0
    assert result["prefill"].cost > 1.0 and result["decode"].cost > 1.0
    short = check_phases(plan, models, load_target("hailo10h"), 64)
    assert all(r.errors == 0 for r in short)


def test_phase_inputs_checked(tmp_path) -> None:
    with pytest.raises(QuantscopeError, match="unknown phase"):
        parse_phases("prefill,tbt")
    with pytest.raises(QuantscopeError, match="no decode graph"):
        (tmp_path / "m.prefill.onnx").write_bytes(b"")
        phase_path(tmp_path / "m.prefill.onnx", "decode")


def test_cli_check_on_both_phases(graphs: dict[str, onnx.ModelProto], tmp_path, capsys) -> None:
    from quantscope.cli import main
    from quantscope.serde import write_plan

    for p, g in graphs.items():
        onnx.save(g, str(tmp_path / f"tiny.{p}.onnx"))
    plan = tmp_path / "plan.json"
    write_plan(plan, Plan(default=Precision.A8_W8, target="hailo10h",
                          overrides=(("layers.0.attn_residual", Precision.A16_W16),)))
    argv = ["check", str(plan), "--model", str(tmp_path / "tiny.decode.onnx"),
            "--target", "hailo10h", "--phase", "prefill,decode"]
    assert main([*argv, "--seq-len", "4096"]) == 1
    out = capsys.readouterr().out
    assert "prefill (seq-len 4096): cost" in out and "decode (seq-len 4096): cost" in out
    assert "1 error(s)" in out and "[hailo.super_defuse] layers.0.attn_residual" in out
    assert main([*argv, "--seq-len", "64"]) == 0
    assert main([*argv[:-1], "prefill,tbt"]) == 2
    assert "unknown phase" in capsys.readouterr().err


def test_one_alls_for_both_phases(graphs: dict[str, onnx.ModelProto]) -> None:
    """Same layer names: the plan's Hailo model script is the same for both subnetworks."""
    from quantscope.export.hailo_alls import export_alls

    plan = Plan(default=Precision.A8_W8, target="hailo10h",
                overrides=(("layers.0.mlp_residual", Precision.A16_W16),
                           ("layers.1.down_proj", Precision.A16_W16)))
    scripts = {p: export_alls(plan, find_groups(load_proto(g, source=p)))
               for p, g in graphs.items()}
    assert scripts["prefill"] == scripts["decode"]
    assert scripts["prefill"].count("precision_mode=a16_w16") == 2
