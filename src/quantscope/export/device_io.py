"""How to feed and read the deployed model: stored type, scale and zero-point per I/O.

Hailo (and QNN) store every quantized value as an integer with its own scale and
zero-point: ``real = (q - zero_point) * scale`` and ``q = round(real / scale) +
zero_point``. A 16-bit unsigned output reads 0..65535; reading it as signed or with a
hand-written 0/127/255 mapping is the classic mistake of the field reports.

A lookup the target leaves to the host (:mod:`quantscope.model.host_gather`: the
word-embedding Gather by ``input_ids``) makes the looked-up rows the compiled graph's
input: its row says so (``host_lookup``: the table's name, shape, dtype, MB and the input
that indexes it), and the snippet looks the rows up before quantizing them. Text
prefixes the encoder was evaluated with (``--query-prefix``/``--doc-prefix``) go into the
snippet too (:func:`text_snippet`): the host must put the same text before every query
and document.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from quantscope.export.hailo_alls import one_line
from quantscope.model.host_gather import HostGather
from quantscope.model.load import FLOAT_TYPES, Model
from quantscope.types import Encodings, Groups, Plan, Precision, QuantscopeError

PROVENANCE = ("scale and zero point are what this calibration implies; the device's real "
              "qp_scale/qp_zp come from the compiled artefact (e.g. the HEF's vstream info) "
              "and must be read from there")


def device_io(model: Model, groups: Groups, encodings: Encodings,
              host: Sequence[HostGather] = ()) -> list[dict[str, Any]]:
    """One row per quantized model input / output (float ones are left out); each lookup
    the host does (``host``) is an input row of the rows it feeds the device, with
    ``host_lookup`` saying which table."""
    root = {t: chain[0] for chain in groups.shared for t in chain[1:]}
    lookups = {g.output: g for g in host}
    rows = []
    for role, names in (("input", (*lookups, *groups.model_inputs)),
                        ("output", model.output_names())):
        for name in names:
            enc = encodings.activations.get(root.get(name, name))
            if enc is None:
                continue
            q_min, q_max = _code_bounds(enc.bits, enc.signed)
            lookup = {"host_lookup": lookups[name].to_dict()} if name in lookups else {}
            # an output a Reshape/Flatten/no-op Cast writes: the tensor whose encoding it is
            shared = {"encoded_as": root[name]} if root.get(name, name) != name else {}
            rows.append({
                "role": role, "tensor": name, "bits": enc.bits, "signed": enc.signed,
                "stored_type": f"{'int' if enc.signed else 'uint'}{enc.bits}",
                "q_min": q_min, "q_max": q_max,
                "scale": float(enc.scale), "zero_point": int(enc.zero_point),
                "min": float(enc.range()[0]), "max": float(enc.range()[1]), **lookup,
                **shared,
            })
    return rows


def float_io(model: Model, groups: Groups, plan: Plan) -> list[dict[str, str]]:
    """The float model inputs and outputs the plan leaves float (no conversion on the
    host: the compiled graph takes or gives the compiler's float type, FP16 on HTP): an
    input only float groups read, an output a float group writes. Said beside the rows,
    never left out in silence."""
    quantized = groups.input_bits(plan)
    root = {t: chain[0] for chain in groups.shared for t in chain[1:]}
    writer = {t: g.name for g in groups.groups for t in g.outputs}
    out = []
    for role, values in (("input", model.graph.input), ("output", model.graph.output)):
        for v in values:
            if v.type.tensor_type.elem_type not in FLOAT_TYPES:
                continue
            if role == "input":
                is_float = v.name in groups.model_inputs and v.name not in quantized
            else:
                group = writer.get(root.get(v.name, v.name))
                is_float = group is not None and plan.precision_of(group) is Precision.FLOAT
            if is_float:
                out.append({"role": role, "tensor": v.name})
    return out


def as_is_io(model: Model, rows: Sequence[dict[str, Any]] = ()) -> list[dict[str, str]]:
    """The model inputs and outputs that are not float ({role, tensor, dtype}): fed or read
    as they are, with no scale or zero point (a uint8 image the graph Casts and normalises,
    a mask, token ids; an image the graph Casts back to uint8); an input that indexes a
    host lookup (a row's ``host_lookup``) is said by that row, and is fed as it is too
    where the compiled graph also reads its values (the lookup's ``device_reads``: RoBERTa's
    position ids from ``input_ids``), with ``reads`` naming those nodes."""
    lookups = [r["host_lookup"] for r in rows if r.get("host_lookup")]
    device = {x["indices"]: x["device_reads"] for x in lookups if x.get("device_reads")}
    looked_up = {x["indices"] for x in lookups} - set(device)
    consts = {t.name for t in model.graph.initializer}
    out = []
    for role, values in (("input", model.graph.input), ("output", model.graph.output)):
        for v in values:
            elem = v.type.tensor_type.elem_type
            if elem in FLOAT_TYPES or v.name in consts or v.name in looked_up:
                continue
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name
            reads = {"reads": list(device[v.name])} if v.name in device else {}
            out.append({"role": role, "tensor": v.name, "dtype": dtype, **reads})
    return out


def as_is_lines(as_is: Sequence[dict[str, str]]) -> list[str]:
    """One line per input fed / output read as it is (:func:`as_is_io`)."""
    return [f"{a['role']:<6} {a['tensor']}: {a['dtype']}, "
            f"{'fed' if a['role'] == 'input' else 'read'} as it is: not quantized (no scale "
            "or zero point; the graph converts it)" + _also(a) for a in as_is]


def _also(a: dict[str, Any]) -> str:
    """Why an input the host looks up by is fed to the device as well (``reads``)."""
    if not a.get("reads"):
        return ""
    return (f"; besides the host's lookup the compiled graph reads it too "
            f"({', '.join(repr(n) for n in a['reads'][:3])}), so it is fed to the device")


def float_lines(floats: Sequence[dict[str, str]]) -> list[str]:
    """One line per float input/output (:func:`float_io`)."""
    return [f"{f['role']:<6} {f['tensor']}: float: the plan leaves it unquantized, so the host "
            "feeds/reads the compiler's float type (FP16 on QNN HTP) with no scale or zero "
            "point" for f in floats]


def lookup_line(lookup: dict[str, Any]) -> str:
    """One line of what the host looks up (a row's ``host_lookup``)."""
    shape = "x".join(str(d) for d in lookup["shape"])
    return (f"the host looks up {lookup['table']} [{shape}] {lookup['dtype']} "
            f"({lookup['megabytes']:,.1f} MB) by {lookup['indices']}: the compiled graph "
            f"takes the rows as '{lookup['output']}'")


def _code_bounds(bits: int, signed: bool) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def format_device_io(rows: list[dict[str, Any]],
                     floats: Sequence[dict[str, str]] = (),
                     as_is: Sequence[dict[str, str]] = ()) -> str:
    if not rows:
        why = ":" if as_is else " (they stay float under this plan)"
        return "\n".join([f"no quantized model inputs or outputs{why}", *as_is_lines(as_is),
                          *float_lines(floats)])
    lines = [*as_is_lines(as_is), *float_lines(floats)]
    for r in rows:
        kind, lo, hi = r["stored_type"], r["q_min"], r["q_max"]
        if r.get("host_lookup"):
            lines.append(f"host   {lookup_line(r['host_lookup'])}")
        lines.append(
            f"{r['role']:<6} {r['tensor']}: stored as {kind} ({lo} … {hi}), scale "
            f"{r['scale']:.8g}, zero point {r['zero_point']} (real range {r['min']:.6g} .. "
            f"{r['max']:.6g})\n"
            f"       to device:   q = clip(round(x / {r['scale']:.8g}) + {r['zero_point']}, "
            f"{lo}, {hi})\n"
            f"       from device: x = (q - {r['zero_point']}) * {r['scale']:.8g}"
            + ("   (read the buffer as unsigned: a uint16 read as int16 wraps above 32767)"
               if kind == "uint16" else "")
        )
    lines.append(f"note: {PROVENANCE}")
    return "\n".join(lines)


def to_device(x: np.ndarray, entry: dict[str, Any]) -> np.ndarray:
    """Real values -> the integer codes the device expects for this input (one io row):
    divided in float32 as ONNX's QuantizeLinear does (the emulated graph's codes; a
    float64 division puts a value near a half code on the next code now and then)."""
    q = np.round(np.asarray(x, np.float32) / np.float32(entry["scale"])) + entry["zero_point"]
    q = np.clip(q, entry["q_min"], entry["q_max"])
    return q.astype(np.dtype(entry["stored_type"]))


def from_device(q: np.ndarray, entry: dict[str, Any]) -> np.ndarray:
    """Integer codes read from the device for this output (one io row) -> real values."""
    codes = np.asarray(q).astype(np.int64)
    return ((codes - entry["zero_point"]) * entry["scale"]).astype(np.float32)


def snippet_names(tensors: Sequence[str]) -> list[str]:
    """A Python identifier part per tensor name, distinct: ASCII letters and digits kept,
    anything else ``_``; names that meet after that (``a/b``, ``a.b``) get ``_2``, ``_3``,
    so no function of the snippet replaces another's."""
    out: list[str] = []
    for name in tensors:
        var = "".join(c if c.isascii() and c.isalnum() else "_" for c in name).strip("_") or "t"
        base, k = var, 1
        while var in out:
            k += 1
            var = f"{base}_{k}"
        out.append(var)
    return out


def python_snippet(rows: list[dict[str, Any]],
                   floats: Sequence[dict[str, str]] = (),
                   as_is: Sequence[dict[str, str]] = ()) -> str:
    """Code the user pastes into the host program: one transform per quantized I/O (its
    tensor's name in a comment, on one line whatever the name holds; a comment for each
    one the plan leaves float and each input fed as it is)."""
    said = [*as_is_lines(as_is), *float_lines(floats)]
    out = ["import numpy as np", "", "# scale/zero point implied by quantscope's calibration;",
           "# replace with the compiled artefact's qp_scale/qp_zp where they differ", "",
           *(f"# {one_line(line)}" for line in said), *([""] if said else [])]
    for r, var in zip(rows, snippet_names([r["tensor"] for r in rows]), strict=True):
        tensor = one_line(r["tensor"])
        if r.get("host_lookup"):
            out += _lookup_lines(r["host_lookup"], var)
        if r["role"] == "input":
            out.append(f"def to_device_{var}(x):  # {tensor}: {r['stored_type']}")
            out.append(f"    q = np.round(np.asarray(x, np.float32) / np.float32({r['scale']!r}))"
                       f" + {r['zero_point']}  # float32, as the emulated QuantizeLinear")
            out.append(f"    return np.clip(q, {r['q_min']}, {r['q_max']})"
                       f".astype(np.{r['stored_type']})")
        else:
            out.append(f"def from_device_{var}(q):  # {tensor}: {r['stored_type']}")
            wrap = "" if r["signed"] else f" % {r['q_max'] + 1}  # unsigned, even if read signed"
            out.append(f"    q = np.asarray(q).astype(np.int64){wrap}")
            out.append(f"    return ((q - {r['zero_point']}) * {r['scale']!r}).astype(np.float32)")
        out.append("")
    return "\n".join(out)


def _lookup_lines(lookup: dict[str, Any], var: str) -> list[str]:
    """The host's lookup of one table: load it from the FP32 model, index it (names in
    comments on one line; the table's name in code as a Python literal)."""
    return [
        f"# {one_line(lookup_line(lookup))}",
        "# (the target keeps this lookup outside the compiled graph: cut the graph",
        f"# after {one_line(lookup['node'])}; quantize the rows with to_device_{var})",
        f"def load_table_{var}(fp32_model_path):",
        f"    # {one_line(lookup['table'])} {lookup['shape']} {lookup['dtype']}, from the FP32 "
        "model",
        "    import onnx",
        "    from onnx import numpy_helper",
        "    model = onnx.load(fp32_model_path)",
        "    return next(numpy_helper.to_array(t) for t in model.graph.initializer",
        f"                if t.name == {lookup['table']!r})",
        "",
        f"def lookup_{var}(table, token_ids):",
        f"    # the rows the compiled graph takes: table[token_ids] ({one_line(lookup['indices'])})",
        "    return np.asarray(table)[np.asarray(token_ids, np.int64)]",
        "",
    ]


def text_snippet(query: str, document: str) -> str:
    """The text prefixes the evaluation put before queries and documents: the host must
    put the same ones before tokenizing."""
    return "\n".join([
        "# text prefixes the evaluation used (--query-prefix/--doc-prefix): put the same",
        "# text before every query and every document before tokenizing, or the embeddings",
        "# differ from the ones measured",
        f"QUERY_PREFIX = {query!r}",
        f"DOC_PREFIX = {document!r}", "",
        "def with_prefix(text, is_query):",
        '    """The text as the encoder was evaluated on it."""',
        "    return (QUERY_PREFIX if is_query else DOC_PREFIX) + text", "",
    ])


def router_snippet(buckets: list[tuple[int, str]], feeds: list[list[str]], pad_id: int) -> str:
    """The host's router of a deployment of compiled lengths: each text (its token ids) to
    the shortest compiled model that holds it, padded to that length (a longer text
    truncated at the longest, keeping its last token, as the evaluation ran it).
    ``buckets``: (length, model file) increasing; ``feeds``: (role, input name, dtype) of
    the text inputs (``input_ids``, ``attention_mask``, ``token_type_ids``)."""
    fills = {"input_ids": "ids", "attention_mask": "mask", "token_type_ids": "[0] * length"}
    lines = [
        "# compiled lengths (deployment.json): each text runs on the shortest compiled model",
        "# that holds its token count; switching between models is not modelled in the cost",
        f"COMPILED = {[(int(n), str(p)) for n, p in buckets]!r}",
        f"PAD_ID = {int(pad_id)}", "",
        "def compiled_for(token_count):",
        '    """(length, model file) of the shortest compiled model holding token_count',
        '    tokens; the longest for a longer text (truncated there)."""',
        "    for length, path in COMPILED:",
        "        if token_count <= length:",
        "            return length, path",
        "    return COMPILED[-1]", "",
        "def route_text(token_ids):",
        '    """(model file, feeds) of one tokenized text: its inputs padded to the length',
        '    of the compiled model it runs on, shape [1, length] each."""',
        "    length, path = compiled_for(len(token_ids))",
        "    ids = list(token_ids)",
        "    if len(ids) > length:  # keep the first length - 1 tokens and the end token",
        "        ids = ids[:length - 1] + ids[-1:]",
        "    mask = [1] * len(ids) + [0] * (length - len(ids))",
        "    ids = ids + [PAD_ID] * (length - len(ids))",
        "    return path, {",
    ]
    lines += [f"        {name!r}: np.asarray([{fills[role]}], np.{dtype}),"
              for role, name, dtype in feeds if role in fills]
    lines += ["    }", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- manual mappings


@dataclass(frozen=True)
class Mapping:
    """A hand-written code <-> value mapping: piecewise linear through (code, value) points."""

    tensor: str  # a tensor name, or "*" for every quantized I/O
    codes: tuple[float, ...]
    values: tuple[float, ...]

    def value_of(self, q: np.ndarray) -> np.ndarray:
        return np.interp(q, self.codes, self.values)

    def code_of(self, x: np.ndarray) -> np.ndarray:
        order = np.argsort(self.values)
        return np.interp(x, np.asarray(self.values)[order], np.asarray(self.codes)[order])


def parse_mapping(spec: str) -> Mapping:
    """``TENSOR=CODE:VALUE,CODE:VALUE[,…]``, e.g. ``out=0:-1,127:0,255:1`` (TENSOR may be *)."""
    tensor, sep, points = spec.partition("=")
    try:
        pairs = [tuple(float(v) for v in p.split(":")) for p in points.split(",")]
        if not sep or len(pairs) < 2 or any(len(p) != 2 for p in pairs):
            raise ValueError
        if not all(math.isfinite(v) for p in pairs for v in p):
            raise ValueError
    except ValueError:
        raise QuantscopeError(
            f"mapping '{spec}' is not TENSOR=CODE:VALUE,CODE:VALUE,… (e.g. out=0:-1,127:0,255:1)"
        ) from None
    pairs.sort()
    if len({c for c, _ in pairs}) != len(pairs):
        raise QuantscopeError(f"mapping '{spec}' names one code twice: give each code once")
    return Mapping(tensor.strip(), tuple(c for c, _ in pairs), tuple(v for _, v in pairs))


def check_mapping(rows: Sequence[dict[str, Any]], mappings: Sequence[Mapping],
                  *, points: int = 4097) -> list[dict[str, Any]]:
    """Error a manual mapping causes against the correct transform, per input and output.

    Over the tensor's calibrated range: an input fed as ``code_of(x)`` is read by the
    device as ``(q - zp) * scale``; an output code ``q = round(y / scale) + zp`` read as
    ``value_of(q)``. The error is against the real value (max and mean absolute, and the
    max as a fraction of the range).
    """
    by_name = {r["tensor"]: r for r in rows}
    out = []
    for m in mappings:
        targets = list(rows) if m.tensor == "*" else [by_name.get(m.tensor)]
        if targets == [None]:
            raise QuantscopeError(f"mapping names {m.tensor!r}, which is no quantized input or "
                                  f"output (these are: {', '.join(map(repr, by_name)) or 'none'})")
        for r in targets:
            x = np.linspace(r["min"], r["max"], points)
            if r["role"] == "input":
                q = np.clip(np.round(m.code_of(x)), r["q_min"], r["q_max"])
                read = (q - r["zero_point"]) * r["scale"]
            else:
                q = np.clip(np.round(x / r["scale"]) + r["zero_point"], r["q_min"], r["q_max"])
                read = m.value_of(q)
            err = np.abs(read - x)
            span = max(r["max"] - r["min"], 1e-30)
            out.append({"role": r["role"], "tensor": r["tensor"], "mapping": _spec(m),
                        "max_abs_error": float(err.max()), "mean_abs_error": float(err.mean()),
                        "max_error_of_range": float(err.max() / span),
                        "worst_at": float(x[int(err.argmax())])})
    return out


def _spec(m: Mapping) -> str:
    return ",".join(f"{c:g}:{v:g}" for c, v in zip(m.codes, m.values, strict=True))


def format_mapping_check(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        lines.append(f"{r['role']:<6} {r['tensor']}: mapping {r['mapping']} -> max error "
                     f"{r['max_abs_error']:.4g} ({r['max_error_of_range']:.1%} of the range, "
                     f"at {r['worst_at']:.4g}), mean {r['mean_abs_error']:.4g}")
    return "\n".join(lines)
