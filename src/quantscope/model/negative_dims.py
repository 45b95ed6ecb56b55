"""Dims declared ``-1``: an exporter's way (Paddle2ONNX's ``[-1, 3, ?, ?]``) to say "any
size". ONNX Runtime reads a negative dim as dynamic and runs any batch; read as a fixed
size it made every batch of data refused ("axis 0 is 48, the model's -1: pad or crop").
Each is renamed to a symbolic dim of its own (``x_dim0``), with a note; nothing else
changes."""

from __future__ import annotations

import onnx


def name_negative_dims(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """``proto`` with every negative dim of its inputs, outputs and value_info made the
    symbolic dim ``<tensor>_dim<axis>``, and a note naming them (``proto`` itself, no
    note, when there is none)."""
    def negative(vi: onnx.ValueInfoProto) -> list[int]:
        dims = vi.type.tensor_type.shape.dim
        return [k for k, d in enumerate(dims) if d.HasField("dim_value") and d.dim_value < 0]

    graph = proto.graph
    if not any(negative(v) for v in [*graph.input, *graph.output, *graph.value_info]):
        return proto, ()
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    named = []
    for vi in [*out.graph.input, *out.graph.output, *out.graph.value_info]:
        for k in negative(vi):
            dim = vi.type.tensor_type.shape.dim[k]
            dim.Clear()
            dim.dim_param = f"{vi.name}_dim{k}"
            if len(named) < 3:
                named.append(f"'{vi.name}' axis {k}")
    more = ", …" if sum(len(negative(v)) for v in [*graph.input, *graph.output,
                                                     *graph.value_info]) > 3 else ""
    return out, (f"dims declared -1 (any size, as ONNX Runtime reads them) read as symbolic: "
                 f"{', '.join(named)}{more}",)
