"""An input the host looks up by that the compiled graph reads too (RoBERTa's position ids,
``Equal(input_ids, pad) -> CumSum``) is fed to the device as well: io.json's ``as_is_io``,
``io``'s lines and the verdict's host steps say so, naming the node that reads it."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.export.device_io import as_is_io, as_is_lines
from quantscope.model.host_gather import host_gathers
from quantscope.model.load import load_proto
from quantscope.report.summary import host_steps

V, H, P = 64, 8, 20


def _roberta_like(positions_from_ids: bool = True) -> onnx.ModelProto:
    """Word rows by input_ids; position ids from a CumSum over ``input_ids != pad`` (or,
    without ``positions_from_ids``, over the attention mask, as BERT-likes do)."""
    rng = np.random.default_rng(0)
    src = "input_ids" if positions_from_ids else "attention_mask"
    nodes = [
        helper.make_node("Gather", ["words", "input_ids"], ["rows"], name="words/Gather"),
        helper.make_node("Shape", ["input_ids"], ["shape"], name="Shape"),
        helper.make_node("Equal", [src, "pad"], ["is_pad"], name="pos/Equal"),
        helper.make_node("Not", ["is_pad"], ["keep"], name="pos/Not"),
        helper.make_node("Cast", ["keep"], ["keep_i"], to=TensorProto.INT64, name="pos/Cast"),
        helper.make_node("CumSum", ["keep_i", "one"], ["cum"], name="pos/CumSum"),
        helper.make_node("Mul", ["cum", "keep_i"], ["pos_ids"], name="pos/Mul"),
        helper.make_node("Gather", ["positions", "pos_ids"], ["pos_rows"], name="pos/Gather"),
        helper.make_node("Add", ["rows", "pos_rows"], ["y"], name="Add"),
    ]
    graph = helper.make_graph(
        nodes, "roberta_like",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "S"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "S", H])],
        [numpy_helper.from_array(rng.normal(0, 1, (V, H)).astype(np.float32), "words"),
         numpy_helper.from_array(rng.normal(0, 1, (P, H)).astype(np.float32), "positions"),
         numpy_helper.from_array(np.array(1, np.int64), "pad"),
         numpy_helper.from_array(np.array(1, np.int64), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _rows(model):
    (g,) = host_gathers(model, V)
    return g, [{"role": "input", "tensor": g.output, "host_lookup": g.to_dict()}]


def _ints(model):
    return [{"name": i.name, "dtype": i.type.tensor_type.elem_type, "dims": ["N", "S"]}
            for i in model.graph.input]


def test_ids_the_device_reads_too_are_fed_to_it():
    model = load_proto(_roberta_like())
    g, rows = _rows(model)
    assert g.indices == "input_ids" and g.device_reads == ("pos/Equal",)  # not Shape
    as_is = as_is_io(model, rows)
    assert {a["tensor"] for a in as_is} == {"input_ids", "attention_mask"}
    (ids,) = [a for a in as_is if a["tensor"] == "input_ids"]
    assert ids["reads"] == ["pos/Equal"]
    assert "the compiled graph reads it too ('pos/Equal')" in as_is_lines([ids])[0]
    steps = host_steps(_ints(model), [], text=True, seq_len=16, lookups=[g.to_dict()])
    assert any(s.startswith("feed ") and "input_ids" in s for s in steps)
    assert any("input_ids is fed to the device as well as looked up" in s
               and "'pos/Equal'" in s for s in steps)


def test_ids_only_the_host_reads_are_not_fed():
    model = load_proto(_roberta_like(positions_from_ids=False))
    g, rows = _rows(model)
    assert g.device_reads == () and "device_reads" not in g.to_dict()
    assert [a["tensor"] for a in as_is_io(model, rows)] == ["attention_mask"]
    steps = host_steps(_ints(model), [], text=True, seq_len=16, lookups=[g.to_dict()])
    assert not any("fed to the device as well" in s for s in steps)
    assert any(s.startswith("feed attention_mask") for s in steps)
