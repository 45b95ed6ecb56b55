"""What the verdict says besides its headline, read from the evaluation's records: the
data notes, outputs scored for fidelity only and their own figures, notes that the
headline says little, channels left out of the worst-channel figures, and ranges the
plan's held-out values clip (split from :mod:`quantscope.pipeline.verdict`, which
re-exports them)."""

from __future__ import annotations

import math
from typing import Any

from quantscope.emulate.class_axes import read_words
from quantscope.tasks.points_gate import KEPT as GATED
from quantscope.tasks.points_gate import NONE_KEPT
from quantscope.tasks.unscored import is_unscored_note, unscored_names
from quantscope.tasks.worst_output import MARK as WORST_OUTPUT
from quantscope.units import value

COMPARED = ("fp32", "a8_w8", "plan")


def _data_notes(data: dict[str, Any], words: str) -> list[str]:
    """The data notes (fit and held out, once each) holding ``words``."""
    notes = [str(n) for part in (data, data.get("fit") or {}, data.get("held_out") or {})
             for n in part.get("notes") or []]
    return list(dict.fromkeys(n for n in notes if words in n))


def _unscored(data: dict[str, Any]) -> list[str]:
    """The data notes naming outputs scored for fidelity only (not by the task, so their own
    error is not in the headline)."""
    return [n for n in _data_notes(data, "") if is_unscored_note(n)]


def _unscored_figures(notes: list[str], results: dict[str, Any]) -> list[str]:
    """Per output the notes name as scored for fidelity only, its held-out SQNR (and its
    worst channel's) at the plan and at uniform a8_w8: its error, which the headline is not."""
    plan, uniform = (results.get(k, {}).get("outputs") or {} for k in ("plan", "a8_w8"))
    names = [n for note in notes for n in unscored_names(note, list(plan))]

    def fig(out: dict[str, Any]) -> str:
        worst = out.get("sqnr_db_channel_min")
        # -inf: a channel with no FP32 signal (0 on every held-out value) and some error
        why = (": a channel FP32 gives 0 on every held-out value, the quantized model not"
               if worst == -math.inf else "")
        return (f"{value('sqnr_db', out.get('sqnr_db'))} (worst channel "
                f"{value('sqnr_db', worst)}{why})")

    def read(n: str) -> str:  # the axis the worst channel is of (the plan's entry's line)
        words = read_words(plan[n]) or read_words(uniform.get(n, {}))
        return f"; {words}" if words else ""

    return [f"output '{n}' (fidelity only) held out: SQNR {fig(plan[n])} at the plan, "
            f"{fig(uniform.get(n, {}))} at uniform a8_w8{read(n)}" for n in dict.fromkeys(names)]


def _channels_read(notes: list[str], results: dict[str, Any], metric: str) -> list[str]:
    """Where the headline is a worst channel's SQNR (tensor data's ``sqnr_db_channel_min``,
    or one output's), each output's worst channel at the plan held out and the axis its
    channels are on (the entry's line, :func:`read_words`: axis 1 of ``[N, T, C]`` read by
    default is its time steps), once per output; an output with no channel axis (one value
    per sample, or an axis of positions) whose figure is the headline's (the worst) is
    named too, its "worst channel" its whole SQNR (h70: nothing named it). An output scored
    for fidelity only is said with its figures (:func:`_unscored_figures`), not here."""
    key, _, only = metric.partition(":")
    if key != "sqnr_db_channel_min":
        return []
    plan = results.get("plan", {}).get("outputs") or {}
    said = {n for note in notes for n in unscored_names(note, list(plan))}
    figures = [e.get("sqnr_db_channel_min") for n, e in plan.items() if only in ("", n)]
    worst = min((f for f in figures if isinstance(f, int | float) and f == f), default=None)
    out = []
    for n, e in plan.items():
        figure = e.get("sqnr_db_channel_min")
        words = read_words(e) or (_no_channel(e) if figure == worst is not None else "")
        if words and n not in said and only in ("", n):
            out.append(f"output '{n}' worst channel {value('sqnr_db', figure)}: {words}")
    return out


def _no_channel(entry: dict[str, Any]) -> str:
    """What an output's worst-channel figure is where it has no channel axis: its whole
    SQNR, of one value per sample or of an axis read as positions."""
    if "positions_axis" in entry:
        return (f"no channel axis (axis {entry['positions_axis']} holds positions: frames, "
                "tokens), so its worst channel is its whole SQNR")
    if "sqnr_db_channel_min" in entry and "channel_axis" not in entry:
        return "one value per sample, so its worst channel is its whole SQNR (no channel axis)"
    return ""


def _outputs_headline(results: dict[str, Any]) -> str | None:
    """The plan's note naming which of several outputs the headline figure is (the worst
    one's) and each output's own figure held out (O-Net's boxes and landmarks), without
    its mark; None with one output."""
    notes = [str(n) for n in results.get("plan", {}).get("notes", [])]
    return next((n[len(WORST_OUTPUT):] for n in notes if n.startswith(WORST_OUTPUT)), None)


def _gated(results: dict[str, Any], *marks: str) -> list[str]:
    """The plan's notes counting the points judged where another output's score passes
    (``where=``; the held-out figure is over them alone), or saying none is (no figure);
    with ``marks`` (ON_PHOTO), the notes giving the distances in pixels of the photo
    (``photo=PX``)."""
    marks = marks or (GATED, NONE_KEPT)
    return [str(n) for n in results.get("plan", {}).get("notes", [])
            if any(m in str(n) for m in marks)]


def _says_little(results: dict[str, Any]) -> list[str]:
    """The task's notes that its headline says little on this data (FP32 picks one class,
    decides one way, or its map is on one side of the threshold everywhere): a goal reached
    on such data is no evidence."""
    notes = [str(n) for label in COMPARED for n in results.get(label, {}).get("notes", [])]
    return list(dict.fromkeys(n for n in notes if "says little" in n))


def _left_out(results: dict[str, Any]) -> list[str]:
    """The evaluation's lines counting channels left out of the worst-channel figures
    (FP32 0 on every held-out value: :func:`quantscope.numerics.worst_channel_sqnr_db`)."""
    from quantscope.numerics import LEFT_OUT

    notes = [str(n) for label in COMPARED for n in results.get(label, {}).get("notes", [])]
    return list(dict.fromkeys(n for n in notes if LEFT_OUT in n))


def _saturated_outputs(plan: dict[str, Any], outputs: list[dict[str, Any]],
                       shown: dict[str, tuple[float, float]] | None = None) -> list[str]:
    """Each quantized model output (its io row) whose calibrated range clips the plan's
    held-out values (``evaluate.json``'s ``saturation``, of the tensor whose encoding the
    output has: itself, or what a Reshape or no-op Cast before it reads): what the device
    returns is capped there, whatever the figure above says on average. An image output
    whose declared range (``shown``: ``--layout OUT=image:range=``) lies inside the
    calibrated one loses only values the host clips anyway (an ESRGAN's overshoot above
    255): said so, instead of asking for a wider range."""
    rows = {r["tensor"]: r for r in (plan.get("saturation") or {}).get("tensors", [])}
    lines = []
    for o in outputs:
        r = rows.get(o.get("encoded_as", o["tensor"]))
        if r is None:
            continue
        img = (shown or {}).get(o["tensor"])
        inside = img is not None and r["range_min"] <= img[0] and img[1] <= r["range_max"]
        advice = (f"every value clipped lies outside the image's declared range {img[0]:g} .. "
                  f"{img[1]:g}, which the host clips anyway: no value shown changes" if inside
                  else "calibrate on data like the deployment's, or widen its range")
        lines.append(f"output '{o['tensor']}' clips {r['below'] + r['above']:.2%} of its "
                     f"held-out values at its calibrated range {r['range_min']:.4g} .. "
                     f"{r['range_max']:.4g} (FP32 gives {r['data_min']:.4g} .. "
                     f"{r['data_max']:.4g}): {advice}")
    return lines


def _saturated_inside(plan: dict[str, Any], outputs: list[dict[str, Any]]) -> list[
        dict[str, Any]]:
    """The tensors other than the outputs' whose calibrated range clips the plan's
    held-out values, ``{tensor, share}``, most clipped first."""
    out = {o.get("encoded_as", o["tensor"]) for o in outputs}
    rows = [r for r in (plan.get("saturation") or {}).get("tensors", [])
            if r["tensor"] not in out]
    return sorted(({"tensor": r["tensor"], "share": r["below"] + r["above"]} for r in rows),
                  key=lambda r: -r["share"])
