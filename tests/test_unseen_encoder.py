"""An encoder quantscope has never seen (``unseen_encoder.py``: XLM-R-style inputs, its own
tokenizer, ``last_hidden_state``): text prefixes reach the model, change the evaluation
cache key and are recorded; the word-embedding lookup is a host fact the cost, the check,
the device I/O and the verdict read; ``run`` works with only ``--tokenizer`` and asks for
it in one line without."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from unseen_encoder import ROWS, unseen_encoder, vocabulary, write_pairs, write_tokenizer

from quantscope import stages
from quantscope.analyze.evalcache import data_digest, evaluation_key
from quantscope.cli import main
from quantscope.export.device_io import device_io, python_snippet
from quantscope.model.groups import find_groups
from quantscope.model.host_gather import host_gathers, host_groups
from quantscope.model.shapes import seq_len_shapes
from quantscope.pipeline.data import open_run_data, provenance
from quantscope.plan.check import HOST_RULE, check
from quantscope.plan.cost import plan_cost, uniform_a8_cost
from quantscope.serde import read_json
from quantscope.targets import load_target
from quantscope.targets.profile import parse_target
from quantscope.tasks.text import TextPrefixes
from quantscope.types import Plan, Precision, QuantscopeError

E5 = TextPrefixes("query: ", "passage: ")


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    d = tmp_path_factory.mktemp("unseen")
    onnx.save(unseen_encoder(), d / "enc.onnx")
    write_tokenizer(d / "tok.json")
    write_pairs(d / "pairs.jsonl")
    return d


def _open(ws, prefixes=None, **kw):
    model = stages.open_model(ws / "enc.onnx")
    return model, stages.open_data(str(ws / "pairs.jsonl"), model,
                                   tokenizer=str(ws / "tok.json"), max_pairs=8,
                                   prefixes=prefixes, **kw)


def _rows(batches, name="input_ids"):
    """Every row's token ids without padding (pad id 1), in batch order."""
    return [list(r[r != 1]) for b in batches for r in np.asarray(b[name])]


# --------------------------------------------------------------------------- prefixes


def test_prefixed_tokens_reach_the_model_queries_documents_and_calibration(ws):
    v = vocabulary()
    query, passage = [v["<s>"], v["query"], v[":"]], [v["<s>"], v["passage"], v[":"]]
    _, plain = _open(ws)
    _, pre = _open(ws, E5)
    order = pre.task.batches.order  # row k of the batches is text order[k]
    rows = _rows(pre.evaluation)
    for k, text in enumerate(order):  # texts 0..7 are the queries, 8..15 the documents
        assert rows[k][:3] == (query if text < 8 else passage)
    assert all(r[:3] == passage for r in _rows(pre.calibration))  # calibration = documents
    assert not any(r[1] in (v["query"], v["passage"]) for r in _rows(plain.evaluation))
    # the prefix is all that changed: each prefixed text is the plain one with 2 tokens more
    assert sorted(len(r) - 2 for r in rows) == sorted(len(r) for r in _rows(plain.evaluation))


def test_the_prefix_changes_the_evaluation_cache_key(ws):
    _, plain = _open(ws)
    _, pre = _open(ws, E5)
    _, other = _open(ws, TextPrefixes("query: ", ""))
    digests = {data_digest(d) for d in (plain, pre, other)}
    assert len(digests) == 3
    keys = {evaluation_key(model="m", data=d, plan="p") for d in digests}
    assert len(keys) == 3
    assert data_digest(_open(ws, E5)[1]) == data_digest(pre)  # and it is stable


def test_provenance_and_notes_say_the_prefixes(ws, tmp_path):
    model = stages.open_model(ws / "enc.onnx")
    rd = open_run_data(model, str(ws / "pairs.jsonl"), eval_data=None, pairs=16,
                       tokenizer=str(ws / "tok.json"), folder=tmp_path, prefixes=E5)
    prov = provenance(rd)
    assert prov["prefixes"]["query"] == "query: " and prov["prefixes"]["document"] == "passage: "
    assert "'query: '" in prov["fit"]["notes"][0] and "'passage: '" in prov["held_out"]["notes"][0]
    plain = provenance(open_run_data(model, str(ws / "pairs.jsonl"), eval_data=None, pairs=16,
                                     tokenizer=str(ws / "tok.json"), folder=tmp_path))
    assert "prefixes" not in plain and "prefix" not in plain["fit"]["notes"][0]


def test_prefixes_on_data_that_is_not_text_are_refused(ws, tmp_path):
    np.savez(tmp_path / "ids.npz", input_ids=np.ones((4, 5), np.int64),
             attention_mask=np.ones((4, 5), np.int64))
    model = stages.open_model(ws / "enc.onnx")
    with pytest.raises(QuantscopeError, match="--query-prefix/--doc-prefix apply to text"):
        stages.open_data(str(tmp_path / "ids.npz"), model, prefixes=E5)


# --------------------------------------------------------------------------- the host lookup


def test_host_gather_is_the_large_table_indexed_by_an_input(ws):
    model = stages.open_model(ws / "enc.onnx")
    (found,) = host_gathers(model, 1000)
    assert (found.table, found.shape, found.indices, found.output) == (
        "roberta.embeddings.word_embeddings.weight", (ROWS, 16), "input_ids", "emb")
    assert found.megabytes == pytest.approx(ROWS * 16 * 4 / 1e6)
    assert host_gathers(model, ROWS + 1) == () and host_gathers(model, 0) == ()
    assert host_groups(find_groups(model), (found,)) == {"embeddings/Gather"}


def _without_host(target):
    return dataclasses.replace(target, host_embedding=None)


def test_cost_leaves_the_lookup_to_the_host(ws):
    model = stages.open_model(ws / "enc.onnx")
    groups, target = find_groups(model), load_target("hailo10h")
    shapes = seq_len_shapes(model, 32)
    lookup_only = Plan(Precision.A8_W8, (("embeddings/Gather", Precision.A16_W16),))
    # on the host the lookup costs nothing at any precision (the device still converts
    # its 16-bit rows for the 8-bit layer that reads them: the boundary); on the device
    # its 16-bit work was counted
    unit = uniform_a8_cost(groups, target, shapes, model=model)
    boundary = 32 * 16 * target.cost.boundary_macs
    assert plan_cost(lookup_only, groups, target, shapes, model=model) == pytest.approx(
        1 + boundary / unit)
    gather_work = 32 * 16 * target.cost.macs_per_value("other")
    device_unit = uniform_a8_cost(groups, _without_host(target), shapes, model=model)
    assert device_unit - unit == pytest.approx(gather_work)
    assert plan_cost(lookup_only, groups, _without_host(target), shapes, model=model) == \
        pytest.approx(1 + (boundary + gather_work * 2.7) / device_unit)  # a16: 3.7x


def test_check_says_the_host_looks_up_and_still_judges_the_rows_it_feeds(ws):
    model = stages.open_model(ws / "enc.onnx")
    groups, target = find_groups(model), load_target("hailo10h")
    shapes = seq_len_shapes(model, 8192)  # [8192, 16] = 131,072 values: super-defuse size
    wide = Plan(Precision.A8_W8, (("embeddings/Gather", Precision.A16_W16),))
    found = check(wide, groups, model, target, shapes=shapes)
    on_lookup = {(p.rule, p.severity): p for p in found if p.group == "embeddings/Gather"}
    note = on_lookup[(HOST_RULE, "info")]
    assert "runs on the host" in note.reason and "19530" in note.provenance
    # its rows enter the compiled graph as a 16-bit input that wide: still refused
    assert ("hailo.super_defuse", "error") in on_lookup
    narrow = check(wide, groups, model, target, shapes=seq_len_shapes(model, 32))
    assert [(p.rule, p.severity) for p in narrow if p.group == "embeddings/Gather"] == [
        (HOST_RULE, "info")]


def test_device_io_and_snippet_say_the_host_looks_up_which_table(ws, tmp_path):
    model, data = _open(ws)
    stats = stages.calibrate_model(model, data)
    plan = Plan(Precision.A8_W8, target="hailo10h")
    rows = stages.device_io_rows(model, stats, plan)
    (row,) = [r for r in rows if r.get("host_lookup")]
    assert row["role"] == "input" and row["tensor"] == "emb"
    assert row["host_lookup"]["table"] == "roberta.embeddings.word_embeddings.weight"
    assert row["host_lookup"]["shape"] == [ROWS, 16] and row["host_lookup"]["dtype"] == "float32"
    # the snippet runs: the table from the FP32 model, the rows, quantized for the device
    onnx.save(unseen_encoder(), tmp_path / "fp32.onnx")
    scope: dict = {}
    exec(python_snippet(rows), scope)  # noqa: S102 - the generated host code under test
    table = scope["load_table_emb"](str(tmp_path / "fp32.onnx"))
    ids = np.array([[0, 7, 9, 2]])
    got = scope["to_device_emb"](scope["lookup_emb"](table, ids))
    want = np.clip(np.round(table[ids] / row["scale"]) + row["zero_point"], 0, 255)
    assert got.dtype == np.uint8 and np.array_equal(got, want)
    # a target without host lookups: no such row (the ids stay an integer input)
    enc = stages.quantize_model(model, stats, plan, scheme=load_target("hailo10h").scheme)
    assert not any(r.get("host_lookup") for r in device_io(model, find_groups(model),
                                                           enc.encodings))


def test_host_embedding_in_a_profile_is_checked(ws):
    raw = {"name": "t", "vendor": "Hailo", "sdk": "x", "precisions": {"other": ["a8_w8"]},
           "cost": {"basis": "b", "relative": {"other": {"a8_w8": 1.0}}}}
    ok = parse_target({**raw, "host_embedding": {"rows": 10, "reason": "r", "provenance": "p"}})
    assert ok.host_rows == 10
    assert parse_target(raw).host_rows == 0
    for bad, message in (({"rows": 0, "reason": "r", "provenance": "p"}, "rows >= 1"),
                         ({"rows": 10, "reason": "r"}, "missing key 'provenance'"),
                         ({"rows": 10, "reason": "r", "provenance": "p", "x": 1}, "unknown key")):
        with pytest.raises(QuantscopeError, match=message):
            parse_target({**raw, "host_embedding": bad})


# --------------------------------------------------------------------------- run


def test_run_without_tokenizer_asks_for_it_in_one_line(ws, capsys):
    out = ws / "no-tok"
    code = main(["run", str(ws / "enc.onnx"), "--data", str(ws / "pairs.jsonl"),
                 "--target", "hailo10h", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--tokenizer" in err and "1,500 rows" in err


@pytest.fixture(scope="module")
def ran(ws):
    """``run`` given only the tokenizer (and a data size), then with e5's prefixes."""
    base = ["run", str(ws / "enc.onnx"), "--data", str(ws / "pairs.jsonl"), "--target",
            "hailo10h", "--pairs", "32", "--tokenizer", str(ws / "tok.json")]
    assert main([*base, "--out", str(ws / "W")]) == 0
    assert main([*base, "--query-prefix", "query: ", "--doc-prefix", "passage: ",
                 "--out", str(ws / "P")]) == 0
    return ws


def test_run_with_only_the_tokenizer_works_end_to_end(ran):
    v = read_json(ran / "W" / "verdict.json", "verdict")
    assert v["legal"] and v["quality"]["plan"]["top1_agreement"] >= 0.9
    assert any("look up roberta.embeddings.word_embeddings.weight" in s for s in v["host_steps"])
    assert any("mean-pool" in s for s in v["host_steps"])
    chk = read_json(ran / "W" / "check.json", "check")
    # the lookup on the host, and the device operators in no Hailo list held (not the
    # word-embedding Gather: the host's)
    assert [p["rule"] for p in chk["problems"]] == ["ops.unlisted", HOST_RULE]
    assert "Gather" not in chk["problems"][0]["group"].split(", ")
    io = read_json(ran / "W" / "io.json", "io")
    assert [r["tensor"] for r in io["io"] if r.get("host_lookup")] == ["emb"]
    snippet = (ran / "W" / "io_snippet.py").read_text()
    assert "def lookup_emb" in snippet and "QUERY_PREFIX" not in snippet


def test_run_with_prefixes_records_them_and_the_host_repeats_them(ran):
    v = read_json(ran / "P" / "verdict.json", "verdict")
    assert "'query: '" in v["host_steps"][0] and "'passage: '" in v["host_steps"][0]
    ev = read_json(ran / "P" / "evaluate.json", "evaluate")
    assert ev["data"]["prefixes"]["query"] == "query: "
    snippet = (ran / "P" / "io_snippet.py").read_text()
    assert "QUERY_PREFIX = 'query: '" in snippet and "DOC_PREFIX = 'passage: '" in snippet
    assert "passage: " in (ran / "P" / "report.html").read_text()
