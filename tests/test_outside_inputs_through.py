"""Model inputs read through a pass-through op first (issue: models beyond the zoo).

A TensorFlow export feeds ``image [N, H, W, C]`` to a Transpose before the first Conv; a GRU
export feeds ``x [B, T, F]`` to a Transpose before the GRU. The device receives that input
on the 8-bit grid, so the emulation must quantize it (its Q/DQ before the Transpose), the
coverage must count it, and the device I/O must tell the host how to feed it. It was left
float, silently, and io.json had no row for it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from vision_models import nhwc_classifier

from quantscope.analyze.candidates import candidates, encodings_table, mixed_encodings
from quantscope.calibrate.collect import calibrate
from quantscope.cli import main
from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import quantize_model
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Plan, Precision, QuantScheme


def _feeds(n: int = 16) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(0).random((n, 8, 8, 3), np.float32) * 10}


def _prepared():
    model = load_proto(nhwc_classifier(), "nhwc")
    groups = find_groups(model)
    return model, groups, calibrate(model, groups, [_feeds()])


def test_input_read_through_a_transpose_is_quantized():
    model, groups, stats = _prepared()
    assert groups.model_inputs == ("image",)
    q = quantize_model(model, stats, Plan.uniform(Precision.A8_W8), scheme=QuantScheme())
    assert "image" in q.encodings.activations
    first = next(n for n in q.proto.graph.node if "image" in n.input)
    assert first.op_type == "QuantizeLinear"  # the Transpose reads the grid, not the float
    # a 16-bit reader takes the input at 16 bit, as when the Conv reads it directly
    conv = next(g for g in groups.groups if g.op_type == "Conv")
    plan = Plan(default=Precision.A8_W8, overrides=((conv.name, Precision.A16_W8),))
    assert encode(model, groups, stats, plan, scheme=QuantScheme()).activations["image"].bits == 16


def test_analysis_encodings_agree_on_the_input():
    model, groups, stats = _prepared()
    table = encodings_table(model, groups, stats, (Precision.A8_W8, Precision.A16_W16))
    for c in candidates(groups, Precision.A8_W8, Precision.A16_W16):
        mine = mixed_encodings(table, groups, c.plan)
        ref = encode(model, groups, stats, c.plan, scheme=QuantScheme())
        assert set(mine.activations) == set(ref.activations)
        if "image" in ref.activations:
            assert mine.activations["image"].bits == ref.activations["image"].bits


@pytest.mark.parametrize("command", ["io", "evaluate"])
def test_cli_names_the_input(tmp_path, capsys, command):
    onnx.save(nhwc_classifier(), tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", **_feeds())
    m, x, s = (str(tmp_path / f) for f in ("m.onnx", "x.npz", "s.npz"))
    assert main(["calibrate", m, "--data", x, "--out", s]) == 0
    capsys.readouterr()
    args = ["--stats", s, "--precision", "a8_w8"]
    if command == "io":
        assert main(["io", m, *args]) == 0
        assert "input  image: stored as uint8" in capsys.readouterr().out
    else:
        assert main(["evaluate", m, "--data", x, *args]) == 0
        assert "coverage: 2 weight(s) and 4 activation tensor(s) quantized" in (
            capsys.readouterr().out)


def test_qnn_encodings_carry_the_input():
    """The QNN export looked the input's encoding up and stopped the run at its export
    stage: "no activation encoding for 'image'"."""
    import json

    from quantscope.export.qnn_encodings import export_qnn_encodings

    model, groups, stats = _prepared()
    plan = Plan.uniform(Precision.A8_W8)
    enc = encode(model, groups, stats, plan, scheme=QuantScheme())
    assert '"image"' in json.dumps(export_qnn_encodings(plan, groups, enc))
