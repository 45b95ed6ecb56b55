"""Shape inference for large graphs: no weight copies, no model kept alive by the cache."""

from __future__ import annotations

import dataclasses
import gc
import math
import weakref

import onnx
from decoder_tiny import TINY, tiny_weights
from onnx import shape_inference

from quantscope.model import shapes as shapes_mod
from quantscope.model.load import Model, load_proto
from quantscope.model.shapes import resolve_shapes
from quantscope.zoo.decoder import build_decoder


def _full_inference(model: Model, seq: int) -> dict:
    """What the cache did before: infer on a whole copy, weights included."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    del proto.graph.value_info[:]
    dim = next(i for i in proto.graph.input if i.name == "input_ids").type.tensor_type.shape.dim
    dim[1].ClearField("dim_param")
    dim[1].dim_value = seq
    return Model(proto=shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True),
                 source="full").value_shapes()


WIDER = dataclasses.replace(TINY, hidden=64, ffn=128, vocab=256)  # weights > KEEP_VALUES


def test_stripped_inference_gives_the_same_shapes() -> None:
    model = load_proto(build_decoder(WIDER, tiny_weights(WIDER), "prefill"), source="w.prefill")
    stripped = shapes_mod._stripped(model)
    big = {t.name for t in model.graph.initializer if math.prod(t.dims) > shapes_mod.KEEP_VALUES}
    assert len(big) >= 3 * WIDER.layers and not big & {t.name for t in stripped.graph.initializer}
    assert stripped.ByteSize() < model.proto.ByteSize() / 3
    got = resolve_shapes(model, {"input_ids": (1, 16)})
    want = _full_inference(model, 16)
    want = {**want, "input_ids": (1, 16)}
    for k, w in want.items():  # the same, or a dim ONNX left symbolic is now known
        assert len(got[k]) == len(w) and all(
            g == d or (isinstance(g, int) and not isinstance(d, int))
            for g, d in zip(got[k], w, strict=True)), (k, got[k], w)
    assert got["pos.keys"] == (16,)  # symbolic shape inference folds the position range
    assert got["logits"] == (1, 16, WIDER.vocab) and not big & set(got)


def test_cache_does_not_keep_the_model_alive() -> None:
    model = load_proto(build_decoder(TINY, tiny_weights(), "decode"), source="tiny.decode")
    first = resolve_shapes(model, {"input_ids": (1, 1)})
    assert resolve_shapes(model, {"input_ids": (1, 1)}) == first  # cached while alive
    assert model in shapes_mod._CACHE
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
