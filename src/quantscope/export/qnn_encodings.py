"""Plan + Encodings -> QNN / AIMET encodings JSON (format 1.0.0 and legacy 0.6.1).

Translation of one tensor's encoding (ONNX ``q = clip(round(x/scale) + zero_point)``)
into AIMET's unsigned-domain convention ``x = (q_u + offset) * scale``:

=====================  =====================================================
unsigned storage       ``offset = -zero_point``
signed storage         stored as unsigned ``q_u = q + 2**(bits-1)``, so
                       ``offset = -(zero_point + 2**(bits-1))`` (int8 sym: -128)
min / max (0.6.1)      ``offset * scale`` / ``(2**bits - 1 + offset) * scale``
is_symmetric           the grid's own: AIMET's symmetric encoding is centred on 0,
                       ``offset = -2**(bits-1)`` on every channel (int8 sym: -128);
                       an asymmetric uint8 activation (offset -zero_point) is not
quantizer_args         AIMET's ``is_symmetric`` there is the weights' default (its
                       config's ``defaults.params``): true when every weight encoding
                       written is symmetric; ``per_channel_quantization`` the scheme's
float groups           ``dtype float``, ``bitwidth 16``, no scale (FP16 on HTP)
=====================  =====================================================

0.6.1 (what ``qnn-onnx-converter --quantization_overrides`` reads) maps tensor name ->
list of encodings (one per channel); 1.0.0 holds lists of named entries with arrays.
Tensors exported: each group's outputs (and the pass-through tensors sharing their
encoding), model inputs, and each weight; biases are left to the converter (int32).
A tensor inside a group (made by one of its nodes, not one of its outputs: a Conv's
output before its fused Relu, a decomposed norm's steps) gets none: the emulation keeps it
float, the group's wide accumulator, and there is no grid to write. The converter then
picks its own for each that it does not fuse away (from its calibration), so the
emulation does not cover those: :func:`unencoded_tensors` lists them, and ``export`` and
the run's verdict say so (:func:`unencoded_line`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from quantscope.types import Encoding, Encodings, Groups, Plan, Precision, QuantscopeError

FORMATS = ("1.0.0", "0.6.1")
FLOAT_BITS = 16


def aimet_offset(enc: Encoding) -> np.ndarray:
    """AIMET offset per channel (see the module table)."""
    zp = np.atleast_1d(enc.zero_point).astype(np.int64)
    return -(zp + (1 << (enc.bits - 1))) if enc.signed else -zp


def is_symmetric(enc: Encoding) -> bool:
    """Whether the grid is symmetric in AIMET's sense: centred on 0, ``offset`` =
    ``-2**(bits-1)`` on every channel (what ``is_symmetric`` / ``is_sym`` must say)."""
    return bool(np.all(aimet_offset(enc) == -(1 << (enc.bits - 1))))


def _channels(enc: Encoding) -> tuple[list[float], list[int]]:
    scale = [float(s) for s in np.atleast_1d(enc.scale).astype(np.float32)]
    offset = [int(o) for o in aimet_offset(enc)]
    if len(offset) == 1 and len(scale) > 1:
        offset = offset * len(scale)
    return scale, offset


def _legacy_entries(enc: Encoding) -> list[dict[str, Any]]:
    scale, offset = _channels(enc)
    symmetric = is_symmetric(enc)
    qmax = (1 << enc.bits) - 1
    return [
        {
            "bitwidth": enc.bits,
            "dtype": "int",
            "is_symmetric": str(symmetric),
            "max": float(np.float32((qmax + o) * s)),
            "min": float(np.float32(o * s)),
            "offset": o,
            "scale": s,
        }
        for s, o in zip(scale, offset, strict=True)
    ]


def _v1_entry(name: str, enc: Encoding) -> dict[str, Any]:
    scale, offset = _channels(enc)
    symmetric = is_symmetric(enc)
    entry: dict[str, Any] = {
        "name": name,
        "dtype": "INT",
        "enc_type": "PER_CHANNEL" if len(scale) > 1 else "PER_TENSOR",
        "is_sym": symmetric,
        "bw": enc.bits,
        "scale": scale,
        "offset": offset,
    }
    return entry


def _tensor_precisions(
    plan: Plan, groups: Groups
) -> tuple[dict[str, Precision], dict[str, Precision]]:
    """(activation tensor -> precision, weight initializer -> precision) in graph order."""
    shared = {chain[0]: chain[1:] for chain in groups.shared}
    # an input is quantized at the most bits of the groups reading it; one that only
    # float groups read stays float (only float or not matters here: an encoding carries
    # its own bits)
    quantized = groups.input_bits(plan)
    acts: dict[str, Precision] = {
        t: Precision.FLOAT if t not in quantized
        else Precision.A16_W16 if quantized[t] == 16 else Precision.A8_W8
        for t in groups.model_inputs}
    for t in groups.model_inputs:  # what a Transpose/Reshape/no-op Cast makes of an input
        acts.update({d: acts[t] for d in shared.get(t, ())})
    weights: dict[str, Precision] = {}
    for g in groups.groups:
        p = plan.precision_of(g.name)
        for t in g.outputs:
            acts[t] = p
            acts.update({d: p for d in shared.get(t, ())})
        if g.weight is not None:
            weights[g.weight] = p
    return acts, weights


def _lookup(table: dict[str, Encoding], name: str, kind: str) -> Encoding:
    if name not in table:
        raise QuantscopeError(f"no {kind} encoding for '{name}': re-run encode with this plan")
    return table[name]


def _encoding_of(
    name: str, table: dict[str, Encoding], shared_root: dict[str, str], kind: str
) -> Encoding:
    return _lookup(table, name if name in table else shared_root.get(name, name), kind)


def export_qnn_encodings(
    plan: Plan, groups: Groups, encodings: Encodings, *, version: str = "1.0.0"
) -> dict[str, Any]:
    """The encodings document for ``plan`` in format ``version`` (1.0.0 or 0.6.1)."""
    if version not in FORMATS:
        raise QuantscopeError(
            f"unknown encodings format '{version}': use one of {', '.join(FORMATS)}"
        )
    root = {t: chain[0] for chain in groups.shared for t in chain[1:]}
    acts, weights = _tensor_precisions(plan, groups)
    act_doc: dict[str, Encoding | None] = {}
    param_doc: dict[str, Encoding | None] = {}
    for table, precisions, doc, kind in (
        (encodings.activations, acts, act_doc, "activation"),
        (encodings.weights, weights, param_doc, "weight"),
    ):
        for name, p in precisions.items():
            doc[name] = None if p is Precision.FLOAT else _encoding_of(name, table, root, kind)
    written = [e for e in param_doc.values() if e is not None]
    symmetric = (all(map(is_symmetric, written)) if written
                 else encodings.scheme.weight_symmetric)
    args = _quantizer_args(plan, symmetric=symmetric,
                           per_channel=encodings.scheme.weight_per_channel,
                           legacy=version == "0.6.1")
    return _render(act_doc, param_doc, args, version)


def _render(acts: dict, params: dict, args: dict[str, Any], version: str) -> dict[str, Any]:
    if version == "0.6.1":

        def legacy(doc: dict) -> dict:
            return {
                n: [{"bitwidth": FLOAT_BITS, "dtype": "float"}]
                if v is None
                else _legacy_entries(v)
                for n, v in doc.items()
            }

        return {
            "version": "0.6.1",
            "activation_encodings": legacy(acts),
            "param_encodings": legacy(params),
            "quantizer_args": args,
        }

    def v1(doc: dict) -> list:
        return [
            {"name": n, "dtype": "FLOAT", "enc_type": "PER_TENSOR", "bw": FLOAT_BITS}
            if v is None
            else _v1_entry(n, v)
            for n, v in doc.items()
        ]

    return {
        "version": "1.0.0",
        "activation_encodings": v1(acts),
        "param_encodings": v1(params),
        "excluded_layers": [],
        "quantizer_args": args,
    }


def _quantizer_args(plan: Plan, *, symmetric: bool, per_channel: bool,
                    legacy: bool) -> dict[str, Any]:
    p = plan.default
    flag = (lambda b: str(b)) if legacy else (lambda b: b)
    return {
        "activation_bitwidth": p.act_bits or FLOAT_BITS,
        "dtype": "float" if p is Precision.FLOAT else "int",
        "is_symmetric": flag(symmetric),
        "param_bitwidth": p.weight_bits or FLOAT_BITS,
        "per_channel_quantization": flag(per_channel),
        "quant_scheme": "post_training_tf",
    }


def unencoded_tensors(groups: Groups, node_outputs: Mapping[str, Sequence[str]]
                      ) -> list[tuple[str, str]]:
    """(tensor, group) for every tensor a group's nodes make that is not one of the group's
    outputs (``node_outputs``: node name -> its output tensors), in graph order: the
    tensors the encodings file has no entry for although the device computes them."""
    out: list[tuple[str, str]] = []
    for g in groups.groups:
        leaving = set(g.outputs)
        out += [(t, g.name) for n in g.nodes for t in node_outputs.get(n, ())
                if t and t not in leaving]
    return out


def unencoded_line(file_name: str, tensors: Sequence[tuple[str, str]], *,
                   shown: int = 6) -> str | None:
    """One line saying which tensors ``file_name`` (a QNN encodings file) has no encoding
    for, and why; None when there are none."""
    if not tensors:
        return None
    names = ", ".join(f"{t} (in {g})" for t, g in tensors[:shown])
    more = f" and {len(tensors) - shown} more" if len(tensors) > shown else ""
    return (f"{file_name}: {len(tensors)} tensor(s) inside groups have no encoding: "
            f"{names}{more}; the emulation keeps each float (the group's wide accumulator), "
            "so the QNN converter picks its own encoding for those it does not fuse into "
            "the group's op (from its --input_list calibration) and the emulated figures "
            "do not cover them")


def to_json(doc: dict[str, Any]) -> str:
    """Deterministic JSON text of an encodings document."""
    return json.dumps(doc, indent=2) + "\n"


def _from_channels(bits: int, scale: list[float], offset: list[int]) -> Encoding:
    per_channel = len(scale) > 1
    arr_s = np.asarray(scale, dtype=np.float32)
    arr_z = -np.asarray(offset, dtype=np.int32)
    return Encoding(
        scale=arr_s if per_channel else arr_s.reshape(()),
        zero_point=arr_z if per_channel else arr_z.reshape(()),
        bits=int(bits),
        signed=False,
        axis=0 if per_channel else None,
    )


def parse_qnn_encodings(doc: dict[str, Any]) -> dict[str, dict[str, Encoding | None]]:
    """``{"activations": {..}, "params": {..}}``; None marks a float tensor.

    Encodings come back in the unsigned domain (``zero_point = -offset``), which
    represents the same grid as the exported ones (compare ``Encoding.range()``).
    """
    out: dict[str, dict[str, Encoding | None]] = {"activations": {}, "params": {}}
    for key, section in (("activations", "activation_encodings"), ("params", "param_encodings")):
        body = doc.get(section, {})
        if doc.get("version") == "1.0.0":
            for e in body:
                out[key][e["name"]] = (
                    None
                    if e["dtype"] == "FLOAT"
                    else _from_channels(e["bw"], e["scale"], e["offset"])
                )
        else:
            for name, entries in body.items():
                out[key][name] = (
                    None
                    if entries[0]["dtype"] == "float"
                    else _from_channels(
                        entries[0]["bitwidth"],
                        [e["scale"] for e in entries],
                        [e["offset"] for e in entries],
                    )
                )
    return out
