"""A lookup's range is its table's (h47): a Gather of a constant table by integer ids
bounds every row it can return by the table's own min..max. Calibrated from the rows the
data happened to pick (h45's transducer decoder: ``y [N, 2]`` ids into a 500-row table),
held-out ids picked rows no fit sample did and their values clipped silently at 8 and 16
bit alike; now the range is the table's, recorded in the stats (every stage reads it)
and said."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope import stages
from quantscope.model.load import load_proto
from quantscope.serde import read_stats, write_stats
from quantscope.types import Dataset, Plan, Precision

ROWS, WIDTH = 500, 8


def lookup_model(*, through: str | None = None) -> onnx.ModelProto:
    """``y [N, 2]`` int64 ids -> a Gather of a ``[500, 8]`` table -> ``out [N, 2, 8]`` (a
    MatMul after it, so the lookup is a group of its own inside the graph). Rows past
    100 are wider than the first 100 (a few rows reach 4x their spread)."""
    rng = np.random.default_rng(0)
    table = rng.normal(0, 1, (ROWS, WIDTH)).astype(np.float32)
    table[100:] *= 1.5
    table[[250, 400]] *= 4
    ids = "y"
    nodes = []
    if through == "Cast":
        nodes.append(helper.make_node("Cast", ["y"], ["y32"], to=TensorProto.INT32))
        ids = "y32"
    nodes += [helper.make_node("Gather", ["table", ids], ["emb"], name="embed"),
              helper.make_node("MatMul", ["emb", "w"], ["out"], name="proj")]
    inits = [numpy_helper.from_array(table, "table"),
             numpy_helper.from_array(rng.normal(0, 0.5, (WIDTH, 4)).astype(np.float32), "w")]
    g = helper.make_graph(nodes, "lookup",
                          [helper.make_tensor_value_info("y", TensorProto.INT64, ["N", 2])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 2, 4])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _ids(lo: int, hi: int, seed: int) -> tuple[dict[str, np.ndarray], ...]:
    y = np.random.default_rng(seed).integers(lo, hi, (32, 2)).astype(np.int64)
    return tuple({"y": y[i:i + 8]} for i in range(0, 32, 8))


def _run(model_proto: onnx.ModelProto) -> tuple:
    model = load_proto(model_proto, "lookup")
    data = Dataset(name="ids", calibration=_ids(0, 100, 1), evaluation=_ids(100, ROWS, 2))
    stats = stages.calibrate_model(model, data)
    res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A16_W16))
    return model, stats, res


def test_held_out_ids_do_not_clip_at_the_lookup():
    _, stats, res = _run(lookup_model())
    table = numpy_helper.to_array(lookup_model().graph.initializer[0])
    emb = stats.tensors["emb"]
    assert (emb.min, emb.max) == (float(table.min()), float(table.max()))
    clipped = {c["tensor"] for c in res["saturation"]["tensors"]}
    assert "emb" not in clipped  # before: emb clipped a share of its held-out values


def test_the_table_range_is_said_and_kept_in_the_stats_file(tmp_path):
    _, stats, res = _run(lookup_model())
    look = stats.tensors["emb"].lookup
    assert look is not None and look.table == "table" and look.rows == ROWS
    assert 0 < look.picked <= 100  # the fit ids pick rows 0..99 only
    note = next(n for n in res["notes"] if "taken from its table" in n)
    assert "'emb'" in note and "'table' (500 rows)" in note
    assert f"picked {look.picked} of 500 rows" in note
    write_stats(tmp_path / "s.npz", stats)
    again = read_stats(tmp_path / "s.npz").tensors["emb"]
    assert again.lookup == look and (again.min, again.max) == (stats.tensors["emb"].min,
                                                                stats.tensors["emb"].max)


def test_ids_through_a_cast_and_every_range_method():
    model = load_proto(lookup_model(through="Cast"), "lookup")
    data = Dataset(name="ids", calibration=_ids(0, 100, 1), evaluation=_ids(100, ROWS, 2))
    for method in ("minmax", "percentile", "mse"):
        stats = stages.calibrate_model(model, data, method=method)
        assert stats.tensors["emb"].lookup is not None
        res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A16_W16))
        assert "emb" not in {c["tensor"] for c in res["saturation"]["tensors"]}, method
