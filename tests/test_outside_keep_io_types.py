"""A float16 model with float32 inputs and outputs: a ``Cast`` to float16 after each input
and one to float32 before each output, as ``onnxconverter_common``'s
``convert_float_to_float16(keep_io_types=True)`` writes (issue: models as real toolchains
export them).

Once the float16 model is widened to float32 each of those Casts is float32 -> float32,
and each was a decision group of its own: ``run --target hailo8`` wrote ``a16_w16 NOT SET:
no Hailo layer name known for its Cast layer`` into ``model.alls`` for both and charged
their cost; the output's clipping warning then went silent once the output Cast shared
its input's encoding; and ``run`` never said (console, ``verdict.json``) that the model
computes in float16 and its FP32 reference is the float32 form.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest

from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto


def keep_io_types(seed: int = 3) -> onnx.ModelProto:
    """``x [N, 16]`` float32 -> Cast(float16) -> MatMul -> Add -> Relu -> MatMul ->
    Cast(float32) -> ``y [N, 4]``; weights in float16."""
    r = np.random.default_rng(seed)
    proto = onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 17]>
    mixed (float[N, 16] x) => (float[N, 4] y) {
        xh = Cast <to = 10> (x)
        h = MatMul (xh, w1)
        hb = Add (h, b1)
        a = Relu (hb)
        yh = MatMul (a, w2)
        y = Cast <to = 1> (yh)
    }
    """)
    for i, n in enumerate(proto.graph.node):
        n.name = f"node{i}_{n.op_type}"
    weights = {"w1": r.normal(0, 0.4, (16, 32)), "b1": r.normal(0, 0.1, 32),
               "w2": r.normal(0, 0.3, (32, 4))}
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(v.astype(np.float16), k)
                                   for k, v in weights.items())
    return proto


def test_the_io_casts_are_no_groups_of_their_own():
    model = load_proto(keep_io_types(), "mixed")
    groups = find_groups(model)
    assert not [g for g in groups.groups if g.op_type == "Cast"]
    assert {"xh", "y"} <= {t for chain in groups.shared for t in chain[1:]}


def test_an_output_a_noop_cast_writes_is_warned_as_clipped():
    """The output row names the tensor whose encoding it has; the clipping of that tensor
    is the output's."""
    from quantscope.export.device_io import device_io
    from quantscope.model.groups import find_groups as groups_of
    from quantscope.pipeline.verdict import _saturated_outputs
    from quantscope.types import Encoding, Encodings

    model = load_proto(keep_io_types(), "mixed")
    groups = groups_of(model)
    enc = Encoding(scale=np.array(0.01, np.float32), zero_point=np.array(128), bits=8, signed=False)
    rows = device_io(model, groups, Encodings(activations={"x": enc, "yh": enc}, weights={}))
    (out,) = [r for r in rows if r["role"] == "output"]
    assert out["tensor"] == "y" and out["encoded_as"] == "yh"
    sat = {"tensor": "yh", "below": 0.01, "above": 0.0, "range_min": -1.0, "range_max": 1.0,
           "data_min": -1.5, "data_max": 1.0}
    (line,) = _saturated_outputs({"saturation": {"tensors": [sat]}}, [out])
    assert line.startswith("output 'y' clips 1.00% of its held-out values")


@pytest.mark.parametrize("target", ["hailo8"])
def test_run_says_the_float16_form_and_sets_every_decision(tmp_path, capsys, target):
    path = tmp_path / "mixed.onnx"
    onnx.save(keep_io_types(), path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    np.savez(tmp_path / "x.npz",
             x=np.random.default_rng(0).normal(0, 1, (24, 16)).astype(np.float32))
    out = tmp_path / "w"
    assert main(["run", str(path), "--data", str(tmp_path / "x.npz"), "--target", target,
                 "--budget", "none", "--out", str(out)]) == 0
    console = capsys.readouterr().out
    assert "  note: the model computes in float16: emulated as its float32 form" in console
    verdict = json.loads((out / "verdict.json").read_text())
    assert any("computes in float16" in n for n in verdict["model_notes"])
    assert not [w for w in verdict["export_warnings"] if "NOT SET" in w]
    assert "NOT SET" not in (out / "model.alls").read_text()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def _float32_net() -> onnx.ModelProto:
    """:func:`keep_io_types` before any float16: float32 weights, no Casts."""
    proto = keep_io_types()
    keep = [n for n in proto.graph.node if n.op_type != "Cast"]
    for n in keep:
        n.input[:] = ["x" if i == "xh" else i for i in n.input]
        n.output[:] = ["y" if o == "yh" else o for o in n.output]
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    for t in proto.graph.initializer:
        t.CopyFrom(onnx.numpy_helper.from_array(
            onnx.numpy_helper.to_array(t).astype(np.float32), t.name))
    return proto


def test_the_converters_unsorted_graph_is_put_in_order(tmp_path, capsys):
    """The converter itself (``onnxruntime.transformers.float16``, onnxconverter-common's
    copy) appends the input Cast at the end of the node list: ONNX Runtime runs that
    graph, and quantscope refused it ("fails the ONNX checker (Nodes in a graph must be
    topologically sorted ...): fix or re-export it")."""
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    half = convert_float_to_float16(_float32_net(), keep_io_types=True)
    assert half.graph.node[-1].op_type == "Cast" or half.graph.node[-2].op_type == "Cast"
    path = tmp_path / "kio.onnx"
    onnx.save(half, path)
    x = np.random.default_rng(0).normal(0, 1, (24, 16)).astype(np.float32)
    ort.InferenceSession(str(path)).run(None, {"x": x})  # the runtime runs it as it is
    np.savez(tmp_path / "x.npz", x=x)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    s = str(tmp_path / "s.npz")
    assert main(["calibrate", str(path), "--data", str(tmp_path / "x.npz"), "--out", s]) == 0
    assert main(["evaluate", str(path), "--data", str(tmp_path / "x.npz"), "--stats", s,
                 "--precision", "a8_w8"]) == 0
    out = capsys.readouterr().out
    assert "note: the graph's nodes were not in topological order" in out
    assert "1 node(s) moved before the nodes that read them" in out
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    model = load_proto(half, "kio")
    assert not [g for g in find_groups(model).groups if g.op_type == "Cast"]
