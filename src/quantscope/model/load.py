"""Load an ONNX model: check it, infer shapes, name every node, raise the opset.

The returned :class:`Model` is never mutated after load; stages that change the graph
(the QDQ writer, repairs) build a new ``ModelProto``.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from quantscope.model import weightless
from quantscope.model.foreign import refuse_foreign_ops, refuse_unknown_ops
from quantscope.model.fuse_rmsnorm import RMS_OPSET, drop_noop_casts, fuse_rms_norms
from quantscope.model.nan_guard import drop_softmax_nan_guards
from quantscope.model.negative_dims import name_negative_dims
from quantscope.model.prequantized import refuse_prequantized
from quantscope.model.recurrent import refuse_batch_first_recurrent
from quantscope.model.softmax_rank import rank_softmax_inputs
from quantscope.model.toposort import sort_nodes
from quantscope.model.widen import widen_float16
from quantscope.types import QuantscopeError

MIN_QDQ16_OPSET = 21  # int16/uint16 QuantizeLinear/DequantizeLinear need opset >= 21
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


@dataclass(frozen=True, eq=False)
class Model:
    """A loaded, shape-inferred ONNX model with unique node names and opset >= 21."""

    proto: onnx.ModelProto
    source: str  # path or built-in name it came from
    notes: tuple[str, ...] = ()  # what the loader normalised (e.g. Constant weights)

    @property
    def graph(self) -> onnx.GraphProto:
        return self.proto.graph

    def initializers(self) -> dict[str, onnx.TensorProto]:
        return {t.name: t for t in self.graph.initializer}

    def initializer_array(self, name: str) -> np.ndarray:
        for t in self.graph.initializer:
            if t.name == name:
                return numpy_helper.to_array(t)
        raise KeyError(name)

    def initializer_dims(self, name: str) -> tuple[int, ...]:
        """An initializer's shape, without reading its data (KeyError: no such one)."""
        return self._dims[name]

    @functools.cached_property
    def _dims(self) -> dict[str, tuple[int, ...]]:
        # the model is never mutated after load (module doc): its initializers' shapes hold
        return {t.name: tuple(int(d) for d in t.dims) for t in self.graph.initializer}

    def input_names(self) -> tuple[str, ...]:
        inits = {t.name for t in self.graph.initializer}
        return tuple(i.name for i in self.graph.input if i.name not in inits)

    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.graph.output)

    def value_shapes(self) -> dict[str, tuple[int | str | None, ...]]:
        """Static/symbolic shapes of every tensor that shape inference could type (a copy
        of what is read once per model: the model is never mutated after load)."""
        return dict(self._value_shapes)

    @functools.cached_property
    def _value_shapes(self) -> dict[str, tuple[int | str | None, ...]]:
        out: dict[str, tuple[int | str | None, ...]] = {}
        for vi in [*self.graph.input, *self.graph.value_info, *self.graph.output]:
            tt = vi.type.tensor_type
            if not tt.HasField("shape"):
                continue
            dims: list[int | str | None] = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    dims.append(d.dim_param)
                else:
                    dims.append(None)
            out[vi.name] = tuple(dims)
        return out

    def value_types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for vi in [*self.graph.input, *self.graph.value_info, *self.graph.output]:
            out[vi.name] = vi.type.tensor_type.elem_type
        for t in self.graph.initializer:
            out[t.name] = t.data_type
        return out

    def opset(self) -> int:
        return _default_opset(self.proto)


def model_digest(proto: onnx.ModelProto) -> str:
    """sha256 of an ONNX model's content, not where it came from: the model without its
    large initializers, serialised (:func:`~quantscope.model.weightless.light_proto`), then
    each of those by name, type, shape and bytes. Equal for equal models, as the whole
    serialised model's hash is, without that copy of every weight: smollm2-135m's prefill
    graph (651 MB of weights) in 0.75 s, against 2.9 s."""
    light, held = weightless.light_proto(proto)
    h = hashlib.sha256(light.SerializeToString(deterministic=True))
    for t in held:
        data = t.raw_data or t.SerializeToString(deterministic=True)
        h.update(f"|{t.name}|{t.data_type}|{list(t.dims)}|{len(data)}|".encode())
        h.update(data)
    return h.hexdigest()


def _default_opset(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def _read(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise QuantscopeError(f"model file '{path}' does not exist: check the path")
    if path.is_dir():
        raise QuantscopeError(f"model '{path}' is a folder: pass the .onnx file inside it")
    if not path.is_file():  # a FIFO would block the reader forever
        raise QuantscopeError(f"model '{path}' is not a regular file (a FIFO or a device): "
                              "pass the saved .onnx file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises several unrelated types
        raise QuantscopeError(
            f"'{path}' is not a readable ONNX model ({type(exc).__name__}): "
            "re-export it or pass a valid .onnx file"
        ) from None
    if len(proto.graph.node) == 0:
        raise QuantscopeError(
            f"'{path}' holds no ONNX graph (empty or truncated file): re-export the model"
        )
    _load_external(proto, path)
    inits = {t.name for t in proto.graph.initializer}
    if not [i for i in proto.graph.input if i.name not in inits]:
        raise QuantscopeError(
            f"model '{path}' has no inputs (its outputs are constants): quantscope feeds "
            "data to a model's inputs; re-export it with its inputs")
    return proto


def read_model_file(path: str | Path) -> onnx.ModelProto:
    """The model file as it is (its external data read in): not checked, not
    shape-inferred, nothing renamed or upgraded; a bad file is one line."""
    return _read(Path(path))


def _load_external(proto: onnx.ModelProto, path: Path) -> None:
    """The weights stored beside the model (``onnx.save(..., save_as_external_data=True)``):
    a missing or unreadable file is named, with the tensor that needs it."""
    from onnx.external_data_helper import (
        ExternalDataInfo,
        load_external_data_for_model,
        uses_external_data,
    )

    base = path.parent
    for t in proto.graph.initializer:
        if not uses_external_data(t):
            continue
        location = ExternalDataInfo(t).location
        file = (base / location).resolve()
        if not file.is_relative_to(base.resolve()) or not file.is_file():
            why = "is outside the model's folder" if not file.is_relative_to(
                base.resolve()) else "does not exist"
            raise QuantscopeError(
                f"model '{path}' keeps weight '{t.name}' in the external data file "
                f"'{location}', which {why} (looked in '{base}'): put the model's data "
                "file beside it, or re-export the model as one file")
    try:
        load_external_data_for_model(proto, str(base))
    except Exception as exc:
        raise QuantscopeError(
            f"model '{path}': its external data files could not be read "
            f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}): "
            "re-export the model with its data beside it") from None


def name_nodes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Give every node a unique, stable name (``<op_type>_<index>`` for nameless ones);
    a model whose nodes have them already is returned as it is (no copy)."""
    names = [n.name for n in proto.graph.node]
    if all(names) and len(set(names)) == len(names):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    seen: set[str] = set()
    for i, node in enumerate(out.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        base, k = name, 1
        while name in seen:
            name = f"{base}__{k}"
            k += 1
        node.name = name
        seen.add(name)
    return out


# Ops that only move or retype a constant: a weight behind them is still a weight.
_LAYOUT_OPS = frozenset({"Transpose", "Reshape", "Identity", "Cast", "Squeeze", "Unsqueeze",
                         "Flatten"})


# Inputs that parameterise an op (a Resize's roi/scales/sizes, a Pad's pads and value, a
# Clip's bounds): a float constant read only there is no weight, whatever its size.
_PARAMETER_INPUTS = {"Resize": {1, 2, 3}, "Upsample": {1}, "Pad": {1, 2, 3}, "Clip": {1, 2},
                     "Range": {0, 1, 2}, "ConstantOfShape": {0}}


def _parameters_only(proto: onnx.ModelProto) -> set[str]:
    """Tensors every reader of which takes as a parameter (:data:`_PARAMETER_INPUTS`)."""
    data: set[str] = {o.name for o in proto.graph.output}
    params: set[str] = set()
    for node in proto.graph.node:
        for i, t in enumerate(node.input):
            (params if i in _PARAMETER_INPUTS.get(node.op_type, ()) else data).add(t)
    return params - data


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_int"):
            return np.array(a.f if a.name == "value_float" else a.i)
        if a.name in ("value_floats", "value_ints"):
            return np.array(list(a.floats) if a.name == "value_floats" else list(a.ints))
    return None


def _is_weight(value: np.ndarray) -> bool:
    return value.dtype.kind == "f" and value.size > 1


def _is_weight_tensor(t: onnx.TensorProto) -> bool:
    """:func:`_is_weight` of an initializer, read from its type and dims (not its data)."""
    try:
        kind = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).kind
    except (KeyError, TypeError, ValueError):
        return _is_weight(numpy_helper.to_array(t))
    return kind == "f" and int(np.prod(t.dims, dtype=np.int64)) > 1


def _fold_layout(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    ins = [n for n in node.input if n]
    g = onnx.helper.make_graph(
        [node], "fold", [], [onnx.helper.make_tensor_value_info(node.output[0], 0, None)],
        [numpy_helper.from_array(np.asarray(consts[n]), n) for n in ins])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 21)])
    return np.asarray(ReferenceEvaluator(m).run(None, {})[0])


def fold_constant_weights(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """Weights stored as ``Constant`` nodes (Paddle, TF exports) become initializers.

    A float ``Constant`` with more than one element is a weight; so is the output of a
    layout op (Transpose, Reshape …) whose inputs are all constant and one of them a
    weight. Both become initializers under their original tensor names; Constant nodes
    left without consumers are dropped. An ``Identity`` of a weight is taken out, its
    readers reading the weight (torch's exporter reads a weight shared by several layers,
    ALBERT's, through one Identity per use: copied, the layers could be planned at
    weight precisions the one tensor cannot hold). Scalars and integer constants (shapes, axes,
    the attention scale) stay as they are. Returns the new model and what was done.
    """
    inits = {t.name: t for t in proto.graph.initializer}
    consts: dict[str, np.ndarray] = {}  # read from the initializers only where a node needs
    weights = {name for name, t in inits.items() if _is_weight_tensor(t)}

    def known(name: str) -> bool:
        return name in consts or name in inits

    def value(name: str) -> np.ndarray:
        if name not in consts:
            consts[name] = numpy_helper.to_array(inits[name])
        return consts[name]

    promoted: dict[str, np.ndarray] = {}
    kept: list[onnx.NodeProto] = []
    parameters = _parameters_only(proto)
    outputs = {o.name for o in proto.graph.output}
    alias: dict[str, str] = {}  # an Identity's output -> the weight it passes on
    for node in proto.graph.node:
        node = _aliased(node, alias)
        if (node.op_type == "Identity" and len(node.input) == 1 and node.input[0] in weights
                and node.output[0] not in outputs):
            alias[node.output[0]] = node.input[0]  # one weight read twice stays one tensor
            continue
        found = _constant_value(node) if node.op_type == "Constant" and not node.input else None
        if found is not None:
            consts[node.output[0]] = found
            if _is_weight(found) and node.output[0] not in parameters:
                promoted[node.output[0]] = found
                weights.add(node.output[0])
                continue
        elif (node.op_type in _LAYOUT_OPS and len(node.output) == 1
              and all(not i or known(i) for i in node.input)
              and any(i in weights for i in node.input)):
            folded = _fold_layout(node, {i: value(i) for i in node.input if i})
            consts[node.output[0]] = folded
            promoted[node.output[0]] = folded
            weights.add(node.output[0])
            continue
        kept.append(node)
    if not promoted and not alias:
        return proto, ()
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    used = {i for n in kept for i in n.input} | {o.name for o in graph.output}
    live = [n for n in kept if n.op_type != "Constant" or any(o in used for o in n.output)]
    del graph.node[:]
    graph.node.extend(live)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in promoted.items())
    infos = [v for v in graph.value_info if v.name not in alias]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    notes = []
    if promoted:
        notes.append(f"{len(promoted)} weight tensor(s) stored as Constant nodes (or layout "
                     "ops on them) were made initializers, so they are quantized as weights")
    if alias:
        notes.append(f"{len(alias)} Identity node(s) of a weight (an exporter's way to read "
                     "one weight in several layers, e.g. ALBERT's shared layer) taken out: "
                     "their readers read the weight itself, one tensor with one encoding "
                     "(plan.shared_weight keeps the layers sharing it at one weight "
                     "precision)")
    return out, tuple(notes)


def _aliased(node: onnx.NodeProto, alias: dict[str, str]) -> onnx.NodeProto:
    """``node`` reading each aliased input's weight (a copy only when one is aliased)."""
    if not alias or not any(i in alias for i in node.input):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.input[:] = [alias.get(i, i) for i in node.input]
    return copy


def upgrade_opset(proto: onnx.ModelProto, target: int = MIN_QDQ16_OPSET) -> onnx.ModelProto:
    """Raise the default-domain opset to ``target`` (needed for 16-bit Q/DQ)."""
    if _default_opset(proto) >= target:
        return proto
    # the converter keeps an opset < 13 Softmax over the last axis one Softmax only when it
    # knows the input's rank
    ranked = rank_softmax_inputs(proto, _default_opset(proto), target)
    try:
        converted = weightless.convert_version(ranked, target)
    except Exception as exc:
        raise QuantscopeError(
            f"cannot raise the model's opset from {_default_opset(proto)} to {target} "
            f"for 16-bit Q/DQ ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}): "
            "re-export the model at opset >= 21"
        ) from None
    # the converter drops nothing we rely on, but keep node names as they were
    for src, dst in zip(proto.graph.node, converted.graph.node, strict=False):
        if src.op_type == dst.op_type and not dst.name:
            dst.name = src.name
    return converted


def drop_initializer_inputs(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """Initializers also listed as graph inputs (exporters before IR 4 wrote every weight
    so) are taken off the inputs, with a note: quantscope never feeds them (they are the
    model's weights, quantized as such), and a graph it writes listing them would ask a
    compiler for inputs the device is never given. ``proto`` itself when there are none
    (after :func:`upgrade_opset`: IR >= 4, where an initializer needs no input entry)."""
    inits = {t.name for t in proto.graph.initializer}
    listed = [i.name for i in proto.graph.input if i.name in inits]
    if not listed:
        return proto, ()
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    kept = [i for i in out.graph.input if i.name not in inits]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    return out, (f"{len(listed)} initializer(s) were also listed as graph inputs (an older "
                 f"exporter's form, e.g. {listed[0]!r}): they are weights here, and the graphs "
                 "quantscope writes list only the inputs the model is fed",)


def fuse_spelt_rms_norms(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """RMSNorms an exporter spelt out (a T5 encoder's ``Pow/ReduceMean/Add/Sqrt/Div/Mul``)
    made one ``RMSNormalization`` each, as :mod:`quantscope.model.hf_phases` does for a
    decoder (:mod:`quantscope.model.fuse_rmsnorm`; the model at opset 23 then): one norm is
    one decision group, not five groups no compiler names. The function is unchanged (FP32
    up to rounding). The model as given, and no note, when it has none."""
    pows = {n.output[0] for n in proto.graph.node if n.op_type == "Pow"}
    if not any(n.op_type == "ReduceMean" and n.input and n.input[0] in pows
               for n in proto.graph.node):
        return proto, ()
    light, casts = drop_noop_casts(proto)
    _, found = fuse_rms_norms(light)  # a dry run at the model's opset: any to fuse?
    if not found:
        return proto, ()
    fused, n = fuse_rms_norms(upgrade_opset(light, RMS_OPSET))
    dropped = f" (and {casts} Cast(s) of float32 to float32 dropped)" if casts else ""
    return fused, (f"{n} RMSNorm(s) spelt out in elementwise ops (Pow, ReduceMean, Sqrt, "
                   f"Div, Mul) fused into one RMSNormalization each{dropped}: each norm is "
                   "one decision group",)


def load_proto(proto: onnx.ModelProto, source: str = "<memory>") -> Model:
    """Validate, name, upgrade and shape-infer an in-memory model."""
    refuse_prequantized(proto, source)  # before the contrib ops a QOperator model has
    refuse_foreign_ops(proto, source)
    refuse_unknown_ops(proto, source)
    refuse_batch_first_recurrent(proto, source)
    proto, moved = sort_nodes(proto)  # ONNX Runtime runs an unsorted graph: so do we
    proto, negative = name_negative_dims(proto)  # a -1 dim is any size, as ORT reads it
    moved = (*moved, *negative)
    _refuse_shapeless_io(proto, source)
    try:
        weightless.check_model(proto)  # as onnx.checker.check_model, no weight copied
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0][:160]
        raise QuantscopeError(
            f"model '{source}' fails the ONNX checker ({first}): fix or re-export it"
        ) from None
    proto, widened = widen_float16(proto)
    proto = name_nodes(proto)
    proto, notes = fold_constant_weights(proto)
    proto, guards = drop_softmax_nan_guards(proto)
    notes = (*moved, *widened, *notes, *guards)
    proto = upgrade_opset(proto)
    proto, listed = drop_initializer_inputs(proto)
    proto, norms = fuse_spelt_rms_norms(proto)
    notes = (*notes, *listed, *norms)
    proto = name_nodes(proto)
    try:
        proto = weightless.infer_shapes(proto)
    except Exception as exc:
        raise QuantscopeError(
            f"shape inference failed on '{source}' ({type(exc).__name__}): "
            "check the model with onnx.checker and re-export it"
        ) from None
    model = Model(proto=proto, source=source, notes=notes)
    _refuse_empty_outputs(model)
    return model


def _refuse_shapeless_io(proto: onnx.ModelProto, source: str) -> None:
    """A graph input or output with no shape, not even a rank (tf2onnx ``--tfjs`` writes
    the inputs a TFJS signature leaves unknown so: Robust Video Matting's recurrent states
    ``r1i:0`` ... and ``downsample_ratio:0``), which the ONNX checker refuses without
    naming it: named here, with the fix."""
    shapeless = [v.name for v in (*proto.graph.input, *proto.graph.output)
                 if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    if shapeless:
        names = ", ".join(repr(n) for n in shapeless[:6]) + (
            f" and {len(shapeless) - 6} more" if len(shapeless) > 6 else "")
        raise QuantscopeError(
            f"model '{source}' gives {names} no shape, not even a rank (ONNX requires one on "
            "a graph input or output): set each one's shape in the export (tf2onnx: "
            "--inputs NAME[d,d,...]; a scalar, which tf2onnx leaves without one: "
            "value_info.type.tensor_type.shape.SetInParent() in the ONNX file)")


def _refuse_empty_outputs(model: Model) -> None:
    """An output with a dimension of size 0 (``[N, 0]``) holds no value for any sample:
    nothing to quantize, score or compare, and every figure of it would be invented."""
    shapes = model.value_shapes()
    for name in model.output_names():
        dims = shapes.get(name) or ()
        if 0 in dims:
            raise QuantscopeError(
                f"model '{model.source}' output {name!r} has shape "
                f"[{', '.join(str(d) for d in dims)}]: no value for any sample to measure; "
                "remove it from the graph's outputs and re-export")


def with_initializers(model: Model, arrays: dict[str, np.ndarray], what: str) -> Model:
    """``model`` with the initializers named in ``arrays`` replaced, in place (no second
    copy of the weights); its source says ``what`` changed them, so runners build from the
    graph, not from the file. A name the graph lacks is one clear error."""
    missing = set(arrays)
    for t in model.graph.initializer:
        if t.name in arrays:
            t.CopyFrom(numpy_helper.from_array(arrays[t.name], t.name))
            missing.discard(t.name)
    if missing:
        raise QuantscopeError(f"{what}: no initializer '{sorted(missing)[0]}' in "
                              f"{model.source}: the weights are another model's")
    return Model(proto=model.proto, source=f"{model.source} + {what}")


def load(path: str | Path) -> Model:
    """Load an ONNX model from a path (built-in names are resolved by the CLI/API)."""
    path = Path(path)
    return load_proto(_read(path), source=str(path))
