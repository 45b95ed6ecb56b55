"""Tensor shapes for legality rules and costs.

ONNX shape inference leaves a dim unknown when a Reshape's target is computed at run time
(Shape/Gather/Concat: the head count of every Hugging Face attention export), and an
unknown dim counts as 1 in the cost model (attention would cost one head's MACs). With
concrete input shapes, onnxruntime's symbolic shape inference (pure Python, it folds
those shape computations) fills in the dims ONNX left unknown. When both stop (pads or
sizes computed through float math: ``Cast``, ``Div``, ``Ceil`` on ``Shape(x)``), and
every input's shape is concrete, one ONNX Runtime run on a synthetic sample at those
shapes (floats uniform in [0, 1), integers 0, booleans true) gives the shapes of the
tensors still unknown; :func:`sampled_tensors` / :func:`shape_note` say which (a shape
that depends on the data, e.g. after ``NonZero``, is then that sample's).

==================  ==============================================================
``seq_len_shapes``  concrete ``[batch, seq]`` shapes for the rank-2 token inputs of a
                    model with symbolic dims (``--seq-len N``)
``given_shapes``    ``--seq-len`` and ``--input-shape NAME=1x3x224x224`` together (the
                    latter override; image models with symbolic H/W need them)
``resolve_shapes``  tensor name -> shape, with given input shapes propagated through
                    the graph by ONNX shape inference (cached per model and inputs)
``shape_note``      the sentence that says which shapes came from a sample run
``frame_values``    values per frame: the product of the dims after the batch dim
                    (rank >= 2); an unknown dim makes it ``None``, or counts as
                    ``unknown`` when that is given (the cost model counts per position)
``group_edges``     (producer group, consumer group, tensor) for every tensor passed
                    between groups: where precision boundaries can be
==================  ==============================================================
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import onnx
from onnx import shape_inference

from quantscope.model.load import Model
from quantscope.model.symbolic import symbolic_proto
from quantscope.model.weightless import KEEP_VALUES  # noqa: F401 - also read as shapes.KEEP_VALUES
from quantscope.threads import default_threads
from quantscope.types import MAX_SEQ_LEN, Groups, QuantscopeError

Shape = tuple[int | str | None, ...]
Shapes = dict[str, tuple[int, ...]]  # concrete shapes given by the user, by tensor name


def seq_len_shapes(model: Model, seq_len: int, *, batch: int = 1) -> Shapes:
    """Concrete shapes for rank-2 token inputs (``[batch, seq]``) with symbolic dims."""
    out: Shapes = {}
    shapes = model.value_shapes()
    for name in model.input_names():
        if len(shapes.get(name, ())) == 2:
            out[name] = (batch, seq_len)
    if not out:
        raise QuantscopeError("--seq-len given but the model has no rank-2 token input")
    return out


def parse_input_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` -> (``NAME``, (1, 3, 224, 224))."""
    name, sep, dims = spec.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or min(shape) < 1:
        raise QuantscopeError(
            f"input shape '{spec}' is not NAME=DxDx… with positive dims "
            "(e.g. pixel_values=1x3x224x224)")
    return name, shape


def token_inputs(model: Model) -> set[str]:
    """The integer inputs (token ids, their masks): a rank-2 one's dim 1 is a length in
    tokens (:data:`quantscope.types.MAX_SEQ_LEN` at most)."""
    return {i.name for i in model.graph.input if i.type.tensor_type.elem_type in (
        onnx.TensorProto.INT64, onnx.TensorProto.INT32)}


def given_shapes(
    model: Model, seq_len: int | None = None,
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
) -> Shapes | None:
    """Concrete input shapes from ``--seq-len`` and ``--input-shape`` (None if neither)."""
    out: Shapes = dict(seq_len_shapes(model, seq_len)) if seq_len else {}
    inputs = set(model.input_names())
    declared = model.value_shapes()
    tokens = token_inputs(model)
    seen: set[str] = set()
    for name, shape in input_shapes:
        if name not in inputs:
            raise QuantscopeError(f"--input-shape names '{name}', which is no model input "
                                  f"(inputs: {', '.join(sorted(inputs))})")
        if name in seen:
            raise QuantscopeError(f"--input-shape names '{name}' twice: give each input's "
                                  "shape once")
        seen.add(name)
        _agrees(name, shape, declared.get(name))
        if len(shape) == 2 and name in tokens and shape[1] > MAX_SEQ_LEN:  # as --seq-len
            raise QuantscopeError(
                f"--input-shape {name}={shape[0]}x{shape[1]}: {shape[1]} tokens is longer "
                f"than quantscope runs a model at ({MAX_SEQ_LEN}): give the deployment's "
                "sequence length")
        out[name] = shape
    return out or None


def _agrees(name: str, shape: tuple[int, ...], declared: Shape | None) -> None:
    """A given shape must have the input's rank and keep its fixed dims."""
    if declared is None:
        return
    given = "x".join(map(str, shape))
    if len(shape) != len(declared):
        raise QuantscopeError(
            f"--input-shape {name}={given} has rank {len(shape)}, the model's input '{name}' "
            f"is {list(declared)} (rank {len(declared)}): give {len(declared)} dims")
    for i, (g, d) in enumerate(zip(shape, declared, strict=True)):
        if isinstance(d, int) and d > 0 and g != d:
            raise QuantscopeError(
                f"--input-shape {name}={given}: dim {i} is {g}, but the model fixes it at {d} "
                f"({name} is {list(declared)}): give {d} there")


_CACHE: weakref.WeakKeyDictionary[Model, dict[tuple, dict[str, Shape]]] = (
    weakref.WeakKeyDictionary())
# per model and given input shapes: the tensors whose shapes came from a sample run
_SAMPLED: weakref.WeakKeyDictionary[Model, dict[tuple, tuple[str, ...]]] = (
    weakref.WeakKeyDictionary())


def _stripped(model: Model) -> onnx.ModelProto:
    """The graph without its large initializers' data: each becomes a typed graph input of
    its shape, so shape inference sees the same types and shapes without copying weights
    (a 650 MB decoder would otherwise be copied whole)."""
    src = model.proto
    proto = onnx.ModelProto(ir_version=src.ir_version, producer_name=src.producer_name)
    proto.opset_import.extend(src.opset_import)
    proto.functions.extend(src.functions)
    g, sg = proto.graph, src.graph
    g.name = sg.name
    g.node.extend(sg.node)
    g.input.extend(sg.input)
    g.output.extend(sg.output)
    declared = {i.name for i in sg.input}
    for t in sg.initializer:
        if math.prod(t.dims) <= KEEP_VALUES and t.data_location != onnx.TensorProto.EXTERNAL:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    return proto


def _infer(model: Model, inputs: tuple[tuple[str, tuple[int, ...]], ...]) -> dict[str, Shape]:
    """Shapes with the given input shapes, cached while ``model`` is alive (not longer)."""
    cached = _CACHE.setdefault(model, {})
    if inputs not in cached:
        out = _infer_stripped(model, inputs)
        missing = _unresolved(model, out)
        sampled = _sample_shapes(model, dict(inputs), missing) if missing else {}
        out.update(sampled)
        _SAMPLED.setdefault(model, {})[inputs] = tuple(t for t in missing if t in sampled)
        cached[inputs] = out
    return cached[inputs]


def _concrete(shape: Shape | None) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _unresolved(model: Model, shapes: dict[str, Shape]) -> list[str]:
    """Node outputs whose shape inference left a dim unknown (or no shape at all)."""
    return [t for n in model.graph.node for t in n.output
            if t and not _concrete(shapes.get(t))]


def _sample_shapes(model: Model, given: dict[str, tuple[int, ...]], names: list[str]
                   ) -> dict[str, Shape]:
    """Shapes of ``names`` from one ORT run on a synthetic sample at the input shapes
    (empty when an input's shape is not concrete or the run fails)."""
    known = model.value_shapes()
    types = model.value_types()
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for name in model.input_names():
        shape = given.get(name, known.get(name))
        if not _concrete(shape):
            return {}
        dtype = onnx.helper.tensor_dtype_to_np_dtype(types.get(name, onnx.TensorProto.FLOAT))
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.random(shape).astype(dtype)  # type: ignore[arg-type]
        elif dtype == np.bool_:
            feeds[name] = np.ones(shape, dtype)  # type: ignore[arg-type]
        else:
            feeds[name] = np.zeros(shape, dtype)  # type: ignore[arg-type]
    # the model's own graph, its outputs extended while it is serialized (no copy of the
    # weights besides the bytes ONNX Runtime reads), restored before anything else runs
    graph = model.proto.graph
    n_out, outputs = len(graph.output), {o.name for o in graph.output}
    graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in outputs)
    try:
        data = model.proto.SerializeToString()
    finally:
        del graph.output[n_out:]
    try:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = default_threads()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.enable_cpu_mem_arena = False  # its activations go back after the one run
        opts.add_session_config_entry("session.disable_prepacking", "1")  # no weight copy
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        del data
        wanted = [o.name for o in sess.get_outputs() if o.name in set(names)]
        got = sess.run(wanted, feeds)
    except Exception:  # noqa: BLE001 - any failure: the shapes stay unknown (and say so)
        return {}
    return {t: tuple(int(d) for d in np.shape(v)) for t, v in zip(wanted, got, strict=True)}


def sampled_tensors(model: Model, shapes: Shapes | None = None) -> tuple[str, ...]:
    """The tensors whose shapes :func:`resolve_shapes` took from a sample run."""
    inputs = _input_key(model, shapes or {})
    if not inputs:
        return ()
    _infer(model, inputs)
    return _SAMPLED.get(model, {}).get(inputs, ())


def shape_note(model: Model, shapes: Shapes | None = None) -> str | None:
    """One sentence: which shapes came from a sample run, at which input shapes (None:
    none did)."""
    sampled = sampled_tensors(model, shapes)
    if not sampled:
        return None
    at = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in _input_key(model, shapes or {}))
    first = next(n for n in model.graph.node if sampled[0] in n.output)
    return (f"shapes of {len(sampled)} tensor(s) (from {first.op_type} '{first.name}' on) "
            f"came from one ONNX Runtime run on a synthetic sample at {at}: shape inference "
            "could not compute them")


def _input_key(model: Model, shapes: Shapes) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((k, tuple(v)) for k, v in shapes.items() if k in model.input_names()))


def _infer_stripped(model: Model, inputs: tuple[tuple[str, tuple[int, ...]], ...]
                    ) -> dict[str, Shape]:
    proto = _stripped(model)
    given = dict(inputs)
    for vi in proto.graph.input:
        if vi.name not in given:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims) != len(given[vi.name]):
            raise QuantscopeError(
                f"shape {list(given[vi.name])} for input '{vi.name}' has rank "
                f"{len(given[vi.name])}, the model's input has rank {len(dims)}"
            )
        for d, v in zip(dims, given[vi.name], strict=True):
            d.ClearField("dim_param")
            d.dim_value = int(v)
    stripped = proto
    proto = shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    weights = {t.name for t in model.graph.initializer}
    out = {k: v for k, v in Model(proto=proto, source=model.source).value_shapes().items()
           if k not in weights or k in model.input_names()}
    if given and any(not all(isinstance(d, int) for d in v) for v in out.values()):
        for k, v in _symbolic(stripped, model.source).items():
            if k in weights and k not in model.input_names():
                continue
            old = out.get(k)
            if old is None:
                out[k] = v
            elif len(old) == len(v):  # per dim: a known dim wins
                out[k] = tuple(d if isinstance(d, int) or not isinstance(e, int) else e
                               for d, e in zip(old, v, strict=True))
    return out


def _symbolic(proto: onnx.ModelProto, source: str | None) -> dict[str, Shape]:
    """Shapes from onnxruntime's symbolic shape inference (empty when it cannot run on
    this graph: the ONNX shapes stand)."""
    inferred = symbolic_proto(proto)
    return {} if inferred is None else Model(proto=inferred, source=source).value_shapes()


def resolve_shapes(model: Model, shapes: Shapes | None = None) -> dict[str, Shape]:
    """Tensor name -> shape, with the given input shapes propagated through the graph."""
    shapes = shapes or {}
    known = model.value_shapes()
    unknown = [k for k in shapes if k not in known]
    if unknown:
        raise QuantscopeError(f"shape given for '{unknown[0]}', which is no tensor of the model")
    inputs = _input_key(model, shapes)
    resolved = dict(_infer(model, inputs)) if inputs else dict(known)
    for k, v in shapes.items():
        resolved[k] = tuple(v)
    return resolved


def frame_values(shape: Shape | None, *, unknown: int | None = None) -> int | None:
    """Values per frame (batch dim excluded for rank >= 2).

    A dim that is not a positive int (symbolic, missing) is unknown: the result is
    ``None``, or the dim counts as ``unknown`` when given (then a missing shape is
    ``unknown`` values too).
    """
    if shape is None:
        return unknown
    dims = shape[1:] if len(shape) >= 2 else shape
    known = [d if isinstance(d, int) and d > 0 else unknown for d in dims]
    if any(d is None for d in known):
        return None
    return math.prod(known)  # type: ignore[arg-type]


def group_edges(groups: Groups) -> tuple[tuple[str, str, str], ...]:
    """(producer group, consumer group, tensor) for every tensor passed between groups."""
    root = {t: chain[0] for chain in groups.shared for t in chain[1:]}
    producer = {t: g.name for g in groups.groups for t in g.outputs}
    edges = []
    for g in groups.groups:
        for t in g.inputs:
            src = producer.get(root.get(t, t))
            if src is not None and src != g.name:
                edges.append((src, g.name, root.get(t, t)))
    return tuple(dict.fromkeys(edges))
