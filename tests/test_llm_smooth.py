"""SmoothQuant on a decoder's RMSNorms, both phase graphs with one set of scales, written as
a decoder's files that the phase commands open."""

from __future__ import annotations

import numpy as np
import onnx
from decoder_tiny import byte_decoder

from quantscope import stages_llm
from quantscope.model.load import load

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
