"""SmoothQuant on a decoder's RMSNorms, both phase graphs with one set of scales, written as
a decoder's files that the phase commands open."""

from __future__ import annotations

import numpy as np
import onnx
from decoder_tiny import byte_decoder

from quantscope import stages_llm
from quantscope.model.load import load, load_proto

SETUP = stages_llm.LmSetup(seq_len=16, calibration=4, evaluation=2, steps=2)


def test_smoothquant_moves_rmsnorm_outliers_into_both_phase_graphs(tmp_path) -> None:
    prefill = byte_decoder(tmp_path)
    out = tmp_path / "smooth.prefill.onnx"
    results = stages_llm.smooth_phase_files(prefill, out, setup=SETUP)
    assert set(results) == {"prefill", "decode"}
    for note in results.values():  # 2 layers x 2 norms + the final norm, FP32 kept
        assert "outliers of 5 tensor(s) moved into the weights" in note
        assert "'sites': 5.0" in note
    files = {p: load(tmp_path / f"smooth.{p}.onnx") for p in ("prefill", "decode")}
    before = {t.name: onnx.numpy_helper.to_array(t) for t in load(prefill).graph.initializer}
    after = {p: {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
             for p, m in files.items()}
    gain = "layers.0.attn_norm.weight"
    assert not np.allclose(after["prefill"][gain], before[gain])  # gain / s
    for name, value in after["prefill"].items():  # one set of scales: the same weights
        if name in after["decode"]:
            np.testing.assert_array_equal(value, after["decode"][name])
    assert (tmp_path / "smooth.tokenizer.json").read_text() == \
        (tmp_path / "byte.tokenizer.json").read_text()
    assert stages_llm.open_phase(out, "decode").source.endswith("smooth.decode.onnx")


def test_phase_files_whose_weights_differ_are_refused_and_none_is_left(tmp_path) -> None:
    import pytest

    from quantscope.types import QuantscopeError

    prefill = byte_decoder(tmp_path)

    def make(phase: str) -> tuple[onnx.ModelProto, str]:
        proto = onnx.load(str(tmp_path / f"byte.{phase}.onnx"))
        if phase == "decode":  # a transform that is not the same on both graphs
            emb = next(t for t in proto.graph.initializer if t.name == "embed.weight")
            emb.CopyFrom(onnx.numpy_helper.from_array(
                onnx.numpy_helper.to_array(emb) * 2, "embed.weight"))
        return proto, phase

    with pytest.raises(QuantscopeError, match="weight 'embed.weight' differs between the "
                                              "prefill and decode graphs"):
        stages_llm.write_phase_files(prefill, "test", make, tmp_path / "bad.prefill.onnx")
    assert not list(tmp_path.glob("bad.*"))


def _outlier_decoder(folder) -> tuple:
    """The byte decoder with up-projection channels 3 and 7 of every layer 40x the rest:
    the MLP's gated product ``silu(gate) * up`` has two huge channels, as a real LLM's
    down-projection input does (the diagnosis in docs/benchmarks.md, issue 33)."""
    import dataclasses

    from decoder_tiny import TINY, tiny_weights

    cfg = dataclasses.replace(TINY, vocab=256)
    w = tiny_weights(cfg)
    for i in range(cfg.layers):
        w[f"layers.{i}.up_proj.weight"][[3, 7]] *= 40.0
    return byte_decoder(folder, weights=w), cfg


def _logits_error(reference: onnx.ModelProto, model: onnx.ModelProto, feeds) -> float:
    """Relative MSE of the 8-bit-gated emulation's logits (every other group at 16 bit)."""
    from quantscope.repair.verify import calibrate_and_quantize
    from quantscope.tasks.lm_phases import runner
    from quantscope.types import Plan, Precision

    gated = tuple((f"layers.{i}.mlp.gated", Precision.A8_W8) for i in range(2))
    qdq = calibrate_and_quantize(model, feeds, Plan(default=Precision.A16_W16, overrides=gated))
    ref, emu = runner(reference), runner(qdq)
    noise = power = 0.0
    for f in feeds:
        r, t = ref(f)["logits"].astype(np.float64), emu(f)["logits"]
        noise, power = noise + float(((t - r) ** 2).sum()), power + float((r * r).sum())
    return noise / power


def test_gated_smoothing_flattens_the_mlp_product_and_keeps_fp32(tmp_path) -> None:
    from quantscope.tasks.lm_phases import runner

    prefill, _ = _outlier_decoder(tmp_path)
    out = tmp_path / "gated.prefill.onnx"
    results = stages_llm.smooth_phase_files(prefill, out, setup=SETUP, sites="gated")
    for note in results.values():  # the 2 layers' gated products, nothing else
        assert "outliers of 2 tensor(s) moved into the weights" in note
    before = {t.name: onnx.numpy_helper.to_array(t) for t in load(prefill).graph.initializer}
    after = {t.name: onnx.numpy_helper.to_array(t) for t in load(out).graph.initializer}
    changed = {n for n in before if not np.array_equal(before[n], after[n])}
    assert changed == {f"layers.{i}.{p}_proj.weight.T" for i in range(2) for p in ("up", "down")}
    up = after["layers.0.up_proj.weight.T"] / before["layers.0.up_proj.weight.T"]  # [in, out]
    down = after["layers.0.down_proj.weight.T"] / before["layers.0.down_proj.weight.T"]
    np.testing.assert_allclose(up[0] * down[:, 0], 1.0, rtol=1e-5)  # 1/s_j then s_j
    assert up[0, 3] < 0.5 * np.median(up[0])  # the outlier channels divided the most
    rng = np.random.default_rng(1)
    feeds = [{"input_ids": rng.integers(0, 256, (1, 16))} for _ in range(4)]
    ref, new = runner(load(prefill).proto), runner(load(out).proto)
    for f in feeds:  # FP32 unchanged
        np.testing.assert_allclose(new(f)["logits"], ref(f)["logits"], rtol=1e-4, atol=1e-4)
    base = load(prefill).proto
    assert _logits_error(base, load(out).proto, feeds) < 0.5 * _logits_error(base, base, feeds)


def test_smooth_sites_are_checked_in_one_line(tmp_path) -> None:
    import pytest

    from quantscope.types import QuantscopeError

    with pytest.raises(QuantscopeError, match="smooth sites must be one of norms, gated, all"):
        stages_llm.smooth_phase_files(byte_decoder(tmp_path), tmp_path / "x.prefill.onnx",
                                      setup=SETUP, sites="mlp")
    assert not list(tmp_path.glob("x.*"))


def test_a_gated_product_is_a_site_only_when_asked(tmp_path) -> None:
    from quantscope.repair.smooth import find_sites

    model = load(byte_decoder(tmp_path))
    sites, skipped = find_sites(model)
    assert dict(skipped)["layers.0.mlp.gated"].startswith("produced by Mul")
    assert {s.tensor for s in sites} == {"layers.0.attn_norm", "layers.0.mlp_norm",
                                         "layers.1.attn_norm", "layers.1.mlp_norm", "norm"}
    sites, _ = find_sites(model, gated=True, producers=("Mul",))
    assert [(s.tensor, s.divide, s.multiply) for s in sites] == [
        (f"layers.{i}.mlp.gated", ((f"layers.{i}.up_proj.weight.T", 1),),
         ((f"layers.{i}.down_proj.weight.T", 0),)) for i in range(2)]
    # the up projection's output read by another node too: 1/s would change that reader
    proto = model.proto
    proto.graph.node.append(onnx.helper.make_node("Identity", ["layers.0.up_proj"], ["extra"],
                                                  name="extra"))
    proto.graph.output.append(onnx.helper.make_tensor_value_info("extra", 1, [1, "s", 48]))
    _, skipped = find_sites(load_proto(proto), gated=True)
    assert "not a gated product" in dict(skipped)["layers.0.mlp.gated"]
