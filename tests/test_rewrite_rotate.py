"""The residual-stream rotation (QuaRot R1, optional R4) on the tiny decoder: FP32-identical
within 1e-4 per phase, the same weights in both phase graphs, its precondition both ways,
and R4's extra MatMul counted in the cost."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from decoder_tiny import TINY, phase_graphs, prefill_then_decode, run_graph
from test_repair_heads import _encoder as attention_encoder

from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.plan.cost import uniform_a8_cost
from quantscope.repair.rotate import rotation_matrix
from quantscope.rewrites.phases import rewrite_phases
from quantscope.rewrites.registry import REWRITES
from quantscope.targets import load_target
from quantscope.types import QuantscopeError

IDS = np.array([3, 7, 11, 5, 2, 9, 40, 17], np.int64)
ROTATE = REWRITES["rotate"]


_graphs, _run = phase_graphs, run_graph  # the shared tiny-decoder helpers


def _prefill_then_decode(graphs: dict[str, onnx.ModelProto]) -> list[np.ndarray]:
    """Logits of a 5-token prefill, then of 3 decode steps on its cache."""
    return prefill_then_decode(graphs, IDS)[0]


@pytest.mark.parametrize("online", [False, True])
def test_rotation_keeps_both_phases_fp32_identical_within_1e_4(online: bool) -> None:
    models = _graphs()
    results = rewrite_phases(ROTATE, models, ROTATE.configure(online=online), seq_len=8)
    assert set(results) == {"prefill", "decode"}
    for r in results.values():
        assert r.applied and r.fp32_diff <= 1e-4
        assert "hadamard, 32 wide" in r.reason  # the tiny decoder is 32 wide: Hadamard R1
    before = _prefill_then_decode({p: m.proto for p, m in models.items()})
    after = _prefill_then_decode({p: r.proto for p, r in results.items()})
    for b, a in zip(before, after, strict=True):  # per phase: the prefill, then each step
        assert np.abs(a - b).max() / np.abs(b).max() <= 1e-4
    # the weights really moved: the embedding rows are rotated, the RMSNorm gains are ones
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in results["decode"].proto.graph.initializer}
    old = {t.name: onnx.numpy_helper.to_array(t) for t in models["decode"].proto.graph.initializer}
    assert not np.allclose(inits["embed.weight"], old["embed.weight"], atol=1e-3)
    assert np.all(inits["layers.1.mlp_norm.weight"] == 1.0)
    if online:  # R4 on the 48-wide FFN: 12 x 4, a Hadamard matrix (Paley's H12 x H4)
        assert "R4 (hadamard) before 2 FFN down projection(s)" in results["prefill"].reason
        assert results["prefill"].lift == ("layers.0.down_proj/rotate_in",
                                           "layers.1.down_proj/rotate_in")


def test_both_phase_graphs_get_the_same_weights_and_a_mismatch_is_refused() -> None:
    results = rewrite_phases(ROTATE, _graphs(), seq_len=8)
    pre = {t.name: t for t in results["prefill"].proto.graph.initializer}
    shared = [t for t in results["decode"].proto.graph.initializer if t.name in pre]
    assert len(shared) > 20
    for t in shared:
        assert np.array_equal(onnx.numpy_helper.to_array(t), onnx.numpy_helper.to_array(pre[t.name]))
    mixed = {"prefill": _graphs()["prefill"], "decode": _graphs(seed=1)["decode"]}
    with pytest.raises(QuantscopeError, match="differs between the prefill and decode graphs"):
        rewrite_phases(ROTATE, mixed, seq_len=8)


def test_the_precondition_holds_on_an_rmsnorm_decoder_and_not_on_an_encoder() -> None:
    yes = ROTATE.applies(_graphs()["decode"], None, 8, None)
    assert yes.holds and "5 RMSNorms on a 32-wide residual stream, 11 Linears read it" in yes.reason
    no = ROTATE.applies(load_proto(attention_encoder()), None, 8, None)
    assert not no.holds and "no RMSNormalization" in no.reason
    with pytest.raises(QuantscopeError, match="rotate on the prefill graph: no RMSNormalization"):
        rewrite_phases(ROTATE, {"prefill": load_proto(attention_encoder())}, seq_len=8)


def test_the_rotation_matrix_is_hadamard_for_12_b_2_a_else_random_orthogonal() -> None:
    for n, kind in ((32, "hadamard"), (12, "hadamard"), (576, "hadamard"), (1536, "hadamard"),
                    (40, "random orthogonal"), (36, "random orthogonal")):
        r, what = rotation_matrix(n)
        assert what == kind
        np.testing.assert_allclose(r @ r.T, np.eye(n), atol=1e-10)
        if kind == "hadamard":  # every entry +-1/sqrt(n): an outlier spreads evenly
            assert np.allclose(np.abs(r), n ** -0.5)


def test_a_width_with_no_hadamard_matrix_rotates_with_a_random_orthogonal_r1() -> None:
    cfg = dataclasses.replace(TINY, hidden=40, heads=4, kv_heads=2)  # 40 = 8 x 5
    results = rewrite_phases(ROTATE, _graphs(cfg), seq_len=6)
    assert all("random orthogonal, 40 wide" in r.reason and r.fp32_diff <= 1e-4
               for r in results.values())


def test_r4_is_an_extra_weighted_layer_in_the_cost() -> None:
    model = _graphs()["prefill"]
    rotated = load_proto(rewrite_phases(ROTATE, {"prefill": model}, ROTATE.configure(online=True),
                                        seq_len=8)["prefill"].proto)
    groups = find_groups(rotated)
    assert "layers.0.down_proj/rotate_in" in groups.names()
    target, shapes = load_target("hailo10h"), {"input_ids": (1, 8)}
    before = uniform_a8_cost(find_groups(model), target, shapes, model=model)
    after = uniform_a8_cost(groups, target, shapes, model=rotated)
    # two 48 x 48 MatMuls over 8 positions, at a8_w8 (cost factor 1.0 per MAC)
    assert after - before == pytest.approx(2 * 48 * 48 * 8, rel=1e-6)


def test_the_rotate_command_rewrites_a_prefill_graph_file(tmp_path, capsys) -> None:
    from quantscope.cli import main

    src, out = tmp_path / "tiny.prefill.onnx", tmp_path / "rotated.onnx"
    onnx.save(_graphs()["prefill"].proto, str(src))
    assert main(["rotate", str(src), "--online", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "R1 (hadamard, 32 wide)" in said and "R4 (hadamard)" in said
    feeds = {"input_ids": IDS[None]}
    a, b = _run(onnx.load(str(src)), feeds)["logits"], _run(onnx.load(str(out)), feeds)["logits"]
    assert np.abs(a - b).max() / np.abs(a).max() <= 1e-4


def test_run_takes_rotate_online_only_when_given(tmp_path) -> None:
    from test_cli_rewrites import _options, _run_args

    argv = _run_args(tmp_path)
    plain = _options(argv)  # a flag option left out is no option (a run without rotate)
    assert plain.rewrites == () and plain.rewrite_options == ()
    online = _options([*argv, "--rewrites", "rotate", "--rotate-online"])
    assert online.rewrites == ("rotate",) and online.rewrite_options == (("rotate", "online", True),)
    assert [c for _, c in online.rewrite_configs()] == [ROTATE.configure(online=True)]
