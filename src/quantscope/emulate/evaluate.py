"""Run the FP32 and the QDQ model on the same batches and measure fidelity.

Fidelity per model output: cosine similarity between the FP32 and the emulated output
of each sample (flattened), mean and min over samples, and the SQNR of the whole output.
Task metrics (retrieval, verification) are computed by :mod:`quantscope.tasks` from the
same outputs.

Memory: the sessions an evaluation opens (:func:`open_runs`) allocate from one
process-wide arena (the FP32 run's memory serves the emulated runs), and
:func:`compare_model` / :func:`compare_models` score each emulated batch against the
reference as it comes, keeping only what the task reads of it (``keep``: e.g. the pooled
rows of a text encoder), so evaluation holds at most one set of raw outputs (FP32's, when
several plans share it), not one per model run. The numbers are the ones of running in
full and scoring after (tests/test_evaluate_streaming.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx

from quantscope.emulate.channels import (
    ChannelFidelity,
    ScalarFidelity,
    TopClasses,
    is_scalar,
)
from quantscope.emulate.class_axes import NONE_KEY, ClassAxis, read_axis
from quantscope.emulate.exact import ExactFidelity, is_exact
from quantscope.emulate.sample_powers import Powers, SamplePowers, figure_columns
from quantscope.emulate.session import make_session
from quantscope.model.load import Model
from quantscope.numerics import (
    RESEMBLE_MIN_COSINE,
    SameSamples,
    row_cosines,
    sqnr_db,
    sqnr_db_from_powers,
)
from quantscope.progress import feed_size, track
from quantscope.types import (
    Batch,
    Feeds,
    Metrics,
    Outputs,
    QuantscopeError,
    batch_rows,
    sample_first,
)

Keep = Callable[[tuple[np.ndarray, ...], Batch], tuple[np.ndarray, ...]]
"""One batch's outputs (and its feeds) -> what a task reads of them (``Task.keep``)."""


def run_model(
    proto: onnx.ModelProto,
    batches: Iterable[dict[str, np.ndarray]],
    *,
    label: str = "",
    optimize: bool = False,
    integer_kernels: bool = False,
) -> Outputs:
    """Run ``proto`` over every batch (progress on stderr when ``label`` is given), in a
    session with its own arena (freed with it: the outputs, copied out of it where they
    were views of it (:func:`owned`), are what stays)."""
    runs = open_runs(proto, batches, label, shared_arena=False, optimize=optimize,
                     integer_kernels=integer_kernels)
    return Outputs(names=runs.names, batches=tuple(out for out, _ in runs.batches))


@dataclass(frozen=True, eq=False)
class Runs:
    """An opened session's output names, and its outputs with the batch they came from,
    run one batch at a time as they are consumed (the session holds its own copy of the
    graph: the proto it was opened from may go before the runs)."""

    names: tuple[str, ...]
    batches: Iterator[tuple[tuple[np.ndarray, ...], Batch]]


def open_runs(proto: onnx.ModelProto, batches: Iterable[Batch], label: str = "", *,
              shared_arena: bool = True, **kw: bool) -> Runs:
    """A session of ``proto`` over ``batches``, not run yet (by default from the
    process-wide arena, which the FP32 and emulated runs of an evaluation share);
    ``label``: progress on stderr; ``kw``: :func:`make_session`'s options."""
    session = make_session(proto, shared_arena=shared_arena, **kw)
    inputs = {i.name for i in session.get_inputs()}

    def gen() -> Iterator[tuple[tuple[np.ndarray, ...], Batch]]:
        for batch in track(batches, label, unit="batch", show=bool(label), cost=feed_size):
            out = session.run(None, {n: v for n, v in batch.items() if n in inputs})
            check_sample_axes(out, batch, names)
            if not shared_arena:  # the session's own arena goes with it, not with them
                out = [owned(o) for o in out]
            yield tuple(sample_first(out, batch)), batch  # outputs read sample-first

    names = tuple(o.name for o in session.get_outputs())
    return Runs(names=names, batches=gen())


def owned(a: np.ndarray) -> np.ndarray:
    """``a``, or its copy where ONNX Runtime's memory holds it. A session's outputs may be
    views of its own arena (a capsule as their base), and one of them held keeps the whole
    arena resident: mobilefacenet's FP32 pass on the held-out faces, 88 kB of embeddings
    kept as the evaluation's reference, held its 243 MB arena through every pass after it
    (a release gave back nothing); IS-Net's plan search held its FP32 reference pass's
    arena as long as the reference (h74)."""
    if not isinstance(a, np.ndarray):  # a sequence or map output: ONNX Runtime's Python
        return a
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return a if isinstance(base, np.ndarray) else np.array(a)


def check_sample_axes(outputs: Sequence[np.ndarray], batch: Batch,
                      names: Sequence[str]) -> None:
    """Refuse an output that gives more than one value on its sample axis for a run of one
    sample (a model exported with its batch axis squeezed out, ``durations [L]`` of an
    ``ids [1, L]`` input): each of its values would be scored as a sample."""
    axes = getattr(batch, "out_axes", ())
    if not isinstance(batch, Feeds) or batch_rows(batch) != 1 or len(axes) > len(outputs):
        return
    for name, o, a in zip(names, outputs, axes, strict=False):
        shape = np.shape(o)
        if a < len(shape) and shape[a] != 1:
            ones = [k for k, d in enumerate(shape) if d == 1]
            fix = (f"if axis {ones[0]} holds it, declare --batch-axis {name}={ones[0]}"
                   if ones else "it has no sample axis: export the model with one (an "
                   "Unsqueeze of axis 0 before the output)")
            raise QuantscopeError(
                f"output '{name}' has shape {tuple(int(d) for d in shape)} for one sample "
                f"(the model takes one sample per run), so its axis {a} does not hold the "
                f"samples: each of its {shape[a]} values there would be scored as a sample; "
                f"{fix}")


def kept_runs(runs: Runs, keep: Keep | None) -> Outputs:
    """``runs`` consumed batch by batch, each batch's outputs reduced to what ``keep`` keeps
    as it comes (all of it without one): no batch's full outputs outlive its reduction
    (the same arrays as :func:`kept` of the whole outputs, batch for batch)."""
    return Outputs(names=runs.names, batches=tuple(
        out if keep is None else keep(out, b) for out, b in runs.batches))


def run_kept(proto: onnx.ModelProto, batches: Iterable[Batch], keep: Keep | None, *,
             label: str = "") -> Outputs:
    """:func:`run_model` reduced by ``keep`` batch by batch (:func:`kept_runs`)."""
    return kept_runs(open_runs(proto, batches, label, shared_arena=False), keep)


def kept(outputs: Outputs, batches: Iterable[Batch], keep: Keep | None) -> Outputs:
    """``outputs`` reduced batch by batch to what ``keep`` keeps (all of it without one)."""
    if keep is None:
        return outputs
    return Outputs(names=outputs.names, batches=tuple(
        keep(out, b) for out, b in zip(outputs.batches, batches, strict=True)))


def scale_error(ref: Outputs, test: Outputs, scale: float) -> Outputs:
    """``ref + scale * (test - ref)`` for every float array: the test outputs' error, of the
    same shape, ``scale`` times as large (non-float arrays are ``test``'s)."""
    batches = []
    for r_batch, t_batch in zip(ref.batches, test.batches, strict=True):
        batches.append(tuple(
            (r + np.float32(scale) * (t - r)).astype(t.dtype)
            if np.issubdtype(t.dtype, np.floating) and r.shape == t.shape else t
            for r, t in zip(r_batch, t_batch, strict=True)))
    return Outputs(names=test.names, batches=tuple(batches))


def compare_model(
    test: Runs, ref: Outputs, *, keep: Keep | None = None, only: str | None = None,
    judge: bool = True, channel_axes: Mapping[str, int] | None = None,
    per_sample: bool = False, top_classes: Mapping[str, TopClasses] | None = None,
    class_axes: Mapping[str, ClassAxis] | None = None,
    symbolic_axes: Mapping[str, Mapping[int, str]] | None = None,
    kept_names: Sequence[str] | None = None,
) -> tuple[Metrics, Outputs]:
    """Run ``test`` (opened on the batches ``ref`` was computed on), scoring each batch
    against ``ref``'s as it comes: (:func:`output_fidelity`, the outputs reduced by
    ``keep``). The same numbers as running first and scoring after; one batch of raw
    emulated outputs held at a time. ``kept_names``: only these outputs are kept after
    ``keep`` (None: every one; the task's figures read no other: :func:`kept_only`).
    ``per_sample``: the metrics' ``parts`` also hold the
    per-sample powers of the dB figures (:mod:`.sample_powers`); ``top_classes``: the
    outputs whose task decides by their top class (:class:`TopClasses`); ``class_axes``:
    the outputs whose task tells the axis of their classes (:class:`ClassAxis`), read by
    the per-channel figures instead of ``channel_axes``; ``symbolic_axes``: each output's
    axes the model declares symbolic, sample-first (axis -> the dim's name), which the
    default rule does not read as channels (:func:`.class_axes.read_axis`)."""
    acc = _Fidelity(ref.names, channel_axes, per_sample=per_sample, top_classes=top_classes,
                    class_axes=class_axes, symbolic_axes=symbolic_axes)
    out, pick = [], kept_only(test.names, kept_names)
    for (t, batch), r in zip(test.batches, ref.batches, strict=True):
        acc.add(r, t)
        out.append(pick(t if keep is None else keep(t, batch)))
    return (acc.metrics(only=only, judge=judge),
            Outputs(names=pick(test.names), batches=tuple(out)))


def compare_models(
    ref: Runs, test: Runs, *, keep: Keep | None = None, only: str | None = None,
    judge: bool = True, channel_axes: Mapping[str, int] | None = None,
    per_sample: bool = False, top_classes: Mapping[str, TopClasses] | None = None,
    class_axes: Mapping[str, ClassAxis] | None = None,
    symbolic_axes: Mapping[str, Mapping[int, str]] | None = None,
    kept_names: Sequence[str] | None = None,
) -> tuple[Metrics, Outputs, Outputs]:
    """The FP32 model's runs ``ref`` and ``test`` (opened on the same batches) in
    lock-step: (:func:`output_fidelity`, FP32 and emulated outputs reduced by ``keep``).
    The same numbers as :func:`run_model` then :func:`compare_model`, without holding
    FP32's raw outputs (``per_sample``, ``top_classes``, ``class_axes``,
    ``symbolic_axes``, ``kept_names`` as there)."""
    acc = _Fidelity(ref.names, channel_axes, per_sample=per_sample, top_classes=top_classes,
                    class_axes=class_axes, symbolic_axes=symbolic_axes)
    ref_out, out, pick = [], [], kept_only(ref.names, kept_names)
    for (r, batch), (t, _) in zip(ref.batches, test.batches, strict=True):
        acc.add(r, t)
        ref_out.append(pick(r if keep is None else keep(r, batch)))
        out.append(pick(t if keep is None else keep(t, batch)))
    return (acc.metrics(only=only, judge=judge),
            Outputs(names=pick(ref.names), batches=tuple(ref_out)),
            Outputs(names=pick(test.names), batches=tuple(out)))


def kept_only(names: Sequence[str], kept: Sequence[str] | None) -> Callable[[Sequence], tuple]:
    """What keeps, of a tuple in the order of ``names`` (a batch's outputs, or the names
    themselves), the entries of ``kept`` in that order (None: every entry). A plan's
    scoring kept every output of every batch whole for its task, whose figures read one
    of them: IS-Net's 12 outputs at 1024 x 1024, 118.5 MB a photo, for its matte's mask
    IoU (4 MB), on top of the FP32 reference (h74)."""
    if kept is None:
        return tuple
    index = [list(names).index(n) for n in kept]
    return lambda row: tuple(row[i] for i in index)


COSINE_ROWS = 4  # rows whose cosines are computed at once (each row's alone: same values)


class _Fidelity:
    """Per output: row cosines, noise and signal power, summed batch by batch in order
    (the order :func:`output_fidelity` always summed them in: the same floats), with one
    float64 copy of a batch's output alive at a time; and per channel
    (:class:`ChannelFidelity`) or, for one value per sample, :class:`ScalarFidelity`
    (decided on the first batch). ``channel_axes``: output name -> its channel axis
    (the graph's: a Concat's axis, a Conv's output axis); others by
    :func:`quantscope.numerics.default_channel_axis`; ``top_classes``: output name -> the
    classes its task decides by (:class:`TopClasses`); ``class_axes``: output name -> the
    axis its task reads its classes on (:class:`ClassAxis`), which the per-channel figures
    read before the graph's (:func:`quantscope.emulate.class_axes.read_axis`);
    ``symbolic_axes``: output name -> its axes the model declares symbolic (sample-first
    axis -> the dim's name), positions the default rule does not read as channels."""

    def __init__(self, names: tuple[str, ...], channel_axes: Mapping[str, int] | None = None,
                 *, per_sample: bool = False,
                 top_classes: Mapping[str, TopClasses] | None = None,
                 class_axes: Mapping[str, ClassAxis] | None = None,
                 symbolic_axes: Mapping[str, Mapping[int, str]] | None = None) -> None:
        self.names = names
        self.tops = dict(top_classes or {})
        self.claims = dict(class_axes or {})
        self.open_dims = dict(symbolic_axes or {})
        self.per_sample = per_sample  # also each sample's powers (:mod:`.sample_powers`)
        self.samples: list[SamplePowers | None] = [None] * len(names)
        self.axes = dict(channel_axes or {})
        self.cos: list[list[np.ndarray]] = [[] for _ in names]
        self.noise = [0.0] * len(names)
        self.power = [0.0] * len(names)
        self.parts: list[ChannelFidelity | ScalarFidelity | ExactFidelity | None] = [None] * len(names)
        self.seen = [False] * len(names)
        self.no_axis = [""] * len(names)  # why a task says the output has no channel axis
        self.same = [SameSamples() for _ in names]  # FP32's output the same on every sample

    def _part(self, i: int, a: np.ndarray) -> ChannelFidelity | ScalarFidelity | ExactFidelity | None:
        if not self.seen[i]:
            self.seen[i] = True
            if is_exact(a):
                self.parts[i] = ExactFidelity(a.dtype)
            elif is_scalar(a):
                self.parts[i] = ScalarFidelity()
            else:
                name = self.names[i]
                got = read_axis(a.shape, self.axes.get(name), self.claims.get(name),
                                self.open_dims.get(name))
                self.parts[i] = None if got.axis is None else ChannelFidelity(
                    got.axis, self.tops.get(name), got.read, got.positions)
                self.no_axis[i] = got.none  # the task says it has none: said in its entry
        return self.parts[i]

    def add(self, ref: tuple[np.ndarray, ...], test: tuple[np.ndarray, ...]) -> None:
        for i, (a, b) in enumerate(zip(ref, test, strict=True)):
            part = self._part(i, a)
            self.same[i].add(a)
            if isinstance(part, ExactFidelity):  # a label or index: equal or not, no power
                part.add(a, b)
                continue
            if part is not None and a.shape == b.shape:
                part.add(a, b)
            if self.per_sample:
                if self.samples[i] is None:
                    axis = part.axis if isinstance(part, ChannelFidelity) else None
                    self.samples[i] = SamplePowers(axis)
                self.samples[i].add(a, b)  # type: ignore[union-attr]
            if not isinstance(part, ScalarFidelity):
                self.cos[i].extend(row_cosines(a[k:k + COSINE_ROWS], b[k:k + COSINE_ROWS])
                                   for k in range(0, len(a), COSINE_ROWS))
            a64 = a.astype(np.float64)
            self.power[i] += float(np.sum(a64 ** 2))
            a64 -= b  # in place: a.astype(float64) - b
            self.noise[i] += float(np.sum(np.square(a64, out=a64)))

    def metrics(self, *, only: str | None, judge: bool) -> Metrics:
        tables: dict[str, dict[str, float]] = {}
        said: dict[str, tuple[list[str], bool]] = {}
        for i, name in enumerate(self.names):
            sqnr = sqnr_db_from_powers(self.power[i], self.noise[i])
            part = self.parts[i]
            if isinstance(part, ExactFidelity):
                tables[name] = part.table()
                said[name] = part.notes(name)
                continue
            if isinstance(part, ScalarFidelity):  # no cosine of one-value rows
                # one value per sample: the output is its own one channel
                tables[name] = {**part.table(), "sqnr_db": float(sqnr),
                                "sqnr_db_channel_min": float(sqnr)}
                said[name] = part.notes(name)
                continue
            cos = np.concatenate(self.cos[i])
            tables[name] = {"cosine_mean": float(cos.mean()), "cosine_min": float(cos.min()),
                            "cosine_p01": float(np.percentile(cos, 1)), "sqnr_db": float(sqnr)}
            if isinstance(part, ChannelFidelity):
                entry, bad = part.table()
                tables[name].update(entry)
                said[name] = (part.notes(name), bad)
            tables[name].setdefault("sqnr_db_channel_min", float(sqnr))  # no channel axis
            if self.no_axis[i]:
                tables[name][NONE_KEY] = self.no_axis[i]  # type: ignore[assignment]
        const = [n for n, s in zip(self.names, self.same, strict=True) if s.constant]
        out = _summary(tables, said, only=only, judge=judge, constant=const)
        if not self.per_sample:
            return out
        scored = [n for n in ([only] if only else self.names)
                  if not isinstance(self.parts[self.names.index(n)], ExactFidelity)]
        powers = {n: _read_whole(p.powers() if p is not None else None, part)
                  for n, p, part in zip(self.names, self.samples, self.parts, strict=True)}
        return replace(out, parts=figure_columns(powers, scored))


def _read_whole(powers: Powers | None, part: object) -> Powers | None:
    """An output read as positions (:attr:`ChannelFidelity.positions`) has no channel: its
    per-sample powers are one column (its whole figure), as its ``sqnr_db_channel_min``."""
    if powers is None or not (isinstance(part, ChannelFidelity) and part.positions):
        return powers
    return powers[0].sum(axis=1, keepdims=True), powers[1].sum(axis=1, keepdims=True)


def output_fidelity(
    ref: Outputs, test: Outputs, *, only: str | None = None, judge: bool = True,
    channel_axes: Mapping[str, int] | None = None,
    top_classes: Mapping[str, TopClasses] | None = None,
    class_axes: Mapping[str, ClassAxis] | None = None,
    symbolic_axes: Mapping[str, Mapping[int, str]] | None = None,
) -> Metrics:
    """Cosine (mean, min, p01) and SQNR per output (``tables``), the per-channel figures
    and, for one value per sample, errors and decisions instead of cosine
    (:mod:`quantscope.emulate.channels`); unprefixed: the worst output's value of each
    metric, so no output is left unscored (a note names which
    output is worst when there are several). ``judge``: say "NOT LIKE FP32" from the raw
    outputs (off when a task judges its own embeddings: raw token outputs include
    padding positions). ``top_classes``, ``class_axes``, ``symbolic_axes``:
    :func:`compare_model`'s."""
    acc = _Fidelity(ref.names, channel_axes, top_classes=top_classes, class_axes=class_axes,
                    symbolic_axes=symbolic_axes)
    for a, b in zip(ref.batches, test.batches, strict=True):
        acc.add(a, b)
    return acc.metrics(only=only, judge=judge)


WORST_OF = {"cosine_mean": min, "cosine_min": min, "cosine_p01": min, "sqnr_db": min,
            "sqnr_db_channel_min": min, "cosine_channel_min": min, "collapsed_channels": sum,
            "collapsed_never_top": sum, "collapsed_strings_kept": sum,
            "abs_err_max": max, "abs_err_mean": max, "rel_err_max": max,
            "decision_agreement": min, "exact_agreement": min, "channels_left_out": sum}
"""Unprefixed values: how each per-output entry combines over the scored outputs."""
COUNTS = ("collapsed_channels", "collapsed_never_top", "collapsed_strings_kept",
          "channels_left_out")  # ints


def _summary(tables: dict[str, dict[str, float]],
             said: dict[str, tuple[list[str], bool]] | None = None, *,
             only: str | None, judge: bool, constant: Sequence[str] = ()) -> Metrics:
    """The unprefixed (worst output's, or ``only``'s) values and the notes: "NOT LIKE
    FP32" when the worst output's cosine, a channel (collapsed, or its cosine) or a
    one-value output's decisions/error say so, with the lines naming where; last, each
    output (of ``constant``) that FP32 gives the same on every sample."""
    values: dict[str, float] = {}
    said = said or {}
    scored = {only: tables[only]} if only else tables
    for key, worst_of in WORST_OF.items():
        have = [t[key] for t in scored.values() if key in t]
        if have:
            values[key] = (worst_of(have) if key in COUNTS
                           else float(worst_of(have)))
    bad = [n for n in scored if said.get(n, ([], False))[1]]
    # the bad outputs' lines first: the line after "NOT LIKE FP32" names where (run's verdict)
    lines = [line for n in [*bad, *(n for n in scored if n not in bad)]
             for line in said.get(n, ([], False))[0]]
    notes: tuple[str, ...] = ()
    if judge and values.get("cosine_mean", 1.0) < RESEMBLE_MIN_COSINE:
        notes += (f"NOT LIKE FP32: output cosine to FP32 {values['cosine_mean']:.3f} < "
                  f"{RESEMBLE_MIN_COSINE:g} (worst output): the quantized model computes "
                  "something else",)
    elif judge and bad:
        notes += (f"NOT LIKE FP32: output(s) {', '.join(repr(n) for n in bad)} lose what FP32 "
                  "computes though the whole-output figures look close (below)",)
    notes += tuple(lines) if judge else ()
    if only and len(tables) > 1:
        notes += (f"scored on output '{only}' alone (--output); every output in 'outputs'",)
    elif len(tables) > 1:
        in_db = [n for n in tables if "sqnr_db" in tables[n]]  # not the exact (int) ones
        worst = f"lowest SQNR: '{min(in_db, key=lambda n: tables[n]['sqnr_db'])}'" if in_db else ""
        exact = [n for n in tables if "exact_agreement" in tables[n]]
        if exact:
            low = min(exact, key=lambda n: tables[n]["exact_agreement"])
            worst += ("; " if worst else "") + f"lowest exact agreement: '{low}'"
        notes += (f"{len(tables)} outputs scored; the metrics without an output name are the "
                 f"worst output's ({worst}); per output in 'outputs'",)
    notes += tuple(f"output '{n}' is the same on every sample in FP32 (it does not depend on "
                   "the input on this data): what it scores says little about the quantized "
                   "model" for n in constant if n in scored)
    return Metrics(values=values, tables=tables, notes=notes)


def evaluate_fidelity(
    model: Model,
    qdq: onnx.ModelProto,
    batches: list[dict[str, np.ndarray]],
    *,
    progress: bool = False,
) -> tuple[Metrics, Outputs, Outputs]:
    """FP32 vs emulated outputs on ``batches``: (fidelity, fp32 outputs, emulated outputs)."""
    ref = run_model(model.proto, batches, label="fp32" if progress else "")
    test = run_model(qdq, batches, label="emulated" if progress else "")
    return output_fidelity(ref, test), ref, test


__all__ = ["Keep", "Outputs", "Runs", "compare_model", "compare_models", "evaluate_fidelity",
           "kept", "open_runs", "output_fidelity", "run_model", "sqnr_db"]
