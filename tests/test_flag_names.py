"""Tensor names that hold the flags' own separators: ``--batch-axis NAME=AXIS[,…]`` and
``--layout OUTPUT=KIND[:KEY=VALUE,…]`` split on ',' and '=', so an input named ``h,0=1`` or
an output named ``det=a,b`` could not be named at all ("is no NAME=AXIS", "unknown kind").
A name now runs to the last '=' before the axis (the last '=KIND' for a layout), or is
quoted. Real models, real files, real ORT sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from outside_models import feeds, mixed_scale_detector
from test_outside_batch_axis import _unshared_state

from quantscope.cli import main

H, C, DET = "h,0=1", "c=state", "det=a,b"


def _renamed(proto: onnx.ModelProto, names: dict[str, str]) -> onnx.ModelProto:
    """``proto`` with graph inputs/outputs (and every use of them) renamed."""
    for vi in [*proto.graph.input, *proto.graph.output]:
        vi.name = names.get(vi.name, vi.name)
    for node in proto.graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    return proto


def _lstm(tmp_path: Path) -> tuple[str, str]:
    """The LSTM whose state only ``--batch-axis`` can place, its state named ``H``, ``C``."""
    model, npz = tmp_path / "lstm.onnx", tmp_path / "lstm.npz"
    onnx.save(_renamed(_unshared_state(), {"h": H, "c": C}), model)
    data = feeds("lstm_state", 16)
    np.savez(npz, **{ {"h": H, "c": C}.get(k, k): v for k, v in data.items()})
    return str(model), str(npz)


def test_batch_axis_names_an_input_holding_comma_and_equals(tmp_path, capsys):
    model, npz = _lstm(tmp_path)
    out = str(tmp_path / "s.npz")
    for given in (f"{H}=1,{C}=1", f"'{H}'=1, \"{C}\"=1"):
        assert main(["calibrate", model, "--data", npz, "--batch-axis", given,
                     "--out", out]) == 0, capsys.readouterr().err
    capsys.readouterr()
    # a name that is no input: one line, which says how such names are written
    assert main(["calibrate", model, "--data", npz, "--batch-axis", "h=1,c=1",
                 "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is no input or output of the model" in err
    assert "quote it" in err


def test_layout_names_an_output_holding_equals_and_comma(tmp_path, capsys):
    model, npz = tmp_path / "d.onnx", tmp_path / "d.npz"
    onnx.save(_renamed(mixed_scale_detector(), {"detections": DET}), model)
    np.savez(npz, **feeds("mixed_scale_detector", 16))
    stats = str(tmp_path / "s.npz")
    assert main(["calibrate", str(model), "--data", str(npz), "--out", stats]) == 0
    capsys.readouterr()
    for given in (f"{DET}=detect:threshold=0.3", f"'{DET}'=detect:threshold=0.3"):
        assert main(["evaluate", str(model), "--data", str(npz), "--stats", stats,
                     "--precision", "a16_w16", "--layout", given]) == 0
        assert "detection_f1" in capsys.readouterr().out, given
    assert main(["evaluate", str(model), "--data", str(npz), "--stats", stats,
                 "--precision", "a16_w16", "--layout", "det=detect"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'det' is no output of the model" in err
    assert "quote it" in err


def test_check_mapping_names_an_output_holding_comma_and_equals(tmp_path, capsys):
    """``io --check-mapping TENSOR=CODE:VALUE,…`` split on the first '=': an output named
    ``sp,eed=1`` could not be named (and the quoted form was no mapping either)."""
    from test_device_io import _policy_model

    model, x, stats = tmp_path / "m.onnx", tmp_path / "x.npy", str(tmp_path / "s.npz")
    onnx.save(_renamed(_policy_model(), {"speed": "sp,eed=1"}), model)
    np.save(x, np.random.default_rng(1).uniform(-1, 1, (64, 19)).astype(np.float32))
    assert main(["calibrate", str(model), "--data", str(x), "--out", stats]) == 0
    capsys.readouterr()
    for given in ("sp,eed=1=0:-1,127:0,255:1", "\"sp,eed=1\"=0:-1,127:0,255:1",
                  "'sp,eed=1' = 0:-1,127:0,255:1"):
        assert main(["io", str(model), "--stats", stats, "--precision", "a8_w8",
                     "--check-mapping", given]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "output sp,eed=1: mapping 0:-1,127:0,255:1 -> max error" in out, given
    # no mapping at all: one line, which says how such names are written
    assert main(["io", str(model), "--stats", stats, "--precision", "a8_w8",
                 "--check-mapping", "sp=0:-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not TENSOR=CODE:VALUE" in err
    assert "quote it" in err


def test_an_option_value_may_name_an_output_called_like_a_kind():
    """``where=map:1>0.6`` (an output named ``map``) and ``scores_from=class`` were read as
    the layout's kind: the name ran to the last ``=KIND``, so 'boxes=points:where' was the
    output and '1>0.6' an unknown key. The name now runs to the first ``=KIND`` whose keys
    are all that kind's; a name holding '=KIND' followed by foreign keys still reads whole."""
    from quantscope.tasks.layout_spec import parse_layout

    spec = parse_layout("boxes=points:where=map:1>0.6,dims=2")
    assert (spec.output, spec.kind, spec.option("where")) == ("boxes", "points", "map:1>0.6")
    spec = parse_layout("det=detect:scores_from=class")
    assert (spec.output, spec.kind, spec.option("scores_from")) == ("det", "detect", "class")
    spec = parse_layout("out=map:1=detect")
    assert (spec.output, spec.kind) == ("out=map:1", "detect")
    spec = parse_layout(f"{DET}=detect:threshold=0.3")
    assert (spec.output, spec.kind) == (DET, "detect")
