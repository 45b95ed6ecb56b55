"""Per-phase diagnosis on the tiny decoder with a massive first-token activation injected."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_tiny import TINY, tiny_weights

from quantscope.analyze.phases import diagnose_phase, format_diagnosis, residual_groups
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.tasks.lm import TokenWindows
from quantscope.tasks.lm_phases import calibrate_phases, position_absmax
from quantscope.zoo.decoder import build_decoder

SINK, CHANNEL, MASSIVE = 7, 5, 400.0  # token 7's embedding carries 400 in channel 5


def _diagnose(weights: dict[str, np.ndarray]) -> dict:
    models = {p: load_proto(build_decoder(TINY, weights, p), source=f"tiny.{p}")
              for p in ("prefill", "decode")}
    rng = np.random.default_rng(3)
    ids = [rng.integers(8, TINY.vocab, 16) for _ in range(6)]
    for w in ids:
        w[0] = SINK  # every window starts with the sink token, none has it elsewhere
    windows = TokenWindows(tuple(ids), (ids[0],), "random")
    stats = calibrate_phases(models.__getitem__, windows, steps=4)
    out = {}
    for phase, m in models.items():
        groups = find_groups(m)
        positions = None
        if phase == "prefill":
            positions = position_absmax(m, [g.outputs[0] for g in residual_groups(groups)],
                                        windows.calibration)
        out[phase] = diagnose_phase(phase, groups, stats[phase], m.output_names(), positions)
    return out


@pytest.fixture(scope="module")
def injected() -> dict:
    w = tiny_weights()
    w["embed.weight"] = w["embed.weight"].copy()
    w["embed.weight"][SINK, CHANNEL] = MASSIVE
    return _diagnose(w)


def test_residual_stream_is_the_normalised_adds() -> None:
    groups = find_groups(load_proto(build_decoder(TINY, tiny_weights(), "prefill"), source="t"))
    names = sorted(g.name for g in residual_groups(groups))
    assert names == [f"layers.{i}.{k}_residual" for i in range(2) for k in ("attn", "mlp")]


def test_massive_first_token_activation_found_in_prefill(injected) -> None:
    pre = injected["prefill"]
    assert len(pre.first_token) == 4  # the four residual Adds
    assert all(f.peak_position == 0 and f.first > 50 * f.others for f in pre.first_token)
    widest = pre.widest[0]
    assert widest.hi - widest.lo > MASSIVE / 2 and widest.outlier_ratio > 50
    broken = {r.group for r in pre.predicted_8bit}
    assert {g for g in broken if g.endswith("_residual")} == {
        f"layers.{i}.{k}_residual" for i in range(2) for k in ("attn", "mlp")}
    assert all(r.step8 > r.typical for r in pre.predicted_8bit)
    assert len(pre.kv_cache) == 2 * TINY.layers and len(pre.norm_inputs) == 2 * TINY.layers + 1
    assert max(r.hi - r.lo for r in pre.norm_inputs) > MASSIVE / 2  # RMSNorm reads the sink


def test_decode_does_not_carry_it(injected) -> None:
    """One decode token without the sink: its residual stream stays narrow and 8 bit."""
    dec = injected["decode"]
    assert dec.first_token == ()
    assert not any(r.group.endswith("_residual") for r in dec.predicted_8bit)
    assert max(r.hi - r.lo for r in dec.norm_inputs) < 50
    assert len(dec.kv_cache) == 2 * TINY.layers
    text = "\n".join(format_diagnosis((injected["prefill"], dec)))
    assert "4 of 4 residual tensors peak at position 0" in text
    assert "a prediction" in text and text.index("prefill:") < text.index("decode:")


def test_without_the_sink_the_residual_stream_is_predicted_fine() -> None:
    pre = _diagnose(tiny_weights())["prefill"]
    assert not any(r.group.endswith("_residual") for r in pre.predicted_8bit)
    assert max(r.outlier_ratio for r in pre.widest) < 10


def test_cli_analyze_phases(tmp_path, capsys) -> None:
    import json

    from decoder_tiny import byte_decoder

    from quantscope.cli import main

    model = byte_decoder(tmp_path)
    out = tmp_path / "diag.json"
    assert main(["analyze", str(model), "--phase", "prefill,decode", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "first token:" in text and "KV cache: 4 tensors" in text
    diag = json.loads(out.read_text())
    assert list(diag["phases"]) == ["prefill", "decode"] and "prediction" in diag["note"]
    assert diag["phases"]["decode"]["first_token"] == []
    assert all({"breaks8", "outlier_ratio", "step8"} <= set(r)
               for r in diag["phases"]["prefill"]["widest"])
    assert main(["analyze", str(model), "--out", str(tmp_path / "a.json")]) == 2
    assert "required: --data, --stats" in capsys.readouterr().err
    assert main(["analyze", str(model), "--phase", "prefill", "--stats", str(out),
                 "--out", str(tmp_path / "a.json")]) == 2
    assert "leave out --data and --stats" in capsys.readouterr().err
