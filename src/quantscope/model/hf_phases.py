"""A Hugging Face causal-LM export -> the two phase graphs quantscope measures.

A decoder exported the usual way (``torch.onnx.export`` of a ``*ForCausalLM`` with its
cache, or optimum's ``decoder_with_past_model.onnx``) is one graph for both phases:

==================  ====================================================================
the export          ``input_ids [B, S]``, ``attention_mask [B, P + S]``, optionally
                    ``position_ids [B, S]`` / ``cache_position [S]``, and
                    ``past_key_values.{i}.key|value [B, H, P, D]`` -> ``logits [B, S, V]``
                    and ``present.{i}.key|value [B, H, P + S, D]``
``decode``          the export with ``past_key_values.{i}.*`` renamed ``past.{i}.*`` and the
                    mask and positions computed in the graph from ``input_ids`` and the
                    past length (all ones, ``P … P + S - 1``): the interface of
                    :mod:`quantscope.model.phases`
``prefill``         the same, with the past an empty constant ``[1, H, 0, D]`` that every
                    cache ``Concat`` drops (``Concat(new)``, as the built-in's prefill
                    writes it), so the prompt is the whole sequence
batch               1 in both (the interface's ``input_ids [1, N]``): the mask and the
                    empty past are one sequence's
same names          both graphs keep every node name and weight name of the export (one
                    plan names the same groups in both); the nodes added are ``qs.*``
==================  ====================================================================

The mask and positions are computed from integer tensors (the token ids' shape, the
cache's length), so they stay ``side`` tensors: never quantized, as in the built-in.
What cannot be converted (no cache inputs, another input, a cache dim that is not a
number, control flow for the cache branch) is refused in one line naming it.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscope.model.fuse_rmsnorm import RMS_OPSET, drop_noop_casts, fuse_rms_norms
from quantscope.model.load import upgrade_opset
from quantscope.serde import Writer, write_atomic_set
from quantscope.types import QuantscopeError

HF_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")
FILLED = ("attention_mask", "position_ids", "cache_position")
_INTS = (TensorProto.INT64, TensorProto.INT32)
EMPTY_PAST = "past_key_values.{i}.{kind}"  # the prefill's empty past (its name in the export)
EXPORT_HINT = ("export the model with its KV cache (torch.onnx.export of the *ForCausalLM "
               "with past_key_values inputs, or optimum's decoder_with_past_model.onnx)")


@dataclass(frozen=True)
class HfExport:
    """What the conversion read from the export."""

    layers: int
    heads: int  # KV heads
    head_dim: int
    filled: tuple[str, ...]  # the inputs now computed in the graph


def empty_past(layer: int, kind: str) -> str:
    """The name of layer ``layer``'s empty past ``kind`` ('key'/'value') in a converted
    prefill graph: the initializer a KV prefix fills (:mod:`quantscope.zoo.prefix`)."""
    return EMPTY_PAST.format(i=layer, kind=kind)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in vi.type.tensor_type.shape.dim]


def read_export(proto: onnx.ModelProto) -> HfExport:
    """The export's cache layout, or one line saying why it is no convertible export."""
    graph = proto.graph
    inits = {t.name for t in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in inits}
    outputs = {o.name for o in graph.output}
    if "input_ids" not in inputs:
        raise QuantscopeError("the model has no input 'input_ids': it is no causal-LM export "
                              f"(inputs: {', '.join(inputs) or 'none'})")
    if inputs["input_ids"].type.tensor_type.elem_type not in _INTS:
        raise QuantscopeError("input 'input_ids' is not int64/int32: it is no causal-LM export")
    if "logits" not in outputs:
        raise QuantscopeError("the model has no output 'logits': it is no causal-LM export "
                              f"(outputs: {', '.join(sorted(outputs))})")
    if any(n.op_type in ("If", "Loop", "Scan") for n in graph.node):
        raise QuantscopeError(
            "the export has control flow (If/Loop/Scan, e.g. optimum's merged decoder with "
            f"'use_cache_branch'): give the unmerged decoder_with_past_model.onnx, or {EXPORT_HINT}")
    past = {n: HF_PAST.match(n) for n in inputs if HF_PAST.match(n)}
    if not past:
        raise QuantscopeError(f"the export has no past_key_values.{{i}}.key|value inputs, so "
                              f"it has no decode phase: {EXPORT_HINT}")
    other = [n for n in inputs if n != "input_ids" and n not in FILLED and n not in past]
    if other:
        raise QuantscopeError(
            f"the export has input(s) {', '.join(repr(n) for n in other)} that quantscope "
            f"cannot fill: it fills input_ids' {', '.join(FILLED)} and the cache only "
            "(re-export without them)")
    layers = sorted({int(m.group(1)) for m in past.values()})
    want = {f"past_key_values.{i}.{p}" for i in range(len(layers)) for p in ("key", "value")}
    if layers != list(range(len(layers))) or set(past) != want:
        raise QuantscopeError(f"the export's cache inputs are not past_key_values.{{i}}.key|"
                              f"value for i = 0 … n - 1 (it has {', '.join(sorted(past))})")
    present = {n for n in outputs if PRESENT.match(n)}
    if present != {n.replace("past_key_values.", "present.") for n in want}:
        raise QuantscopeError("the export's present.{i}.key|value outputs do not match its "
                              "past_key_values.{i}.key|value inputs: " + EXPORT_HINT)
    shapes = {tuple(_dims(inputs[n])[1:2] + _dims(inputs[n])[3:4]) for n in past}
    rank = {len(_dims(inputs[n])) for n in past}
    if rank != {4} or len(shapes) != 1 or not all(isinstance(d, int) and d > 0
                                                  for d in next(iter(shapes))):
        raise QuantscopeError(
            "the export's cache inputs are not [batch, heads, past, head_dim] with fixed heads "
            f"and head_dim (past_key_values.0.key is {_dims(inputs['past_key_values.0.key'])})")
    (heads, head_dim), = shapes
    filled = tuple(n for n in FILLED if n in inputs)
    for n in filled:
        if inputs[n].type.tensor_type.elem_type not in _INTS:
            raise QuantscopeError(f"input '{n}' is not int64/int32: quantscope cannot fill it")
    return HfExport(len(layers), int(heads), int(head_dim), filled)


def _fill(graph: onnx.GraphProto, first_past: str, kinds: dict[str, int]) -> list[onnx.NodeProto]:
    """Nodes that compute the mask and positions from ``input_ids`` and the past length."""
    def const(name: str, value: np.ndarray) -> str:
        graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    one, two = const("qs.one", np.array(1, np.int64)), const("qs.two", np.array(2, np.int64))
    ax0 = const("qs.ax0", np.array([0], np.int64))
    nodes = [
        helper.make_node("Shape", ["input_ids"], ["qs.ids_shape"], "qs.ids_shape"),
        helper.make_node("Gather", ["qs.ids_shape", one], ["qs.seq"], "qs.seq"),
        helper.make_node("Shape", [first_past], ["qs.past_shape"], "qs.past_shape"),
        helper.make_node("Gather", ["qs.past_shape", two], ["qs.past_len"], "qs.past_len"),
        helper.make_node("Add", ["qs.past_len", "qs.seq"], ["qs.total"], "qs.total"),
        helper.make_node("Range", ["qs.past_len", "qs.total", one], ["qs.positions"],
                         "qs.positions"),
    ]
    for name, dtype in kinds.items():
        raw = f"qs.{name}.int64" if dtype != TensorProto.INT64 else name
        if name == "attention_mask":
            nodes += [
                helper.make_node("Unsqueeze", ["qs.total", ax0], ["qs.total_1"], "qs.total_1"),
                helper.make_node("Concat", [const("qs.batch", np.array([1], np.int64)),
                                            "qs.total_1"], ["qs.mask_shape"], "qs.mask_shape",
                                 axis=0),
                helper.make_node("ConstantOfShape", ["qs.mask_shape"], [raw], "qs.mask",
                                 value=numpy_helper.from_array(np.array([1], np.int64))),
            ]
        elif name == "position_ids":
            nodes.append(helper.make_node("Unsqueeze", ["qs.positions", ax0], [raw],
                                          "qs.position_ids"))
        else:  # cache_position
            nodes.append(helper.make_node("Identity", ["qs.positions"], [raw],
                                          "qs.cache_position"))
        if raw != name:
            nodes.append(helper.make_node("Cast", [raw], [name], f"qs.{name}", to=dtype))
    return nodes


def to_phase(proto: onnx.ModelProto, phase: str) -> onnx.ModelProto:
    """The ``phase`` graph (``'prefill'`` or ``'decode'``) of a causal-LM export, as a new
    model (``proto`` unchanged): see the module docstring."""
    info = read_export(proto)
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    inits = {t.name for t in graph.initializer}
    by_name = {i.name: i for i in graph.input if i.name not in inits}
    kinds = {n: by_name[n].type.tensor_type.elem_type for n in info.filled}
    past = [f"past_key_values.{i}.{p}" for i in range(info.layers) for p in ("key", "value")]
    keep = [i for i in graph.input if i.name not in info.filled
            and (phase == "decode" or i.name not in past)]
    if phase == "decode":
        rename = {n: n.replace("past_key_values.", "past.") for n in past}
        for vi in keep:
            vi.name = rename.get(vi.name, vi.name)
        for node in graph.node:
            node.input[:] = [rename.get(n, n) for n in node.input]
        first = rename[past[0]]
    else:
        dtypes = {n: by_name[n].type.tensor_type.elem_type for n in past}
        for n in past:
            empty = np.zeros((1, info.heads, 0, info.head_dim),
                             helper.tensor_dtype_to_np_dtype(dtypes[n]))
            graph.initializer.append(numpy_helper.from_array(empty, n))
        empty = set(past)  # the empty past, and what only passes it on (Concat(past))
        for node in graph.node:  # in graph order: a producer comes before its readers
            if node.op_type not in ("Concat", "Identity") or not empty & set(node.input):
                continue
            rest = [n for n in node.input if n not in empty]
            if rest:  # the cache Concat(past, new) -> Concat(new), as the built-in's prefill
                node.input[:] = rest
            else:
                empty.update(node.output)
        first = past[0]
    del graph.input[:]
    graph.input.extend(keep)
    for vi in [*graph.input, *graph.output]:  # one sequence: the mask and past are batch 1
        dims = vi.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_value = 1
    nodes = _fill(graph, first, kinds) + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # the export's inferred shapes carried the symbolic past length
    out.doc_string = (f"{phase} graph of a causal-LM export, converted by quantscope "
                      f"(filled in the graph: {', '.join(info.filled) or 'nothing'})")
    return out


EXTERNAL_BYTES = 64 << 20  # weights above this go into NAME.<phase>.onnx.data beside the graph
_MIN_EXTERNAL = 1024  # smaller tensors stay in the graph file (as onnx.save does)


def _split_weights(proto: onnx.ModelProto, location: str, weights: dict[str, bytes]
                   ) -> Iterator[bytes]:
    """Move the initializers of ``_MIN_EXTERNAL`` bytes or more into external data at
    ``location`` (one file, in order), yielding each one's bytes as it goes (those held
    apart from ``weights``)."""
    offset = 0
    for t in proto.graph.initializer:
        raw = weights.get(t.name)
        if raw is None:
            raw = numpy_helper.to_array(t).tobytes()
        if len(raw) < _MIN_EXTERNAL:
            continue
        name, dims, dtype = t.name, list(t.dims), t.data_type
        t.Clear()
        t.name, t.data_type = name, dtype
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)),
                           ("length", str(len(raw)))):
            t.external_data.add(key=key, value=value)
        yield raw
        offset += len(raw)


def _weight_bytes(proto: onnx.ModelProto) -> int:
    return sum(int(np.prod(t.dims, dtype=np.int64))
               * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
               for t in proto.graph.initializer)


def _inline(proto: onnx.ModelProto, weights: dict[str, bytes]) -> onnx.ModelProto:
    """``proto`` with the weights held apart put back into it."""
    for t in proto.graph.initializer:
        if t.name in weights:
            t.raw_data = weights[t.name]
    return proto


def _graph_writers(export: Prepared, phase: str, path: Path) -> list[tuple[Path, Writer]]:
    """Writers of one phase graph (and its ``.data``): the graph is converted when its
    first file is written and dropped after its last, so one phase is in memory at a time."""
    if _weight_bytes(export.proto) <= EXTERNAL_BYTES:
        return [(path, lambda f: f.write(_inline(to_phase(export.proto, phase),
                                                 export.weights).SerializeToString()))]
    data = path.with_name(path.name + ".data")
    held: dict[str, onnx.ModelProto] = {}

    def write_data(f: BinaryIO) -> None:
        held["proto"] = to_phase(export.proto, phase)
        for chunk in _split_weights(held["proto"], data.name, export.weights):
            f.write(chunk)

    return [(data, write_data),
            (path, lambda f: f.write(held.pop("proto").SerializeToString()))]


@dataclass(frozen=True)
class Prepared:
    """The export as the phase graphs are made from it, and what was changed. ``proto``
    holds its large weights' dims and types only; their bytes are in ``weights`` (by
    initializer name), so the graph is rebuilt and copied without them."""

    proto: onnx.ModelProto
    norms: int  # spelt-out RMSNorms fused into RMSNormalization
    casts: int  # Casts to float32 of float32 tensors dropped
    weights: dict[str, bytes]


_APART = 1024  # bytes: weights above this are held apart while the graphs are rebuilt


def take_weights(proto: onnx.ModelProto) -> dict[str, bytes]:
    """Move the data of each initializer over :data:`_APART` bytes out of ``proto`` (in
    place: its name, dims and type stay), returning it by name."""
    out: dict[str, bytes] = {}
    for t in proto.graph.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) * \
                helper.tensor_dtype_to_np_dtype(t.data_type).itemsize <= _APART:
            continue
        out[t.name] = t.raw_data if t.HasField("raw_data") else \
            numpy_helper.to_array(t).tobytes()
        name, dims, dtype = t.name, list(t.dims), t.data_type
        t.Clear()
        t.name, t.data_type = name, dtype
        t.dims.extend(dims)
    return out


def prepare_export(export: onnx.ModelProto) -> Prepared:
    """The export checked (:func:`read_export`), its large weights taken out of it
    (:func:`take_weights`: ``export`` is left without them), its no-op Casts dropped, at
    opset 23 when it spells out RMSNorms, with those fused
    (:mod:`quantscope.model.fuse_rmsnorm`). The function is unchanged (FP32 up to
    rounding, checked in the tests). The graph work copies no weight: the peak is about
    one copy of the weights."""
    read_export(export)
    weights = take_weights(export)
    proto, casts = drop_noop_casts(export)
    _, found = fuse_rms_norms(proto)  # a dry run at the export's opset: any to fuse?
    if not found:
        return Prepared(proto, 0, casts, weights)
    proto, norms = fuse_rms_norms(upgrade_opset(proto, RMS_OPSET))
    return Prepared(proto, norms, casts, weights)


def write_phases(export: Prepared, folder: Path, name: str,
                 tokenizer: Path | None) -> list[Path]:
    """``folder/NAME.prefill.onnx``, ``NAME.decode.onnx`` (and their ``.data`` when the
    weights are over :data:`EXTERNAL_BYTES`) and ``NAME.tokenizer.json`` (a copy of
    ``tokenizer``), written as a set: all or none. ``export``: as :func:`prepare_export`
    returns it. Returns the files written."""
    items: list[tuple[Path, Writer]] = []
    if tokenizer is not None:
        def copy(f: BinaryIO, src: Path = tokenizer) -> None:
            with src.open("rb") as read:
                shutil.copyfileobj(read, f)
        items.append((folder / f"{name}.tokenizer.json", copy))
    for phase in ("decode", "prefill"):
        items += _graph_writers(export, phase, folder / f"{name}.{phase}.onnx")
    return write_atomic_set(items)


@dataclass(frozen=True)
class Converted:
    """What :func:`convert_export` did: the export read, what changed, the files written."""

    info: HfExport
    norms: int
    casts: int
    prefill: Path
    written: tuple[Path, ...]

    def said(self, export: Path) -> str:
        """What the conversion read and changed, in console lines."""
        info = self.info
        lines = [f"{export}: a decoder of {info.layers} layers, {info.heads} KV heads of "
                 f"{info.head_dim}; filled in the graphs: {', '.join(info.filled) or 'nothing'}"
                 " (all ones / from the past length)"]
        if self.norms:
            lines.append(f"  {self.norms} RMSNorm(s) spelt out in elementwise ops fused into "
                         "RMSNormalization (opset 23)")
        if self.casts:
            lines.append(f"  {self.casts} Cast(s) to float32 of float32 tensors dropped")
        return "\n".join(lines)


def tokenizer_beside(export: Path, given: Path | None) -> Path | None:
    """The tokenizer file of a conversion: ``given`` (a ``tokenizer.json`` or a folder
    holding one), else ``tokenizer.json`` beside the export, else None."""
    if given is not None:
        return given / "tokenizer.json" if given.is_dir() else given
    beside = export.parent / "tokenizer.json"
    return beside if beside.is_file() else None


def convert_export(export: Path, folder: Path, name: str,
                   tokenizer: Path | None) -> Converted:
    """``export`` converted into ``folder/NAME.prefill.onnx``, ``NAME.decode.onnx`` (and
    ``NAME.tokenizer.json``, a copy of ``tokenizer``): all the files or none, ``folder``
    made if missing, the export only read. A file that would overwrite one of its inputs
    (the export, its weights, the tokenizer) is refused before anything is read."""
    from quantscope.model.load import read_model_file

    targets = [folder / f"{name}.{p}.onnx" for p in ("prefill", "decode")]
    targets += [t.with_name(t.name + ".data") for t in targets]
    targets.append(folder / f"{name}.tokenizer.json")
    sources = [export.resolve(), *(p.resolve() for p in export.parent.glob("*.data"))]
    if tokenizer is not None:
        sources.append(tokenizer.resolve())
    clash = [t for t in targets if t.resolve() in sources]
    if clash:
        raise QuantscopeError(f"'{clash[0]}' would overwrite an input file: give another "
                              "--out or --name")
    proto = read_model_file(export)
    info = read_export(proto)
    prepared = prepare_export(proto)
    del proto
    folder.mkdir(exist_ok=True)
    written = write_phases(prepared, folder, name, tokenizer)
    return Converted(info, prepared.norms, prepared.casts, targets[0], tuple(written))


def is_hf_export(path: str | Path) -> bool:
    """Whether ``path`` is an ONNX file whose graph reads ``past_key_values.*`` (a causal-LM
    export with its cache, one graph for both phases: what :func:`convert_export` takes).
    Reads the graph without its external weights; False for anything else (a built-in
    name, a phase graph, a folder, an unreadable file: their own checks say why)."""
    path = Path(path)
    if path.suffix != ".onnx" or not path.is_file() or ".prefill." in path.name \
            or ".decode." in path.name:
        return False
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - not readable as ONNX: the model loader says why
        return False
    inits = {t.name for t in graph.initializer}
    return any(HF_PAST.match(i.name) for i in graph.input if i.name not in inits)


__all__ = ["EMPTY_PAST", "EXTERNAL_BYTES", "FILLED", "Converted", "convert_export",
           "empty_past", "HfExport", "is_hf_export", "Prepared", "prepare_export",
           "take_weights", "read_export", "to_phase", "tokenizer_beside", "write_phases"]
