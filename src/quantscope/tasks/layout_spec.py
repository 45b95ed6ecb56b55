"""``--layout`` values read: the kinds and their keys, the syntax, numbers and row ranges
checked without the model (:func:`parse_layout`). What each kind is scored by, and the
checks against the model's outputs, are in :mod:`quantscope.tasks.layout` (which
re-exports these names).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from quantscope.tasks.depth import ALIGNS
from quantscope.tasks.detection import BOX_FORMATS
from quantscope.tasks.neighbours import NORMS
from quantscope.tasks.pictures import parse_range
from quantscope.tasks.points import ORDERS, SCALE_INPUT
from quantscope.tasks.points_gate import WHERE_SYNTAX, parse_where
from quantscope.types import QuantscopeError

KINDS: dict[str, tuple[str, ...]] = {
    "detect": ("boxes", "scores", "obj", "axis", "format", "threshold", "iou", "scores_from",
               "anchors", "grid", "dfl", "centre", "levels"),
    "map": ("threshold", "channel"),
    "score": ("threshold",),
    "class": ("axis",),
    "points": ("dims", "tol", "flags", "threshold", "scale", "order", "photo", "where"),
    "ctc": ("blank", "axis", "lengths"),
    "image": ("range",),
    "depth": ("align",),
    "verify": ("labels", "threshold"),
    "pitch": ("cents", "threshold", "tol"),
    "embedding": ("norm", "labels"),
    "tensor": (),
}
KIND_NAMES = "detect, map, score, class, points, ctc, image, depth, verify, pitch, embedding or tensor"
SYNTAX = f"OUTPUT=KIND[:KEY=VALUE,...] with KIND {KIND_NAMES}"
LAYOUT_NOTE = "' read as "  # in every note saying what an output was read as


class LayoutError(QuantscopeError):
    """A ``--layout`` value that cannot be read (one line: the value and the fix)."""


@dataclass(frozen=True)
class LayoutSpec:
    """One parsed ``--layout`` value (checked against the model by :func:`layout_tasks`)."""

    output: str
    kind: str
    options: tuple[tuple[str, str], ...] = ()
    text: str = ""

    def option(self, key: str) -> str | None:
        return dict(self.options).get(key)


def fail(text: str, why: str) -> LayoutError:
    return LayoutError(f"--layout '{text}': {why}")


_KIND_AFTER = re.compile(r"=\s*(?:" + "|".join(KINDS) + r")\s*(?=:|$)", re.IGNORECASE)
QUOTE_HINT = ("an output name holding '=' is read up to the last '=KIND', or quote it: "
              "--layout '\"a=b\"=detect'")


def _keys_fit(rest: str) -> bool:
    """Whether ``KIND[:KEY=VALUE,...]`` names only keys of its kind (values unread)."""
    kind, _, opts = rest.partition(":")
    keys = KINDS.get(kind.strip().lower(), ())
    return all(item.partition("=")[0].strip().lower() in keys
               for item in filter(None, (s.strip() for s in opts.split(","))))


def _split_output(text: str) -> tuple[str, str, str]:
    """(output, '=', the rest): a quoted output name as written; else the name runs to
    the first ``=KIND`` (a known kind, then ``:`` or the end) whose keys are all that
    kind's, so a name may hold '=' (and ',', ':') and an option's value may name an output
    called like a kind (``boxes=points:where=map:1>0.6``); failing that, to the last
    ``=KIND`` (its error then names the key); else to the first '=' (the kind is then named
    as unknown)."""
    quote = text.lstrip()[:1]
    if quote in ("'", '"'):
        body = text.lstrip()[1:]
        close = body.find(quote)
        after = body[close + 1:].lstrip() if close >= 0 else ""
        if close < 0 or not after.startswith("="):
            raise fail(text, f"the quoted output name is not closed by {quote}=KIND: "
                        f"give {SYNTAX} ({QUOTE_HINT})")
        return body[:close], "=", after[1:]
    found = list(_KIND_AFTER.finditer(text))
    if found:
        at = next((m for m in found if _keys_fit(text[m.start() + 1:])), found[-1])
        return text[:at.start()].strip(), "=", text[at.start() + 1:]
    output, eq, rest = text.partition("=")
    return output.strip(), eq, rest


def parse_layout(text: str) -> LayoutSpec:
    """``OUTPUT=KIND[:KEY=VALUE,...]`` -> :class:`LayoutSpec`; syntax, kinds, keys and
    numbers checked here (output names and row counts need the model)."""
    output, eq, rest = _split_output(text)
    if not eq or not output:
        raise fail(text, f"give {SYNTAX} (e.g. detections=detect, mask=map:threshold=0.5)")
    kind, _, opts = rest.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise fail(text, f"unknown kind '{kind}': use {KIND_NAMES}")
    options: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in opts.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip()
        if key not in KINDS[kind]:
            allowed = ", ".join(KINDS[kind]) or "none"
            raise fail(text, f"'{key}' is no key of kind {kind} (keys: {allowed})")
        if not eq or not value:
            raise fail(text, f"'{key}' has no value: write {key}=VALUE")
        if key in options:
            raise fail(text, f"'{key}' is given twice: give it once")
        options[key] = value
    if kind == "verify" and "labels" not in options:
        raise fail(text, "verify needs labels=NAME: the array of the data file holding one "
                   "label per sample (np.savez(f, INPUT=x, speaker=ids); labels=speaker)")
    spec = LayoutSpec(output, kind, tuple(options.items()), text)
    _check_values(spec)
    return spec


def image_ranges(specs: tuple[LayoutSpec, ...]) -> dict[str, tuple[float, float]]:
    """Each output declared ``image`` with a ``range=``, and that range."""
    out = {}
    for spec in specs:
        raw = spec.option("range") if spec.kind == "image" else None
        if raw is not None:
            out[spec.output] = parse_range(raw)
    return out


def number(spec: LayoutSpec, key: str, lo: float, hi: float, *, open_lo: bool = False
            ) -> float | None:
    raw = spec.option(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise fail(spec.text, f"{key} '{raw}' is not a number") from None
    if not math.isfinite(value):
        raise fail(spec.text, f"{key} '{raw}' is not a finite number: give e.g. {key}=0.5")
    if value < lo or value > hi or (open_lo and value == lo):
        side = "(" if open_lo else "["
        raise fail(spec.text, f"{key} {raw} is outside {side}{lo:g}, {hi:g}]: give a value in it")
    return value


def rows(spec: LayoutSpec, key: str) -> tuple[int, int | None] | None:
    """``A-B`` / ``A-`` / ``A`` -> ``(A, B + 1)`` / ``(A, None)`` / ``(A, A + 1)``."""
    raw = spec.option(key)
    if raw is None:
        return None
    a, dash, b = raw.partition("-")
    try:
        start = int(a)
        stop = (None if not b.strip() else int(b) + 1) if dash else start + 1
    except ValueError:
        raise fail(spec.text, f"{key} '{raw}' is not a row range: write A-B, A- or A "
                    "(rows counted from 0)") from None
    if start < 0 or (stop is not None and stop <= start):
        raise fail(spec.text, f"{key} '{raw}' is an empty or negative row range: write A-B "
                    "with 0 <= A <= B")
    return start, stop


def dfl_bins(spec: LayoutSpec) -> int | None:
    """``dfl=8`` -> 8: the bins per box side of distribution boxes (checked: a whole number
    of 2 or more, with ``grid=``); None when not given."""
    raw = spec.option("dfl")
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 2:
        raise fail(spec.text, f"dfl '{raw}' is not a whole number of 2 or more: give the bins "
                   "per box side (PicoDet: dfl=8; YOLOv8: dfl=16)")
    if spec.option("grid") is None:
        raise fail(spec.text, f"dfl={raw} decodes distances from each cell of the head's grid: "
                   "give its strides with it (e.g. grid=8/16/32/64)")
    return int(raw)


def _check_points(spec: LayoutSpec) -> None:
    """A points layout's ``scale``, ``photo`` (with a scale) and ``where`` checked."""
    scale = spec.option("scale")
    if scale is not None and scale.lower() != SCALE_INPUT:
        try:
            float(scale)
        except ValueError:
            raise fail(spec.text, f"scale '{scale}' is neither a number nor '{SCALE_INPUT}': "
                       "give the pixels one unit of the values is (scale=48: shares of a "
                       f"48-px crop), or scale={SCALE_INPUT} (the image input's side)") from None
        number(spec, "scale", 0.0, math.inf, open_lo=True)
    number(spec, "photo", 0.0, math.inf, open_lo=True)
    if spec.option("photo") is not None and scale is None:
        raise fail(spec.text, f"photo={spec.option('photo')} is the box side in photo pixels "
                   "of the crop the values are shares of: give the crop's side with it "
                   "(scale=48 or scale=input: photo=192,scale=48)")
    where = spec.option("where")
    if where is not None and parse_where(where) is None:
        raise fail(spec.text, f"where '{where}' is not OUT:K>T: give {WHERE_SYNTAX}, e.g. "
                   "where=prob:1>0.6 (MTCNN's P-Net: its face channel at 0.6); quote it in a "
                   "shell, where '>' redirects: --layout 'boxes=points:where=prob:1>0.6'")
    if where is not None and spec.option("flags") is not None:
        raise fail(spec.text, "where= and flags= both choose the points judged: give one")


def _check_values(spec: LayoutSpec) -> None:
    number(spec, "threshold", -math.inf, math.inf)
    number(spec, "iou", 0.0, 1.0, open_lo=True)
    number(spec, "tol", 0.0, math.inf, open_lo=True)
    number(spec, "cents", 0.0, math.inf, open_lo=True)
    dims = spec.option("dims")
    if dims is not None and (not dims.isdigit() or int(dims) < 1):
        raise fail(spec.text, f"dims '{dims}' is not a whole number of 1 or more: give the "
                    "values per point (e.g. dims=3 for x, y, z)")
    rows(spec, "flags")
    _check_points(spec)
    order = spec.option("order")
    if order is not None and order.lower() not in ORDERS:
        raise fail(spec.text, f"order '{order}' is unknown: use {', '.join(ORDERS[:-1])} or "
                   f"{ORDERS[-1]} "
                   "(planar: x1..xP then y1..yP, MTCNN's landmarks; interleaved: x1, y1, x2, "
                   "y2, ...; channels: a map's values on axis 1 at each position)")
    bins = dfl_bins(spec)
    boxes = rows(spec, "boxes")
    want = 4 * (bins or 1)
    if boxes is not None and (boxes[1] is None or boxes[1] - boxes[0] != want):
        example = f"boxes=0-{want - 1}"
        what = f"4 sides x {bins} bins = {want} rows" if bins else "4 rows"
        raise fail(spec.text, f"boxes '{spec.option('boxes')}' must be {what} (e.g. {example})")
    number(spec, "centre", 0.0, 1.0)
    if spec.option("centre") is not None and bins is None:
        raise fail(spec.text, "centre= is the cell point of distribution boxes: give dfl=BINS "
                   "with it, or drop it")
    rows(spec, "scores")
    obj = rows(spec, "obj")
    if obj is not None and obj[1] != obj[0] + 1:
        raise fail(spec.text, f"obj '{spec.option('obj')}' must be one row (e.g. obj=4)")
    fmt = spec.option("format")
    if fmt is not None and fmt.lower() not in BOX_FORMATS:
        raise fail(spec.text, f"format '{fmt}' is unknown: use {' or '.join(BOX_FORMATS)}")
    channel = spec.option("channel")
    if channel is not None and not channel.isdigit():
        raise fail(spec.text, f"channel '{channel}' is not a whole number >= 0: give the "
                   "index on axis 1 of the channel to binarise (e.g. channel=1)")
    axis = spec.option("axis")
    if axis is not None and (not axis.lstrip("-").isdigit()):
        what = ("class axis (e.g. -1, the last)" if spec.kind in ("class", "ctc")
                else "row axis (e.g. 1)")
        raise fail(spec.text, f"axis '{axis}' is not a whole number: give the {what}")
    image_range = spec.option("range")
    if image_range is not None:
        try:
            parse_range(image_range)
        except ValueError:
            raise fail(spec.text, f"range '{image_range}' is not LO-HI with LO < HI: give the "
                       "image's value range (e.g. range=0-255, range=0-1)") from None
    how = spec.option("align")
    if how is not None and how.lower() not in ALIGNS:
        raise fail(spec.text, f"align '{how}' is unknown: use {', '.join(ALIGNS)} (affine: "
                   "each map's least-squares scale and shift to FP32's)")
    norm = spec.option("norm")
    if norm is not None and norm.lower() not in NORMS:
        raise fail(spec.text, f"norm '{norm}' is unknown: use {' or '.join(NORMS)} (l2: "
                   "nearest by cosine; none: by Euclidean distance of the raw embeddings)")
    blank = spec.option("blank")
    if blank is not None and not blank.lstrip("-").isdigit():
        raise fail(spec.text, f"blank '{blank}' is not a whole number: give the CTC blank "
                    "class (e.g. 0; -1: the last)")


__all__ = ["KINDS", "LAYOUT_NOTE", "QUOTE_HINT", "SYNTAX", "LayoutError", "LayoutSpec", "fail",
           "dfl_bins", "image_ranges", "number", "parse_layout", "rows"]
