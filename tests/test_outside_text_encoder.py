"""A BERT-style text encoder exported without ``token_type_ids`` and with a short learned
position table (issue: models beyond the zoo).

``transformers.BertModel`` exported with only ``input_ids``/``attention_mask`` adds its
position rows (a Gather from ``position_embeddings [P, H]`` indexed by a slice of a
constant ``position_ids`` buffer) and its token-type row (a constant) to the word rows.

* The position table holds ``P`` rows: a text longer than ``P`` tokens failed inside ONNX
  Runtime, and every command that reads text stopped with an internal error (exit 3) at
  ``P`` = 128 and the default truncation at 256. The texts are truncated at ``P``, and the
  data note says why.
* The constant Adds joined the word lookup's group, so the lookup's rows (what the host
  feeds the device when the target keeps the lookup on the host) had no grid: ``io.json``
  had no input row and the verdict told the host to feed ``input_ids`` to the device.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.serde import read_json

VOCAB = 30522  # the packaged tokenizer's: no --tokenizer needed
POSITIONS = 16
WIDTH = 4


def short_positions_encoder() -> onnx.ModelProto:
    """word rows + position rows (a Slice of a constant buffer, then Gather) + a constant
    token-type row, LayerNorm, a Linear; ``hidden [N, S, 4]``."""
    r = np.random.default_rng(0)
    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    ids = helper.make_tensor_value_info("input_ids", i64, ["N", "S"])
    mask = helper.make_tensor_value_info("attention_mask", i64, ["N", "S"])
    out = helper.make_tensor_value_info("hidden", f, ["N", "S", WIDTH])
    inits = {
        "word": r.normal(0, 1, (VOCAB, WIDTH)).astype(np.float32),
        "pos_table": r.normal(0, 0.3, (POSITIONS, WIDTH)).astype(np.float32),
        "position_ids": np.arange(POSITIONS, dtype=np.int64)[None],
        "type_row": r.normal(0, 0.1, (1, 1, WIDTH)).astype(np.float32),
        "one": np.array([1], np.int64), "zero": np.array([0], np.int64),
        "gamma": np.ones(WIDTH, np.float32), "beta": np.zeros(WIDTH, np.float32),
        "w": r.normal(0, 0.5, (WIDTH, WIDTH)).astype(np.float32),
        "axes": np.array([2], np.int64),
    }
    nodes = [
        helper.make_node("Gather", ["word", "input_ids"], ["rows"], name="word_gather"),
        helper.make_node("Shape", ["input_ids"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"]),
        helper.make_node("Slice", ["position_ids", "zero", "seq", "one"], ["pos_ids"]),
        helper.make_node("Gather", ["pos_table", "pos_ids"], ["pos_rows"]),
        helper.make_node("Add", ["rows", "type_row"], ["typed"], name="add_type"),
        helper.make_node("Add", ["typed", "pos_rows"], ["emb"], name="add_pos"),
        helper.make_node("LayerNormalization", ["emb", "gamma", "beta"], ["ln"], axis=-1),
        helper.make_node("MatMul", ["ln", "w"], ["h"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=f),
        helper.make_node("Unsqueeze", ["mf", "axes"], ["m3"]),
        helper.make_node("Mul", ["h", "m3"], ["hidden"]),
    ]
    graph = helper.make_graph(nodes, "enc", [ids, mask], [out],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    d = tmp_path_factory.mktemp("enc")
    onnx.save(short_positions_encoder(), d / "enc.onnx")
    return d


def test_the_lookup_is_a_group_of_its_own():
    groups = find_groups(load_proto(short_positions_encoder(), "enc"))
    lookup = next(g for g in groups.groups if g.name == "word_gather")
    assert lookup.nodes == ("word_gather",) and lookup.outputs == ("rows",)
    adds = next(g for g in groups.groups if g.name == "add_type")
    assert adds.nodes == ("add_type", "add_pos") and adds.inputs == ("rows",)


def test_texts_are_truncated_at_the_position_table(enc, capsys):
    """stdlib-docs has texts far over 16 tokens: calibrate ran the model at 256."""
    model = str(enc / "enc.onnx")
    assert main(["calibrate", model, "--data", "stdlib-docs", "--out",
                 str(enc / "s.npz")]) == 0
    assert main(["evaluate", model, "--data", "stdlib-docs", "--pairs", "16", "--stats",
                 str(enc / "s.npz"), "--precision", "a8_w8"]) == 0
    assert ("the model takes at most 16 tokens (its position table 'pos_table' has 16 "
            "rows): texts truncated there") in capsys.readouterr().out


def test_run_feeds_the_looked_up_rows_to_the_device(enc, capsys):
    assert main(["run", str(enc / "enc.onnx"), "--data", "stdlib-docs", "--pairs", "24",
                 "--target", "hailo10h", "--lengths", "off", "--repairs", "none",
                 "--out", str(enc / "W")]) == 0
    v = read_json(enc / "W" / "verdict.json", "verdict")
    inputs = [r for r in v["io"] if r["role"] == "input"]
    assert [(r["tensor"], r["host_lookup"]["table"]) for r in inputs] == [("rows", "word")]
    steps = " | ".join(v["host_steps"])
    assert "look up word [30522x4]" in steps and "feed attention_mask" in steps
    assert "feed input_ids" not in steps
    assert "seq-len: 16 tokens" in capsys.readouterr().err


def test_a_seq_len_over_the_position_table_is_refused(enc, capsys):
    """--seq-len 20 on a 16-row table: the run planned, 'measured' and compiled at 20 (texts
    were truncated at 16 anyway) and told the host to compile at 1x20."""
    out = enc / "W20"
    assert main(["run", str(enc / "enc.onnx"), "--data", "stdlib-docs", "--pairs", "24",
                 "--target", "hailo10h", "--seq-len", "20", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("quantscope: error: --seq-len 20: the model takes at most 16 tokens "
                       "(its position table 'pos_table' has 16 rows), so it cannot be "
                       "compiled at 20: give --seq-len 16 or less")
    assert not out.exists()
