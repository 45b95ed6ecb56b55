"""Frozen, typed values passed between stages.

Stages are plain functions of these values (file forms: :mod:`quantscope.serde`), never mutated.

Vocabulary
----------
=============  ===============================================================
Precision      one of ``a8_w8``, ``a8_w4``, ``a16_w8``, ``a16_w16``, ``float``:
               activation bits and weight bits of one decision group
QuantScheme    how values are stored: signedness/symmetry of activations and
               weights, per-channel weights (a target decides; Hailo-style default)
Encoding       scale + zero-point (+ bits, signedness, axis) of one tensor, ONNX
               convention ``q = clip(round(x / scale) + zero_point)``
Group          a decision unit: one anchor node (a weighted op or an op an integer
               NPU quantizes) plus the elementwise ops fused into it; its output
               tensors are quantized at the group's activation precision
Plan           group name -> precision, with a default
Batch          one model feed: input name -> array
Outputs        model outputs over a data set (per output, per batch)
Task           turns FP32 and emulated Outputs into task Metrics
Dataset        calibration + evaluation batches and the task scoring them
=============  ===============================================================
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np

from quantscope.lookup_range import LookupRange

# the longest sequence a model is run at (--seq-len, --lengths, a token input's
# --input-shape): every check and measurement runs the model at the length given (a token
# input of 10**9 ids is 8 GB before the model's first layer, and a model with no position
# table to refuse it ran out of memory); far above what an edge NPU compiles
MAX_SEQ_LEN = 65536


class QuantscopeError(Exception):
    """An error the user can fix; printed as one line by the CLI (no traceback)."""


class Precision(StrEnum):
    A8_W8 = "a8_w8"
    A8_W4 = "a8_w4"
    A16_W8 = "a16_w8"
    A16_W16 = "a16_w16"
    FLOAT = "float"

    @property
    def act_bits(self) -> int | None:  # read ~2 million times a real model's run: from a table
        return _BITS[self][0]

    @property
    def weight_bits(self) -> int | None:
        return _BITS[self][1]

    @classmethod
    def parse(cls, text: str) -> Precision:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise QuantscopeError(f"unknown precision '{text}': use one of " + ", ".join(cls)) from None


_BITS = {p: (None, None) if p is Precision.FLOAT else tuple(int(t[1:]) for t in p.split("_"))
         for p in Precision}  # (activation, weight) bits of each precision
PRECISION_ORDER: tuple[Precision, ...] = (  # narrowest first
    Precision.A8_W4, Precision.A8_W8, Precision.A16_W8, Precision.A16_W16, Precision.FLOAT)


@dataclass(frozen=True)
class QuantScheme:
    """How a target stores quantized values.

    Default: Hailo-style -- activations unsigned asymmetric with a zero-point, weights
    symmetric signed per output channel.
    """

    act_signed: bool = False
    act_symmetric: bool = False
    weight_signed: bool = True
    weight_symmetric: bool = True
    weight_per_channel: bool = True


@dataclass(frozen=True, eq=False)
class Encoding:
    """Quantization parameters of one tensor (ONNX convention).

    ``scale`` and ``zero_point`` are 0-d for per-tensor, 1-d along ``axis`` for
    per-channel encodings.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    bits: int
    signed: bool
    axis: int | None = None

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    def range(self) -> tuple[np.ndarray, np.ndarray]:
        """Real-valued (min, max) that this encoding represents."""
        lo = (self.qmin - self.zero_point.astype(np.float64)) * self.scale
        hi = (self.qmax - self.zero_point.astype(np.float64)) * self.scale
        return lo, hi


class GroupKind(StrEnum):
    WEIGHTED = "weighted"  # Conv / Gemm / MatMul with an initializer weight
    ACTIVATION = "activation"  # an op whose output an integer NPU requantizes


@dataclass(frozen=True)
class Group:
    """A decision unit. ``name`` is the anchor node's (original or assigned) name."""

    name: str
    op_type: str
    kind: GroupKind
    nodes: tuple[str, ...]  # anchor first, then fused nodes, topological order
    inputs: tuple[str, ...]  # activation tensors entering the group
    outputs: tuple[str, ...]  # tensors leaving the group (quantized at act precision)
    weight: str | None = None  # initializer name of the weight
    bias: str | None = None  # initializer name of the bias, if any
    weight_axis: int | None = None  # output-channel axis of the weight
    output_shape: tuple[int | str | None, ...] | None = None  # of outputs[0], if known
    depthwise: bool = False  # a Conv with one input channel per group (Hailo names it dw<i>)


@dataclass(frozen=True)
class Groups:
    """All decision groups of a model, plus sets of tensors that share one encoding."""

    groups: tuple[Group, ...]
    shared: tuple[tuple[str, ...], ...] = ()  # pass-through chains: same grid in and out
    model_inputs: tuple[str, ...] = ()  # float graph inputs that get quantized

    def by_name(self) -> dict[str, Group]:
        return {g.name: g for g in self.groups}

    def names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups)

    def input_read_as(self) -> dict[str, str]:
        """Tensor a group reads -> the model input it carries unchanged (the input itself,
        or a pass-through of it: an NHWC input's Transpose, a Reshape). The NPU converts
        the input once; every group reading it or a pass-through of it sets its grid."""
        inputs = set(self.model_inputs)
        out = {t: t for t in inputs}
        for chain in self.shared:
            if chain[0] in inputs:
                out.update({t: chain[0] for t in chain[1:]})
        return out

    def input_bits(self, plan: Plan) -> dict[str, int]:
        """Model input -> the activation bits it is quantized at: the most of the groups
        reading it (or a pass-through of it); an input that only float groups read is
        absent (it stays float). The emulation and every export read this one fact."""
        read_as = self.input_read_as()
        bits: dict[str, int] = {}
        for g in self.groups:
            b = plan.precision_of(g.name).act_bits
            if b is None:
                continue
            for t in g.inputs:
                if t in read_as:
                    bits[read_as[t]] = max(bits.get(read_as[t], 0), b)
        return {t: bits[t] for t in self.model_inputs if t in bits}


@dataclass(frozen=True)
class Plan:
    """Per-group precision, with a default for groups not listed."""

    default: Precision
    overrides: tuple[tuple[str, Precision], ...] = ()
    target: str | None = None
    reasons: tuple[tuple[str, str], ...] = ()  # group -> why it got its precision
    meta: tuple[tuple[str, str], ...] = ()  # free-form provenance (tool version, seed …)
    ranges: tuple[tuple[str, str], ...] = ()  # tensor -> range method overriding the stats'
    pinned: tuple[tuple[str, tuple[float, float]], ...] = ()  # tensor -> (lo, hi), e.g. learned

    def precision_of(self, group: str) -> Precision:
        return self._by_group.get(group, self.default)

    @functools.cached_property
    def _by_group(self) -> dict[str, Precision]:
        """The overrides as a dict, built once per plan (a plan is frozen; the cost model
        asks for every group of every plan at every length: the dict built on each call
        was a fifth of the deploy stage's cost table). Not a field: not in the plan's
        equality, its digest or its file."""
        return dict(self.overrides)

    @classmethod
    def uniform(cls, precision: Precision) -> Plan:
        return cls(default=precision)

    def phase_overrides(self) -> dict[str, dict[str, Precision]]:
        """A decoder plan's overrides for one phase graph only (``meta['phase_overrides']``,
        JSON ``{phase: {group: precision}}``): activation groups at 16 bit in the subnet
        where the target allows them (decode) but not in the other (prefill)."""
        text = dict(self.meta).get(PHASE_OVERRIDES)
        if not text:
            return {}
        return {phase: {g: Precision(v) for g, v in over.items()}
                for phase, over in json.loads(text).items()}

    def phase_ranges(self) -> dict[str, dict[str, str]]:
        """A decoder plan's range methods for one phase graph only (``meta['phase_ranges']``,
        JSON ``{phase: {tensor: method}}``): the phase graphs name some tensors apart (a
        group split along the tokens in prefill only), and each has its own calibration."""
        text = dict(self.meta).get(PHASE_RANGES)
        return {phase: dict(r) for phase, r in json.loads(text).items()} if text else {}

    def for_phase(self, phase: str) -> Plan:
        """The plan a phase graph runs: the shared overrides and range methods, then that
        phase's own."""
        extra = self.phase_overrides().get(phase)
        ranges = self.phase_ranges().get(phase)
        if not extra and not ranges:
            return self
        return dataclasses.replace(
            self, overrides=tuple({**dict(self.overrides), **(extra or {})}.items()),
            ranges=tuple({**dict(self.ranges), **(ranges or {})}.items()))


PHASE_OVERRIDES = "phase_overrides"  # Plan.meta key (see Plan.phase_overrides)
PHASE_RANGES = "phase_ranges"  # Plan.meta key (see Plan.phase_ranges)


@dataclass(frozen=True, kw_only=True)
class Sensitivity:
    """The planner's input from the analysis: predicted metric gain per group and precision.

    ``gains``: group -> precision -> gain of promoting that one group from ``low`` to that
    precision, in ``metric`` units, positive = better (for a lower-is-better metric a gain
    is a reduction); ``base``: the metric of uniform ``low``; ``reference``: the metric at
    full precision, to which a predicted quality is clipped. File forms: see
    :func:`quantscope.serde.sensitivity_from_dict`.
    """

    metric: str
    base: float
    gains: tuple[tuple[str, tuple[tuple[Precision, float], ...]], ...]
    higher_is_better: bool = True
    low: Precision = Precision.A8_W8
    reference: float | None = None
    source: str = ""

    @classmethod
    def from_gains(
        cls,
        metric: str,
        base: float,
        gains: Mapping[str, Mapping[Precision | str, float]],
        *,
        higher_is_better: bool = True,
        low: Precision = Precision.A8_W8,
        reference: float | None = None,
        source: str = "",
    ) -> Sensitivity:
        table = tuple(
            (str(g), tuple((Precision.parse(str(p)), float(v)) for p, v in per.items()))
            for g, per in gains.items()
        )
        return cls(metric=metric, base=float(base), gains=table, low=low, reference=reference,
                   higher_is_better=higher_is_better, source=source)

    def gain(self, group: str, precision: Precision) -> float | None:
        """Gain of ``group`` at ``precision`` over ``low``; 0 at ``low``; None if unknown."""
        if precision == self.low:
            return 0.0
        return self._table.get(group, {}).get(precision)

    @functools.cached_property
    def _table(self) -> dict[str, dict[Precision, float]]:  # made once: ~650k gains a run
        return {g: dict(per) for g, per in self.gains}

    def delta(self, group: str, old: Precision, new: Precision) -> float | None:
        a, b = self.gain(group, old), self.gain(group, new)
        return None if a is None or b is None else b - a

    def quality(self, total_gain: float) -> float:
        """Predicted metric for a summed gain, clipped to ``reference`` when given."""
        q = self.base + total_gain if self.higher_is_better else self.base - total_gain
        if self.reference is None:
            return q
        return min(q, self.reference) if self.higher_is_better else max(q, self.reference)


@dataclass(frozen=True, eq=False)
class TensorStats:
    """Streaming statistics of one tensor over the calibration set.

    ``hist`` counts values in ``hist_range`` (symmetric, ``[-r, r]``) with equal bins;
    ``channel_absmax`` is the max |x| per channel (axis 1 for 4-D tensors, else the
    last axis), for outlier analysis.
    """

    name: str
    min: float
    max: float
    count: int
    hist: np.ndarray
    hist_range: float
    channel_absmax: np.ndarray
    channel_axis: int
    # the floor cluster (values within a factor 2 of a negative ``min``, or exactly at a
    # non-negative one), its size, the smallest value above it and its largest value: a
    # constant far below the rest (a mask fill, -1e4, float32.min) shows here, a fill
    # nearly one value, a real outlier channel spread (None: not recorded, older files)
    bulk_min: float | None = None
    floor_count: int = 0
    floor_max: float | None = None
    # NaN / inf values the calibration met in this tensor: left out of ``min``/``max`` (the
    # histogram and channel maxima count them as 0); said by ``calibrate.nonfinite_note``
    nonfinite: int = 0
    # a lookup's output whose ``min``/``max`` are its table's (None: the data's)
    lookup: LookupRange | None = None

    def damage(self) -> str | None:
        """What no calibration writes (a range not finite or upside down, a negative count,
        histogram or channel maximum): an edited or damaged stats file; else None."""
        ends = [self.min, self.max, self.hist_range,
                *(v for v in (self.bulk_min, self.floor_max) if v is not None)]
        if not all(math.isfinite(v) for v in ends) or self.min > self.max:
            return f"tensor '{self.name}' has the range {self.min:g} .. {self.max:g}"
        chan = np.asarray(self.channel_absmax, dtype=np.float64)
        if (self.count < 0 or self.hist_range <= 0 or (np.asarray(self.hist) < 0).any()
                or not (np.isfinite(chan) & (chan >= 0)).all()):
            return (f"tensor '{self.name}' has a negative count, histogram range, histogram "
                    "or channel maximum")
        return None


@dataclass(frozen=True)
class Stats:
    tensors: dict[str, TensorStats]
    method: str = "minmax"  # default range-setting method for encode()
    num_batches: int = 0
    num_samples: int = 0


@dataclass(frozen=True)
class Problem:
    """One legality problem found by a preflight check.

    ``applies`` False: the rule's own test finds the group is not the kind of layer the
    rule was seen on (``hailo.attention_16bit`` on a Softmax that no activation x
    activation MatMul feeds), so the rule may not apply here. ``check`` still reports it
    at the rule's severity; the planner does not let such a warning block a move
    (``plan.start.Legality``), an error still does.
    """

    group: str
    rule: str
    reason: str
    provenance: str
    fix: str
    severity: str = "error"
    applies: bool = True


@dataclass(frozen=True)
class Metrics:
    """Named scalar metrics plus optional per-slice tables (e.g. TAR per distance)."""

    values: dict[str, float]
    tables: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # a dB figure's per-sample (signal, noise) powers, ``[samples, columns]`` (the figure
    # is the lowest column's pooled ratio), where asked for: its noise
    # (``quantscope.emulate.sample_powers``); empty: not kept
    parts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Encodings:
    """Everything the QDQ writer needs besides the plan: per-tensor encodings.

    ``activations`` maps an activation tensor name (a group output or a model input)
    to its encoding; ``weights`` maps a weight initializer name to its (usually
    per-channel) encoding. ``notes`` records decisions a user should know about (for
    example how an attention mask was handled).
    """

    activations: dict[str, Encoding]
    weights: dict[str, Encoding]
    scheme: QuantScheme = QuantScheme()
    notes: tuple[str, ...] = ()
    # tensors whose range leaves out a constant on purpose (attention masks): they clip by design
    clamped: tuple[str, ...] = ()


Batch = dict[str, np.ndarray]


class Feeds(dict):  # type: ignore[type-arg]
    """A batch (input name -> array) whose samples lie on another axis than 0 in some
    input (an LSTM state ``h [1, B, 8]``), or of a model that takes a fixed number of
    samples per run (a static export). Plain batches (every sample axis 0) stay dicts.

    ``axes``: the sample axis of each input that is not 0; ``out_axes``: the sample axis
    of each model output, in the model's output order; ``limit``: the most samples one run
    takes (the static size of the sample axis; 1 when ``mixes`` names nodes that mix a
    run's samples), None when any count runs. Use
    :func:`batch_rows`, :func:`take_rows` and :func:`concat_rows` to count, cut and join
    samples of any batch."""

    axes: dict[str, int]
    out_axes: tuple[int, ...]
    limit: int | None

    def __init__(self, arrays: Mapping[str, np.ndarray], axes: Mapping[str, int],
                 out_axes: tuple[int, ...] = (), limit: int | None = None, *,
                 mixes: tuple[str, ...] = ()) -> None:
        super().__init__(arrays)
        self.axes = {k: a for k, a in axes.items() if a}
        self.out_axes = tuple(out_axes)
        self.limit = limit
        self.mixes = tuple(mixes)

    def like(self, arrays: Mapping[str, np.ndarray]) -> Feeds:
        """Other arrays with this batch's axes."""
        return Feeds(arrays, self.axes, self.out_axes, self.limit, mixes=self.mixes)


SHARED = -1
"""The "sample axis" of an input that has none (a rank-0 sample rate, a scalar flag): every
batch gets it whole, and it never counts, cuts or joins samples."""


def sample_axis(batch: Mapping[str, np.ndarray], name: str) -> int:
    """The axis that holds the samples of input ``name`` of ``batch`` (0 unless a
    :class:`Feeds` says otherwise; :data:`SHARED` for an input without samples)."""
    return getattr(batch, "axes", {}).get(name, 0)


def batch_rows(batch: Mapping[str, np.ndarray]) -> int:
    """The number of samples in ``batch`` (along its first sampled input's axis)."""
    for name, arr in batch.items():
        axis = sample_axis(batch, name)
        if axis != SHARED:
            return int(np.shape(arr)[axis]) if np.ndim(arr) else 1
    return 1


def take_rows(batch: Mapping[str, np.ndarray], index: slice | np.ndarray | list[int]) -> Batch:
    """The samples ``index`` of ``batch``, each input cut along its own sample axis (a
    :data:`SHARED` input kept whole)."""
    def cut(name: str, v: np.ndarray) -> np.ndarray:
        axis = sample_axis(batch, name)
        if axis == SHARED:
            return v
        if isinstance(index, slice):
            return v[(slice(None),) * axis + (index,)]
        return np.take(v, np.asarray(index, dtype=np.int64), axis=axis)

    arrays = {k: cut(k, v) for k, v in batch.items()}
    return batch.like(arrays) if isinstance(batch, Feeds) else arrays


def keep_inputs(batch: Mapping[str, np.ndarray], names: set[str] | frozenset[str]) -> Batch:
    """The arrays of ``batch`` named in ``names`` (a session's inputs), layout kept."""
    arrays = {k: v for k, v in batch.items() if k in names}
    return batch.like(arrays) if isinstance(batch, Feeds) else arrays


def concat_rows(parts: list[Batch]) -> Batch:
    """The samples of every part, in order, in one batch (same inputs and layout)."""
    first = parts[0]
    arrays = {k: first[k] if sample_axis(first, k) == SHARED
              else np.concatenate([p[k] for p in parts], axis=sample_axis(first, k))
              for k in first}
    return first.like(arrays) if isinstance(first, Feeds) else arrays


def sample_first(outputs: list[np.ndarray] | tuple[np.ndarray, ...],
                 batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Model outputs (all of them, in the model's output order) with each one's sample
    axis moved to 0, as the fidelity and task metrics read them (unchanged for plain
    batches)."""
    axes = getattr(batch, "out_axes", ())
    if not any(axes) or len(axes) != len(outputs):
        return list(outputs)
    return [np.moveaxis(o, a, 0) if a and np.ndim(o) > a else o
            for o, a in zip(outputs, axes, strict=True)]


def moved_axis(axis: int, sample_axis: int, rank: int) -> int:
    """Where axis ``axis`` of an output as the model declares it (of ``rank`` axes; -1 the
    last) lies once :func:`sample_first` has moved its ``sample_axis`` to 0: the one
    translation of a user's (or the graph's) axis to the arrays the tasks score."""
    a = axis + rank if axis < 0 else axis
    if not sample_axis or a < 0 or a > sample_axis:  # one it has not: still out of range
        return axis if not sample_axis or a < 0 else a
    return 0 if a == sample_axis else a + 1


@dataclass(frozen=True, eq=False)
class Outputs:
    """Model outputs over a data set: one list of per-batch arrays per output name."""

    names: tuple[str, ...]
    batches: tuple[tuple[np.ndarray, ...], ...]

    def concat(self, name: str) -> np.ndarray | None:
        """All batches of one output along axis 0 (None if batch shapes differ)."""
        i = self.names.index(name)
        parts = [b[i] for b in self.batches]
        if len({p.shape[1:] for p in parts}) != 1:
            return None
        return np.concatenate(parts, axis=0)


@dataclass(frozen=True)
class RowScoring:
    """How the analysis scores a task on reduced rows (``quantscope.analyze.scoring``).

    ``reduce(outputs, feeds) -> [B, D]`` rows of one batch; ``score(ref_rows, test_rows)``
    -> ``{metric: value}`` over the whole data set; ``primary``: the key of that dict the
    analysis ranks by; ``row_local``: ``score`` is valid on any subset of rows.
    """

    reduce: Callable[[Sequence[np.ndarray], Mapping[str, np.ndarray]], np.ndarray]
    score: Callable[[np.ndarray, np.ndarray], dict[str, float]]
    primary: str
    higher_is_better: bool = True
    row_local: bool = False


@dataclass(frozen=True)
class PooledEmbedding:
    """What a task reads of the outputs: output ``output_index`` mean-pooled over the
    ``mask`` input and L2-normalised (sentence encoders); the fine-tune distils it."""

    output_index: int
    mask: str | None


class Task(Protocol):
    """A task turns FP32 and emulated outputs of the eval batches into task metrics, and
    decides the headline metric a plan on its data is judged by.

    ``headline``: the key of :meth:`metrics`' values that is "the" metric (the planner
    measures it, the run's verdict and ``--goal`` are in it); ``higher_is_better``: its
    direction; ``goal_range``: the values a goal in it can take. ``row_scoring(output_names)``:
    how the analysis scores reduced rows (None: every output's fidelity); ``objective()``: what
    the fine-tune distils (None: every float output). ``quantscope.tasks.headline`` reads
    them (and gives tensor data with no task its default).
    """

    name: str

    @property
    def headline(self) -> str: ...

    @property
    def higher_is_better(self) -> bool: ...

    @property
    def goal_range(self) -> tuple[float, float]: ...

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics: ...

    def row_scoring(self, output_names: Sequence[str]) -> RowScoring | None: ...

    def objective(self) -> PooledEmbedding | None: ...


@dataclass(frozen=True, eq=False)
class Dataset:
    """Calibration and evaluation batches, plus the task that scores them (if any)."""

    name: str
    calibration: tuple[Batch, ...]
    evaluation: tuple[Batch, ...]
    task: Task | None = None
    notes: tuple[str, ...] = ()
    token_lengths: np.ndarray | None = None  # untruncated, per evaluation text (text data)
    output: str | None = None  # the one model output to score (--output); None: all, worst

    def calibration_batches(self) -> Iterator[Batch]:
        yield from self.calibration
