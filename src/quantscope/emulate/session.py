"""ONNX Runtime sessions: the only executor quantscope uses.

Emulation sessions run with graph optimizations OFF so that ORT does not fold
QuantizeLinear/DequantizeLinear pairs into its own integer kernels: every Q/DQ node runs
as written, which reproduces the target's quantization grid in float arithmetic.

An emulation session runs the *emulation form* of the graph it is handed
(:func:`emulation_form`): every DequantizeLinear whose inputs are all constants (the
weights) is replaced by the float initializer it computes, computed once by ONNX Runtime
itself, so the values are the ones the node would produce on every run. Only what runs
changes: the graph handed over (the one exported) keeps its Q/DQ weights, and its outputs
equal the emulation form's bit for bit (tests/test_one_graph.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from quantscope.model.weightless import append_copies, copy_fields
from quantscope.threads import default_threads
from quantscope.types import QuantscopeError

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]
_SHARED_ARENA: list[bool] = []


# Tensors this large are mapped and unmapped by glibc's malloc on their own (its mmap
# threshold is at most 32 MiB), so without an arena their memory goes back to the system
# after its last use, while an arena keeps every run's peak. Measured: IS-Net at
# 1024 x 1024 (feature maps of 64-268 MB) peaked 1.0 GB lower in its analysis without
# the sweep's arena; minilm-l6 at 256 tokens and 32 rows (attention scores of 100 MB,
# most tensors 12-50 MB) 0.3 GB higher (glibc's heap keeps the smaller ones).
LARGE_TENSOR_BYTES = 128 * 2**20


def use_arena(largest_tensor: int) -> bool:
    """Whether sessions of a model whose largest activation has ``largest_tensor`` bytes
    (at the batch run) allocate from an arena (:data:`LARGE_TENSOR_BYTES`)."""
    return largest_tensor < LARGE_TENSOR_BYTES


def providers() -> list[str]:
    """CUDA when this ORT build and machine have it, else CPU."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def make_session(
    proto: onnx.ModelProto | Path,
    *,
    optimize: bool = False,
    integer_kernels: bool = False,
    arena: bool = True,
    shared_arena: bool = False,
    threads: int = 0,
) -> ort.InferenceSession:
    """A session. Emulation sessions (``optimize`` and ``integer_kernels`` off, the
    default) run :func:`emulation_form` of ``proto``; ``integer_kernels`` turns on every
    ORT optimization, which fuses QDQ groups into ORT's integer kernels (used only to
    measure the emulator against them).

    ``shared_arena``: for holding hundreds of sessions at once (sensitivity sweeps), same
    numerics. Every such session allocates from one process-wide CPU arena (a
    per-session arena would keep its peak batch allocated for the session's life), and
    thread pools do not spin after a run (idle sessions would steal the running one's
    cores). With ``arena`` off too, such a session has no arena at all (a model of
    :data:`LARGE_TENSOR_BYTES` tensors: :func:`use_arena`).

    ``threads``: intra-op threads (0: ``$QUANTSCOPE_THREADS``, else ONNX Runtime's
    default, one per core); the numbers do not depend on it.
    """
    # ORT's process-wide logger, not the session's, warns while it reads a model (a
    # tf2onnx Resize's `tf_half_pixel_for_nn` "is deprecated since opset 13", in colour, on
    # every session of every stage): errors only, as the sessions themselves
    ort.set_default_logger_severity(3)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or default_threads()
    level = ort.GraphOptimizationLevel
    opts.graph_optimization_level = (
        level.ORT_ENABLE_ALL if integer_kernels
        else level.ORT_ENABLE_BASIC if optimize else level.ORT_DISABLE_ALL
    )
    opts.log_severity_level = 4  # a failing run is raised, and said in one line: not logged too
    opts.enable_cpu_mem_arena = arena  # off: memory goes back after each run (calibration)
    if shared_arena:
        if arena:
            _register_shared_arena()
            opts.add_session_config_entry("session.use_env_allocators", "1")
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    data: str | bytes
    weights: list[ort.OrtValue] = []
    if isinstance(proto, Path):  # a file path: ORT reads it, weights held once
        data = str(proto)
    elif not (optimize or integer_kernels):
        # the form's large weights handed over in place, the rest serialized (the form is
        # dropped then: one copy of the weights less while ORT loads)
        data, names, weights = external_weights(*emulation_parts(proto))
        if names:
            opts.add_external_initializers(names, weights)
        opts.add_session_config_entry("session.disable_prepacking", "1")
    else:
        data = proto.SerializeToString()
    try:
        session = ort.InferenceSession(data, sess_options=opts, providers=providers())
    except Exception as exc:  # ORT raises its own exception types
        msg = str(exc).strip().splitlines()[0][:200]
        raise QuantscopeError(
            f"ONNX Runtime cannot run this model ({msg}): check that every op is supported "
            "by onnxruntime on this machine"
        ) from None
    # ORT runs with the handed-over buffers themselves: they live as long as the session
    session._quantscope_weights = weights  # type: ignore[attr-defined]
    return session


EXTERNAL_BYTES = 64 * 2**10
"""Initializers at least this large are handed to ONNX Runtime as buffers
(:func:`external_weights`) instead of serialized into the model's bytes."""


_T = onnx.TensorProto
# NumPy holds these as ONNX Runtime does (not packed 4-bit, bfloat16 or 8-bit floats)
_PLAIN_TYPES = frozenset({_T.FLOAT, _T.FLOAT16, _T.DOUBLE, _T.INT8, _T.UINT8, _T.INT16,
                          _T.UINT16, _T.INT32, _T.UINT32, _T.INT64, _T.UINT64, _T.BOOL})


def external_weights(proto: onnx.ModelProto, arrays: dict[str, np.ndarray] | None = None,
                     ) -> tuple[bytes, list[str], list[ort.OrtValue]]:
    """``proto`` serialized without the data of its large main-graph initializers (at least
    :data:`EXTERNAL_BYTES`, there marked external), and those initializers as ONNX Runtime
    values over NumPy arrays, for ``SessionOptions.add_external_initializers``: ORT runs
    with the arrays themselves. ``arrays``: initializers ``proto`` lacks, given as arrays
    (:func:`emulation_parts`' folded weights), added the same way.

    Serializing every weight into the model's bytes and ORT parsing them back copied them
    twice per session, into freshly faulted pages: a minilm-l3 session took 0.65 s to build
    that way and 0.12 s this way (the outputs bit-identical, tests/test_one_graph.py).
    Initializers that are also graph inputs (a feed may replace them), those already
    external, a subgraph's and those of packed or unusual types stay as they are."""
    graph = proto.graph
    inputs = {i.name for i in graph.input}
    big = [t for t in graph.initializer if t.name not in inputs and not t.external_data
           and t.data_type in _PLAIN_TYPES and _nbytes(t) >= EXTERNAL_BYTES]
    arrays = arrays or {}
    if not big and not arrays:
        return proto.SerializeToString(), [], []
    moved = {t.name for t in big}
    skeleton = onnx.ModelProto()
    copy_fields(proto, skeleton, skip=("graph",))
    copy_fields(graph, skeleton.graph, skip=("initializer",))
    for t in graph.initializer:
        if t.name not in moved:
            skeleton.graph.initializer.append(t)
            continue
        _stub(skeleton.graph, t.name, t.data_type, t.dims)
    handed = {t.name: numpy_helper.to_array(t) for t in big}
    for name, value in arrays.items():
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        if value.nbytes >= EXTERNAL_BYTES and elem in _PLAIN_TYPES:
            _stub(skeleton.graph, name, elem, value.shape)
            handed[name] = value
        else:
            skeleton.graph.initializer.append(numpy_helper.from_array(value, name))
    values = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))
              for v in handed.values()]
    return skeleton.SerializeToString(), list(handed), values


def _nbytes(t: onnx.TensorProto) -> int:
    """The bytes of a plain-typed initializer's values, from its shape (``ByteSize`` costs a
    walk of the message: 4.7 s over minilm-l3's run)."""
    return int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(
        t.data_type).itemsize


def _stub(graph: onnx.GraphProto, name: str, elem: int, dims: object) -> None:
    """An initializer ``name`` declared with its type and shape, its data external."""
    stub = graph.initializer.add()
    stub.name, stub.data_type = name, elem
    stub.dims.extend(dims)  # type: ignore[call-overload]
    stub.data_location = onnx.TensorProto.EXTERNAL
    entry = stub.external_data.add()
    entry.key, entry.value = "location", "quantscope-memory"


def _constant_dq(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """DequantizeLinear nodes that read constants only (weights) and write no graph output."""
    inits = {t.name for t in graph.initializer} - {i.name for i in graph.input}
    outputs = {o.name for o in graph.output}
    return [n for n in graph.node if n.op_type == "DequantizeLinear"
            and all(not i or i in inits for i in n.input) and n.output[0] not in outputs]


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """Every name read by a node of a subgraph (If/Loop bodies) of ``graph``, recursively."""
    names: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                names |= {i for n in sub.node for i in n.input} | _subgraph_reads(sub)
    return names


def _dequantized(proto: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> list[np.ndarray]:
    """The outputs of ``nodes`` (constant DequantizeLinear) as ONNX Runtime computes them."""
    needed = {i for n in nodes for i in n.input if i}
    types = {t.name: t.data_type for t in proto.graph.initializer}
    graph = helper.make_graph(
        nodes, "dequantize_weights", [],
        [helper.make_tensor_value_info(n.output[0], types[n.input[1]], None) for n in nodes],
        [t for t in proto.graph.initializer if t.name in needed])
    small = helper.make_model(graph, opset_imports=proto.opset_import,
                              ir_version=proto.ir_version)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = default_threads()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    sess = ort.InferenceSession(small.SerializeToString(), sess_options=opts,
                                providers=providers())
    return sess.run(None, {})


def emulation_form(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its constant DequantizeLinear nodes (the weights) folded into the
    float initializers ONNX Runtime computes for them: the same outputs, bit for bit,
    without dequantizing every weight on every run. A graph without any is returned as is
    (so is one whose weights ORT cannot dequantize alone: the graph then runs as written)."""
    form, folded = emulation_parts(proto)
    if not folded:
        return form
    append_copies(form.graph.initializer, (numpy_helper.from_array(v, name)
                                           for name, v in folded.items()))
    return form


def emulation_parts(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """:func:`emulation_form` in two parts: the form without the folded weights'
    initializers, and those weights as ORT computed them (by name; empty, and ``proto``
    itself, when nothing is folded). A session takes the arrays as they are
    (:func:`external_weights`), never copied into a proto and out again."""
    graph = proto.graph
    nodes = _constant_dq(graph)
    if not nodes:
        return proto, {}
    try:
        values = _dequantized(proto, nodes)
    except Exception:  # ORT raises its own exception types
        return proto, {}
    folded = {n.output[0] for n in nodes}
    kept = [n for n in graph.node if not (n.op_type == "DequantizeLinear"
                                          and n.output[0] in folded)]
    used = {i for n in kept for i in n.input} | _subgraph_reads(graph)
    used |= {o.name for o in graph.output} | {i.name for i in graph.input}
    out = onnx.ModelProto()
    copy_fields(proto, out, skip=("graph",))
    copy_fields(graph, out.graph, skip=("node", "initializer"))
    out.graph.node.extend(kept)
    append_copies(out.graph.initializer, (t for t in graph.initializer if t.name in used))
    return out, {n.output[0]: v for n, v in zip(nodes, values, strict=True)}


def _register_shared_arena() -> None:
    """Register one process-wide CPU arena (once) for ``shared_arena`` sessions."""
    if not _SHARED_ARENA:
        info = ort.OrtMemoryInfo(
            "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
        )
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
        _SHARED_ARENA.append(True)


_SHRINKER: list[ort.InferenceSession] = []


def shrink_shared_arena() -> None:
    """Give the process-wide arena's free chunks back (ONNX Runtime's arena shrinkage,
    asked for on one run of a one-node session of that arena); nothing when no
    ``shared_arena`` session was made. The arena otherwise keeps the largest batch's
    tensors of every sweep and search for the process's life (minilm-l6 at 256 tokens:
    about 250 MB, measured)."""
    if not _SHARED_ARENA:
        return
    if not _SHRINKER:
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
        y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "shrink", [x], [y])
        _SHRINKER.append(make_session(
            helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
            shared_arena=True))
    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    _SHRINKER[0].run(None, {"x": np.zeros(1, np.float32)}, options)


def run_on_data(session: ort.InferenceSession, outputs: list[str] | None,
                feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """``session.run`` of the user's float model on the user's data, where a failure of
    ONNX Runtime inside the graph (a Concat or Reshape whose sizes the export fixed, given
    another picture size) is the data's, said in one line naming the shapes fed."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    try:
        return session.run(outputs, feeds)
    except (state.Fail, state.RuntimeException, state.InvalidArgument) as exc:
        if "bad_alloc" in str(exc) or "Failed to allocate memory" in str(exc):
            raise  # out of memory: the CLI's one line names the node and the fix
        msg = " ".join(str(exc).split())
        msg = msg.split("Status Message:", 1)[-1].strip()
        # ONNX Runtime's source place, function and failed check go: the sentence stays
        msg = re.sub(r"^\S+\.(?:h|cc|cpp):\d+ (?:[\w:~<>]+(?:\([^)]*\))?\s+)?", "", msg)
        msg = re.sub(r"^[^.]* was false\.\s*", "", msg)[:200]
        node = re.search(r"Name:'([^']*)'", str(exc))
        where = f" at node '{node.group(1)}'" if node else ""
        shapes = ", ".join(f"{k} {list(np.shape(v))}" for k, v in feeds.items())
        raise QuantscopeError(
            f"the model fails on the data{where} ({msg}), fed {shapes}: give data at a "
            "size the model was exported for (its graph fixes some sizes inside; "
            "--input-shape sets the size `quantscope images` writes)") from None


def runner(session: ort.InferenceSession, outputs: list[str] | None = None) -> Runner:
    """A plain function ``feeds -> outputs`` over a session (feeds filtered to its inputs)."""
    names = {i.name for i in session.get_inputs()}

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return session.run(outputs, {k: v for k, v in feeds.items() if k in names})

    return run
