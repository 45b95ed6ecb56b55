"""Lookups that stay on the host: a Gather of a large table by an integer model input.

A multilingual encoder's word-embedding table is most of its parameters (XLM-R: 250,002
x 384 = 96 M of 118 M); an NPU compiler expects that lookup outside the compiled graph,
so the host indexes the table with the token ids and feeds the device the rows.

=========================  ===========================================================
a host gather              a ``Gather`` (axis 0) whose data input is a float
                           initializer of at least ``min_rows`` rows and whose indices
                           are an integer model input (directly, or through ``Cast``)
``min_rows``               the target's ``[host_embedding] rows``
                           (:class:`quantscope.targets.profile.HostEmbedding`); 0 or
                           less: no lookup stays on the host
its group                  the decision group anchored at that Gather, with what fuses
                           into it (the position/token-type Adds of some exports): the
                           host computes it; its output is the compiled graph's input,
                           its precision the input's
=========================  ===========================================================

:func:`host_gathers` is the one place this is decided; the cost model, the legality
check, the device I/O rows and the verdict's host steps all read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx

from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.types import Groups

INT_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32,
                       onnx.TensorProto.INT16, onnx.TensorProto.INT8,
                       onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
                       onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})


@dataclass(frozen=True)
class HostGather:
    """One lookup that runs on the host."""

    node: str  # the Gather node
    table: str  # the initializer it reads rows of
    shape: tuple[int, ...]  # the table's shape (rows first)
    dtype: str  # the table's element type, numpy name
    indices: str  # the integer model input that indexes it
    output: str  # the rows looked up: what the device is fed
    # nodes of the compiled graph that read ``indices``' values too (RoBERTa's position
    # ids: ``Equal(input_ids, pad)`` -> ``CumSum``): the device is fed the ids as well
    device_reads: tuple[str, ...] = ()

    @property
    def megabytes(self) -> float:
        """The table's size in MB (10^6 bytes) at its stored type."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize / 1e6

    def describe(self) -> str:
        """``table [rows, width] float32 (46.9 MB), indexed by input_ids``."""
        return (f"{self.table} {list(self.shape)} {self.dtype} ({self.megabytes:,.1f} MB), "
                f"indexed by {self.indices}")

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "table": self.table, "shape": list(self.shape),
                "dtype": self.dtype, "megabytes": round(self.megabytes, 3),
                "indices": self.indices, "output": self.output,
                **({"device_reads": list(self.device_reads)} if self.device_reads else {})}


def host_gathers(model: Model | onnx.ModelProto, min_rows: int) -> tuple[HostGather, ...]:
    """Every Gather the host does (module table), in graph order; none when
    ``min_rows`` is 0 or less (``min_rows`` 1: every table lookup by an input)."""
    if min_rows <= 0:
        return ()
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    int_inputs = {i.name for i in graph.input if i.name not in inits
                  and i.type.tensor_type.elem_type in INT_TYPES}
    casts = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Cast"}
    found = []
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2:
            continue
        table = inits.get(node.input[0])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        source = casts.get(node.input[1], node.input[1])
        if (table is None or table.data_type not in FLOAT_TYPES or axis != 0
                or len(table.dims) < 2 or table.dims[0] < min_rows
                or source not in int_inputs):
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(table.data_type).name
        found.append(HostGather(node.name, table.name, tuple(int(d) for d in table.dims),
                                dtype, source, node.output[0]))
    host = {g.node for g in found}
    return tuple(replace(g, device_reads=_device_reads(graph, g.indices, host))
                 for g in found)


def _device_reads(graph: onnx.GraphProto, indices: str, host: set[str]) -> tuple[str, ...]:
    """The nodes but the host's lookups that read the values of ``indices`` (directly or
    through Casts; a ``Shape`` reads only its shape, fixed at the compiled length)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    out: list[str] = []
    todo, seen = [indices], {indices}
    while todo:
        t = todo.pop()
        for n in readers.get(t, []):
            if n.name in host or n.op_type == "Shape":
                continue
            if n.op_type == "Cast" and n.output[0] not in seen:
                seen.add(n.output[0])
                todo.append(n.output[0])
                continue
            out.append(n.name)
    return tuple(dict.fromkeys(out))


def host_groups(groups: Groups, gathers: tuple[HostGather, ...]) -> frozenset[str]:
    """The decision groups anchored at a host gather (their work is the host's: the
    lookup, and the elementwise ops fused into it, e.g. the position and token-type rows
    some exports add in the same group)."""
    nodes = {g.node for g in gathers}
    return frozenset(g.name for g in groups.groups if g.nodes and g.nodes[0] in nodes)
