"""Text task data, encoder detection, variable-length batching, pooling, minilm-l3 end to end."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantscope.tasks import text
from quantscope.types import QuantscopeError

HIDDEN = 8
VOCAB = 30522


def tiny_encoder(
    *,
    outputs: tuple[str, ...] = ("tokens",),
    inputs: tuple[str, ...] = ("input_ids", "attention_mask"),
    int_type: int = TensorProto.INT64,
) -> onnx.ModelProto:
    """tokens = table[input_ids] ([B,S,H]); pooled = ReduceMean over S ([B,H]); mask unused."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(
        rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "table"
    )
    ids = "ids64"
    nodes = [
        helper.make_node("Cast", [inputs[0]], [ids], to=TensorProto.INT64),
        helper.make_node("Gather", ["table", ids], ["tokens"]),
        helper.make_node("ReduceMean", ["tokens"], ["pooled"], axes=[1], keepdims=0),
    ]
    graph_inputs = [helper.make_tensor_value_info(n, int_type, ["B", "S"]) for n in inputs]
    shapes = {"tokens": ["B", "S", HIDDEN], "pooled": ["B", HIDDEN]}
    graph_outputs = [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, shapes[o]) for o in outputs
    ]
    graph = helper.make_graph(nodes, "tiny", graph_inputs, graph_outputs, [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


# --------------------------------------------------------------------------- data


def test_stdlib_docs_pairs_and_calibration_are_frozen_and_disjoint():
    pairs = text.load_pairs("stdlib-docs")
    assert len(pairs) == 1500
    assert len(set(pairs.queries)) == len(pairs) and len(set(pairs.documents)) == len(pairs)
    assert all(len(q.split()) >= 4 for q in pairs.queries)
    assert all(len(d.split()) >= 15 for d in pairs.documents)
    calib = text.load_calibration_texts("stdlib-docs")
    assert len(calib) == 512
    assert not set(calib) & (set(pairs.queries) | set(pairs.documents))


def test_user_pairs_jsonl(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{"query": "a b", "document": "c d"}, {"query": "e", "document": "f", "id": 3}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    pairs = text.load_pairs(path)
    assert pairs.queries == ("a b", "e") and pairs.documents == ("c d", "f")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"query": "q", "document": "d"}\n["q", "d"]\n', "line 2: expected an object"),
        ('{"query": "q"}\n', "line 1: expected an object with string fields"),
        ('{"query": "q", "document": 3}\n', "line 1: expected an object"),
        ("{not json\n", "line 1: not JSON"),
        ("\n\n", "empty file"),
    ],
)
def test_bad_pairs_file_is_one_line_error(tmp_path, content, message):
    path = tmp_path / "pairs.jsonl"
    path.write_text(content)
    with pytest.raises(QuantscopeError, match=message) as info:
        text.load_pairs(path)
    assert "\n" not in str(info.value)


def test_missing_data_files(tmp_path):
    with pytest.raises(QuantscopeError, match="not found"):
        text.load_pairs(tmp_path / "nope.jsonl")
    with pytest.raises(QuantscopeError, match="not found"):
        text.load_calibration_texts(tmp_path / "nope.txt")


def test_calibration_text_file(tmp_path):
    path = tmp_path / "calib.txt"
    path.write_text("first sentence\n\n  second one  \n")
    assert text.load_calibration_texts(path) == ("first sentence", "second one")
    path.write_text("\n  \n")
    with pytest.raises(QuantscopeError, match="empty file"):
        text.load_calibration_texts(path)


def test_tokenizer_packaged_folder_and_missing(tmp_path):
    tok = text.load_tokenizer(max_length=8)
    assert len(tok.encode("word " * 50).ids) == 8
    assert tok.encode("Hello world").ids == [101, 7592, 2088, 102]
    (tmp_path / "tokenizer.json").write_bytes(text._data_file(text.TOKENIZER_FILE).read_bytes())
    assert text.load_tokenizer(tmp_path).encode("Hello world").ids == [101, 7592, 2088, 102]
    with pytest.raises(QuantscopeError, match="tokenizer not found"):
        text.load_tokenizer(tmp_path / "missing")


def test_a_tokenizer_is_read_once_per_content_and_length(tmp_path):
    import os

    from quantscope.tasks import tokenizer_files as tf

    packaged = text._data_file(text.TOKENIZER_FILE).read_bytes()
    path = tmp_path / "tokenizer.json"
    path.write_bytes(packaged)
    first = text.load_tokenizer(path, max_length=8)
    assert text.load_tokenizer(path, max_length=8) is first  # the same bytes: kept
    assert text.load_tokenizer(max_length=8) is first  # the packaged file: the same bytes
    assert text.load_tokenizer(path, max_length=9) is not first  # another length
    texts = ["word " * 40, "Hello world"]
    assert list(text.token_lengths(texts, first)) == [42, 4]  # untruncated, its twin kept
    assert tf.untruncated(first) is tf.untruncated(first)
    assert len(first.encode(texts[0]).ids) == 8  # the twin left the kept one truncating
    # edited in place with its times kept: read again, by its bytes
    stat = path.stat()
    doc = json.loads(packaged)
    doc["model"]["vocab"]["hello"], doc["model"]["vocab"]["world"] = 2088, 7592
    path.write_text(json.dumps(doc))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    edited = text.load_tokenizer(path, max_length=8)
    assert edited is not first and edited.encode("Hello world").ids == [101, 2088, 7592, 102]
    path.write_text('{"not": "a tokenizer"}')
    with pytest.raises(QuantscopeError, match="valid JSON but no tokenizer"):
        text.load_tokenizer(path)


# --------------------------------------------------------------------------- detection


def test_detect_token_output_preferred_over_pooled():
    enc = text.detect_encoder(tiny_encoder(outputs=("pooled", "tokens")))
    assert (enc.output, enc.output_index, enc.output_kind, enc.hidden_size) == (
        "tokens",
        1,
        "tokens",
        8,
    )
    assert [r for r, _, _ in enc.inputs] == ["input_ids", "attention_mask"]
    assert "mean pooling" in enc.describe() and "token_type_ids" not in enc.describe()


def test_detect_pooled_output_and_forced_output():
    enc = text.detect_encoder(tiny_encoder(outputs=("pooled",)))
    assert (enc.output_kind, enc.output_index) == ("pooled", 0)
    forced = text.detect_encoder(tiny_encoder(outputs=("tokens", "pooled")), output="pooled")
    assert (forced.output, forced.output_index, forced.output_kind) == ("pooled", 1, "pooled")
    with pytest.raises(QuantscopeError, match="no float output 'nope'"):
        text.detect_encoder(tiny_encoder(), output="nope")


def test_detect_output_without_shape_is_pooled_by_rank_at_run_time():
    model = tiny_encoder()
    model.graph.output[0].type.tensor_type.ClearField("shape")
    enc = text.detect_encoder(model)
    assert (enc.output_kind, enc.hidden_size) == ("auto", None) and "unstated" in enc.describe()
    batches = text.make_batches(TEXTS, text.load_tokenizer(), enc, batch_size=2)
    got = text.embed(text.ort_runner(model.SerializeToString()), batches, enc)
    assert got.shape == (len(TEXTS), HIDDEN)


def test_detect_fuzzy_names_int32_and_token_types():
    names = ("ids", "input_mask", "segment_ids")
    enc = text.detect_encoder(tiny_encoder(inputs=names, int_type=TensorProto.INT32))
    assert enc.inputs == (
        ("input_ids", "ids", "int32"),
        ("attention_mask", "input_mask", "int32"),
        ("token_type_ids", "segment_ids", "int32"),
    )
    assert "input_ids=ids" in enc.describe()


def test_not_a_sentence_encoder_names_its_inputs():
    with pytest.raises(QuantscopeError, match=r"model inputs \(pixel_values\) do not look like"):
        text.detect_encoder(tiny_encoder(inputs=("pixel_values",)))
    with pytest.raises(QuantscopeError, match="position_ids"):
        text.detect_encoder(tiny_encoder(inputs=("input_ids", "attention_mask", "position_ids")))


# --------------------------------------------------------------------------- batching, pooling


TEXTS = [
    "short one",
    "a much longer sentence with many more words than the others in this list",
    "medium length text here",
    "x",
    "another fairly long sentence that needs padding in its batch",
]


def test_batches_have_their_own_lengths_and_recoverable_order():
    enc = text.detect_encoder(tiny_encoder())
    batches = text.make_batches(TEXTS, text.load_tokenizer(), enc, batch_size=2)
    assert len(batches) == 3
    widths = [b["input_ids"].shape[1] for b in batches]
    assert widths == sorted(widths) and len(set(widths)) == 3
    assert sorted(batches.order.tolist()) == list(range(len(TEXTS)))
    for feeds in batches:
        assert set(feeds) == {"input_ids", "attention_mask"}
        assert feeds["input_ids"].dtype == np.int64
        assert np.all((feeds["input_ids"] != 0) == (feeds["attention_mask"] == 1))


def test_embed_restores_input_order_and_ignores_padding():
    model = tiny_encoder()
    enc = text.detect_encoder(model)
    tok = text.load_tokenizer()
    run = text.ort_runner(model.SerializeToString())
    got = text.embed(run, text.make_batches(TEXTS, tok, enc, batch_size=2), enc, normalize=False)
    table = numpy_helper.to_array(model.graph.initializer[0])
    want = np.stack([table[tok.encode(t).ids].mean(axis=0) for t in TEXTS])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    unit = text.embed(run, text.make_batches(TEXTS, tok, enc, batch_size=2), enc)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)


def test_pool_pooled_and_bad_rank():
    x = np.array([[3.0, 4.0]], np.float32)
    np.testing.assert_allclose(text.pool(x, np.ones((1, 1))), [[0.6, 0.8]])
    with pytest.raises(QuantscopeError, match="expected"):
        text.pool(np.zeros((1, 2, 3, 4)), np.ones((1, 2)))


# --------------------------------------------------------------------------- real model


@pytest.fixture(scope="module")
def minilm_l3(tmp_path_factory):
    from quantscope.zoo import resolve_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTSCOPE_CACHE", str(tmp_path_factory.mktemp("cache")))
        return resolve_model("minilm-l3")


def test_minilm_l3_end_to_end_on_stdlib_docs(minilm_l3):
    pairs = text.load_pairs("stdlib-docs")
    n = 48
    enc = text.detect_encoder(minilm_l3)
    assert enc.output_kind == "tokens" and enc.input_name("token_type_ids") is None
    tok, run = text.load_tokenizer(), text.ort_runner(minilm_l3)
    q = text.embed(run, text.make_batches(pairs.queries[:n], tok, enc, batch_size=16), enc)
    d = text.embed(run, text.make_batches(pairs.documents[:n], tok, enc, batch_size=16), enc)
    assert q.shape == (n, 384) and np.allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-5)
    recall1 = np.mean((q @ d.T).argmax(axis=1) == np.arange(n))
    assert recall1 > 0.4  # 48 candidates: chance is 0.02
    one_by_one = text.embed(run, text.make_batches(pairs.queries[:5], tok, enc, batch_size=1), enc)
    np.testing.assert_allclose(one_by_one, q[:5], atol=1e-5)


def test_a_tokenizer_beside_the_model_is_used_and_pads_with_its_pad_id(tmp_path):
    """A Hugging Face export folder (model.onnx + tokenizer.json): its tokenizer, its
    [PAD] id (3 here, not 0), and the note says which tokenizer ran."""
    import tokenizers

    from quantscope.model.load import load
    from quantscope.tasks.registry import text_dataset

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "[PAD]": 3, "again": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    onnx.save(tiny_encoder(), tmp_path / "model.onnx")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"query": q, "document": d}) for q, d in [
        ("hello", "hello world again"), ("world", "world"), ("again hello", "hello")]))
    model = load(tmp_path / "model.onnx")
    _, _, _, note, _ = text_dataset(str(pairs), model)
    assert "tokenizer bert-uncased-tokenizer.json (packaged)" in note
    tok.save(str(tmp_path / "tokenizer.json"))
    _, evaluation, _, note, lengths = text_dataset(str(pairs), model)
    assert "tokenizer tokenizer.json;" in note
    assert sorted(lengths.tolist()) == [1, 1, 1, 1, 2, 3]
    ids = np.concatenate([b["input_ids"].ravel() for b in evaluation])
    mask = np.concatenate([b["attention_mask"].ravel() for b in evaluation])
    assert set(ids[mask == 0].tolist()) == {3} and 3 not in ids[mask == 1]
