"""Fidelity that a scale mix or a one-value output cannot fool (streamed, batch by batch).

A whole-output cosine or SQNR is dominated by the output's largest values: a detector
output that concatenates boxes (0-640 px) with class probabilities (0-0.9) keeps cosine
0.9999 while every probability rounds to 0 on the one 8-bit grid. And the cosine of a
one-value row is 1 whenever both values have the same sign. So, besides the whole-output
figures (:mod:`quantscope.emulate.evaluate`):

**Per channel** (:class:`ChannelFidelity`): a channel is one index of the output's channel
axis (the axis its task decides on, else the graph's, e.g. a Concat's axis, else the
default: :func:`quantscope.emulate.class_axes.channel_axis_read`), all samples and
positions together.

========================  ==================================================================
``sqnr_db_channel_min``   the worst channel's SQNR (dB): ``10 log10(sum r^2 / sum (r-t)^2)``
                          over the channel's values (rules of
                          :func:`quantscope.numerics.sqnr_db_from_powers`), leaving out a
                          channel FP32 holds at exactly 0 (a ReLU unit the data never
                          activates: -inf at any precision;
                          :func:`quantscope.numerics.worst_channel_sqnr_db`); so does
                          ``cosine_channel_min``; ``channels_left_out`` counts them
                          (a note names the output)
``cosine_channel_min``    the worst channel's cosine between its FP32 and emulated values
                          (all samples flattened; 1.0 when identical, 0.0 when one is zero)
``collapsed_channels``    channels that collapse: at least ``COLLAPSE_SHARE`` (99 %) of the
                          emulated values equal one value (the lower median of the channel's
                          emulated values in the first batch that has it), while FP32's do
                          not (under 99 % equal their own such value), and the channel's
                          SQNR is below ``COLLAPSE_MAX_SQNR_DB`` (what was erased mattered),
                          and the channel is not dead (FP32's largest ``|x|`` in it above
                          float32's resolution, ``DEAD``, of the output's largest: a
                          Softmax class at 1e-24 next to one at 1 carries nothing to lose)
``collapsed_never_top``   for an output whose host decides by its largest class
                          (:class:`TopClasses`, given by the output's task: class scores,
                          CTC steps, pitch bins) when the channels are those classes: the
                          channels that would count as collapsed but that neither FP32 nor
                          the quantized model ranks first on any sample or position of this
                          data (nor, for pitch, within the bins the host averages around the
                          top one), while FP32 ranks several classes first (data of one
                          class says nothing of the others): they change no decision, so
                          they are counted here, not in ``collapsed_channels``, and judge
                          nothing (neither their collapse nor their cosine); a collapsed
                          class that is FP32's top somewhere, or the quantized model's (a
                          class that wins only when quantized), still counts. A detector's
                          class rows are thresholded, not ranked: no :class:`TopClasses`
``collapsed_strings_kept`` for an output whose samples are read as one sequence of their
                          steps' top classes (a CTC string: :attr:`TopClasses.moves`): the
                          channels that would count as collapsed, that some step ranks
                          first, but whose step changes (the steps where FP32 or the
                          quantized model ranks the class first and the two differ) change
                          no sample's string, measured both ways (applied alone to FP32's
                          steps, undone alone from the quantized model's): counted here and
                          not judged, as ``collapsed_never_top``; one whose changes change a
                          string still counts, and its line says on how many samples
``channel_axis``          the axis the channels are read on; ``channel_worst`` the index of
                          the lowest-SQNR channel; ``channel_axis_read`` says which axis,
                          how many channels it holds and why (``axis 2, 97 channels: the
                          classes of the declared ctc layout``)
``positions_axis``        instead of every entry above, when the axis changes length between
                          samples or batches (frames of speech, tokens): it holds positions,
                          not channels, the last ones reached by the longest samples only (a
                          "channel" two samples reach, small against the output's range,
                          read as collapsed: hibari's ``f0``); no per-channel figure is
                          made along it, and a note says so with the lengths and how many
                          samples reach the last position. The same when the model declares
                          the axis symbolic and no axis of fixed length is left to read
                          (:func:`quantscope.emulate.class_axes.read_axis`), on data of one
                          length too (padding frames FP32 holds near 0 read "collapsed")
========================  ==================================================================

**Scalar outputs** (:class:`ScalarFidelity`, one value per sample: ``[N]``, ``[N, 1]``,
``[N, 1, 1, 1]``):
no cosine. ``abs_err_max``, ``abs_err_mean`` (``|t - r|``), ``rel_err_max``
(``abs_err_max`` over FP32's range ``max - min``: the error as a share of what the output
spans; ``abs_err_max`` alone when FP32 is constant), ``decision_agreement`` (the share of
samples on the same side of ``decision_threshold`` as FP32: 0.5 when every FP32 value lies in
[0, 1], a probability, else 0), also under ``decision_agreement@<threshold>``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from quantscope.emulate.class_axes import KEY
from quantscope.numerics import (
    DEAD,
    RESEMBLE_MIN_COSINE,
    left_out_note,
    signal_channels,
    sqnr_db_from_powers,
    worst_channel_sqnr_db,
)
from quantscope.types import moved_axis
from quantscope.units import value

COLLAPSE_SHARE = 0.99  # share of a channel's values on one emulated value: collapsed
COLLAPSE_MAX_SQNR_DB = 20.0  # a "collapse" that keeps 20 dB erased nothing that mattered
DECISION_MIN_AGREEMENT = 0.95  # scalar outputs: fewer samples decided as FP32: NOT LIKE FP32
SCALAR_MAX_REL_ERR = 0.25  # scalar outputs: a larger error (share of FP32's range): NOT LIKE


@dataclass(frozen=True)
class TopClasses:
    """An output whose host decides by its largest class on ``axis`` (of the output as the
    model declares it; -1 the last), each sample or position alone: a classifier's top-1,
    a CTC step's greedy pick, a pitch tracker's top bin. ``sample_axis``: the output's axis
    of the samples (``--batch-axis``); ``reach``: the bins each side of the top one the host
    reads too (a pitch's weighted mean); 0 for an argmax alone; ``floor``: the top value
    below which the host reads the top value alone (a pitch's voicing threshold: an
    unvoiced frame has no pitch), so ``reach`` counts only around tops at or above it;
    ``moves``: for a sample read as one sequence of its steps' tops (a CTC string), which
    classes' step changes change that reading."""

    axis: int
    sample_axis: int = 0
    reach: int = 0
    floor: float | None = None
    # a sequence read from its steps' tops (a CTC string): FP32's and the quantized model's
    # tops ``[N, steps]`` of ``classes`` -> per class, the samples whose reading its step
    # changes change (:func:`quantscope.tasks.ctc.string_moves`); None: each step alone
    moves: Callable[[np.ndarray, np.ndarray, int], np.ndarray] | None = None


def is_scalar(a: np.ndarray) -> bool:
    """One value per sample: ``[N]``, ``[N, 1]``, ``[N, 1, 1, 1]`` (a tf2onnx export's 1x1
    Conv logit in NHWC; rank 0 too)."""
    return a.ndim <= 1 or (a.ndim >= 2 and all(d == 1 for d in a.shape[1:]))


def _lower_median(rows: np.ndarray) -> np.ndarray:
    k = (rows.shape[1] - 1) // 2
    return np.partition(rows, k, axis=1)[:, k]


class ChannelFidelity:
    """One output's per-channel sums, grown when a later batch has a longer axis (then
    the axis holds positions, :attr:`positions`, and no channel figure is made); memory:
    a few floats per channel."""

    def __init__(self, axis: int, top: TopClasses | None = None, read: str = "",
                 symbolic: str = "") -> None:
        self.axis = axis
        self.read = read  # which axis and why (:func:`.class_axes.read_axis`)
        # the model's name of the axis when it declares it symbolic and no axis of fixed
        # length is left to read (:attr:`.class_axes.AxisRead.positions`): positions
        self.symbolic = symbolic
        self.top = top  # the output's classes, when its host decides by the largest
        self.top_on: bool | None = None  # they are this axis' channels (on the first batch)
        self.n = 0
        names = ("power", "noise", "dot", "tpow", "count", "t_hits", "f_hits")
        self.sums = {k: np.zeros(0) for k in names}
        self.t_val = np.zeros(0)
        self.f_val = np.zeros(0)
        self.f_min = np.zeros(0)
        self.f_max = np.zeros(0)
        self.t_min = np.zeros(0)
        self.t_max = np.zeros(0)
        self.out_min, self.out_max = np.inf, -np.inf
        self.sizes: set[int] = set()  # the axis' lengths seen: more than one, positions
        self.reach = np.zeros(0, np.int64)  # samples reaching each index of the axis
        self.samples = 0
        # per channel: the rows (samples, positions) FP32 ranks it first on, the quantized
        # model, and both
        self.won_fp32 = np.zeros(0, np.int64)
        self.won_test = np.zeros(0, np.int64)
        self.won_both = np.zeros(0, np.int64)
        self.near = np.zeros(0, bool)  # a top within ``reach`` is read (at or above floor)
        self.moved = np.zeros(0, np.int64)  # samples whose string its step changes change

    @property
    def positions(self) -> bool:
        """The axis changes length between samples or batches (frames, tokens), or the
        model declares it symbolic (:attr:`symbolic`): it is read as positions, not
        channels, and no per-channel figure is made along it."""
        return len(self.sizes) > 1 or bool(self.symbolic)

    def _grow(self, c: int) -> None:
        extra = c - self.n
        if extra <= 0:
            return
        for k in self.sums:
            self.sums[k] = np.concatenate([self.sums[k], np.zeros(extra)])
        self.t_val = np.concatenate([self.t_val, np.full(extra, np.nan)])
        self.f_val = np.concatenate([self.f_val, np.full(extra, np.nan)])
        self.f_min = np.concatenate([self.f_min, np.full(extra, np.inf)])
        self.t_min = np.concatenate([self.t_min, np.full(extra, np.inf)])
        self.f_max = np.concatenate([self.f_max, np.full(extra, -np.inf)])
        self.t_max = np.concatenate([self.t_max, np.full(extra, -np.inf)])
        self.reach = np.concatenate([self.reach, np.zeros(extra, np.int64)])
        self.won_fp32 = np.concatenate([self.won_fp32, np.zeros(extra, np.int64)])
        self.won_test = np.concatenate([self.won_test, np.zeros(extra, np.int64)])
        self.won_both = np.concatenate([self.won_both, np.zeros(extra, np.int64)])
        self.near = np.concatenate([self.near, np.zeros(extra, bool)])
        self.moved = np.concatenate([self.moved, np.zeros(extra, np.int64)])
        self.n = c

    def add(self, ref: np.ndarray, test: np.ndarray) -> None:
        if ref.size == 0 or self.axis >= ref.ndim:
            return
        r = np.moveaxis(np.asarray(ref, np.float64), self.axis, 0).reshape(ref.shape[self.axis], -1)
        t = np.moveaxis(np.asarray(test, np.float64), self.axis, 0).reshape(r.shape)
        c = len(r)
        self._grow(c)
        rows = ref.shape[0] if self.axis != 0 and ref.ndim else 1  # samples in the batch
        self.sizes.add(c)
        self.reach[:c] += rows
        self.samples += rows
        new = np.isnan(self.t_val[:c])
        if new.any():
            self.t_val[:c][new] = _lower_median(t)[new]
            self.f_val[:c][new] = _lower_median(r)[new]
        s = self.sums
        s["power"][:c] += np.sum(r * r, axis=1)
        s["noise"][:c] += np.sum((r - t) ** 2, axis=1)
        s["dot"][:c] += np.sum(r * t, axis=1)
        s["tpow"][:c] += np.sum(t * t, axis=1)
        s["count"][:c] += r.shape[1]
        s["t_hits"][:c] += np.sum(t == self.t_val[:c, None], axis=1)
        s["f_hits"][:c] += np.sum(r == self.f_val[:c, None], axis=1)
        self.f_min[:c] = np.minimum(self.f_min[:c], r.min(axis=1))
        self.f_max[:c] = np.maximum(self.f_max[:c], r.max(axis=1))
        self.t_min[:c] = np.minimum(self.t_min[:c], t.min(axis=1))
        self.t_max[:c] = np.maximum(self.t_max[:c], t.max(axis=1))
        self.out_min = min(self.out_min, float(r.min()))
        self.out_max = max(self.out_max, float(r.max()))
        if self.top_on is None:
            self.top_on = self.top is not None and (
                moved_axis(self.top.axis, self.top.sample_axis, ref.ndim) % ref.ndim == self.axis)
        if self.top_on and r.shape[1]:
            top_r, top_t = r.argmax(axis=0), t.argmax(axis=0)
            self.won_fp32[:c] += np.bincount(top_r, minlength=c)
            self.won_test[:c] += np.bincount(top_t, minlength=c)
            self.won_both[:c] += np.bincount(top_r[top_r == top_t], minlength=c)
            if self.top is not None and self.top.reach:
                self.near[:c] |= self._read_tops(r, top_r) | self._read_tops(t, top_t)
            if self.top is not None and self.top.moves is not None:  # samples first
                n = ref.shape[0]
                self.moved[:c] += self.top.moves(top_r.reshape(n, -1), top_t.reshape(n, -1), c)

    def _read_tops(self, rows: np.ndarray, tops: np.ndarray) -> np.ndarray:
        """The channels whose neighbours within ``reach`` the host reads: the top ones of
        the columns of ``rows`` ``[C, M]`` whose top value reaches ``floor``."""
        floor = None if self.top is None else self.top.floor
        read = tops if floor is None else tops[rows.max(axis=0) >= floor]
        return np.bincount(read, minlength=len(rows)) > 0

    def table(self) -> tuple[dict[str, float], bool]:
        """(this output's channel entries, whether a channel is bad enough for NOT LIKE
        FP32: one collapses, or the worst judged channel's cosine is under
        RESEMBLE_MIN_COSINE; a judged channel is live (not dead) and, for an output decided
        by its top class, decides something (:meth:`_idle`)). Empty when no channel was
        seen; only ``positions_axis`` when the axis varies by sample (:attr:`positions`)."""
        if self.n == 0:
            return {}, False
        if self.positions:
            return {"positions_axis": int(self.axis)}, False
        s = self.sums
        cos = self._cosines()
        erased, judged, idle, kept = self._kinds()
        collapsed = erased & judged
        worst_sqnr, worst, left_out = worst_channel_sqnr_db(s["power"], s["noise"])
        # a channel FP32 holds at 0 has no cosine to judge either
        cos_min = float(cos[signal_channels(s["power"])].min())
        entry = {"sqnr_db_channel_min": worst_sqnr, "cosine_channel_min": cos_min,
                 "collapsed_channels": int(collapsed.sum()),
                 **({"collapsed_never_top": int((erased & idle).sum())} if idle.any() else {}),
                 **({"collapsed_strings_kept": int((erased & kept).sum())} if kept.any() else {}),
                 "channel_axis": int(self.axis),
                 **({KEY: self.read} if self.read else {}),
                 "channel_worst": worst, **({"channels_left_out": left_out} if left_out else {})}
        # a dead channel's cosine (0 when it quantizes to 0) judges nothing: the judged ones'
        return entry, bool(collapsed.any() or (judged.any() and cos[judged].min() < RESEMBLE_MIN_COSINE))

    def _sqnr(self) -> np.ndarray:
        s = self.sums
        return np.array([sqnr_db_from_powers(float(p), float(q))
                         for p, q in zip(s["power"], s["noise"], strict=True)])

    def _kinds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(the channels erased (:meth:`_erased`), those judged: live, not idle and not
        kept, those idle: live but deciding nothing (:meth:`_idle`), those kept: live,
        winning steps, but changing no sample's reading (:meth:`_kept`))."""
        live = ~self._dead()
        idle = live & self._idle()
        kept = live & ~idle & self._kept()
        return self._erased(self._sqnr()), live & ~idle & ~kept, idle, kept

    def _kept(self) -> np.ndarray:
        """Of an output whose samples are read as sequences of their steps' tops
        (:attr:`TopClasses.moves`, a CTC string; :meth:`_ranked`), the classes whose step
        changes change no sample's reading on this data (a class no step changes
        included); none elsewhere."""
        if not self._ranked() or self.top is None or self.top.moves is None:
            return np.zeros(self.n, bool)
        return self.moved == 0

    def _idle(self) -> np.ndarray:
        """Channels of an output decided by its top class (:class:`TopClasses`, on this
        axis) that neither FP32 nor the quantized model ranks first on any sample or
        position (nor within ``reach`` of one that is), where FP32 ranks at least two
        classes first: none of them can change a decision on this data. None elsewhere
        (data of one FP32 class says nothing of the others)."""
        if not self._ranked() or self.top is None:
            return np.zeros(self.n, bool)
        won = (self.won_fp32 > 0) | (self.won_test > 0)
        k = self.top.reach
        if k > 0:  # every bin within reach of a top one the host reads around
            won |= np.convolve(self.near.astype(np.int64), np.ones(2 * k + 1, np.int64),
                               "same") > 0
        return ~won

    def _cosines(self) -> np.ndarray:
        """Each channel's cosine between its FP32 and emulated values."""
        s = self.sums
        den = np.sqrt(s["power"] * s["tpow"])
        return np.where(s["noise"] == 0, 1.0,
                        np.where(den > 0, s["dot"] / np.where(den > 0, den, 1), 0.0))

    def _erased(self, sqnr: np.ndarray) -> np.ndarray:
        """Channels whose emulated values sit on one value while FP32's vary, and whose
        SQNR is below ``COLLAPSE_MAX_SQNR_DB``."""
        s = self.sums
        count = np.maximum(s["count"], 1)
        return ((s["t_hits"] / count >= COLLAPSE_SHARE) & (s["f_hits"] / count < COLLAPSE_SHARE)
                & (sqnr < COLLAPSE_MAX_SQNR_DB))

    def _dead(self) -> np.ndarray:
        """Channels whose FP32 values are all within ``DEAD`` of the output's largest."""
        peak = np.maximum(np.abs(self.f_min), np.abs(self.f_max))
        return peak <= DEAD * max(abs(self.out_min), abs(self.out_max))

    def notes(self, name: str) -> list[str]:
        """One line per kind of bad channel (the worst collapsed one, the worst cosine),
        then the channels not judged (idle, dead, left out)."""
        entry, _ = self.table()
        if not entry:
            return []
        if self.positions:
            return [self._positions_note(name)]
        s = self.sums
        count = np.maximum(s["count"], 1)
        sqnr = self._sqnr()
        grid = f"one grid spans {self.out_min:.4g} to {self.out_max:.4g} (FP32 range of the output)"
        out, dead_line = [], []  # the judging lines first: run's verdict quotes the first
        erased, judged, idle, kept = self._kinds()
        dead = self._dead()
        collapsed = np.flatnonzero(erased & judged)
        cos = self._cosines()
        low = cos < RESEMBLE_MIN_COSINE
        if (kept & (erased | low)).any():
            dead_line.append(self._kept_note(name, erased & kept, kept & ~erased & low))
        if (idle & (erased | low)).any():
            dead_line.append(self._idle_note(name, erased & idle, idle & ~erased & low))
        if (erased & dead).any():
            peak = np.maximum(np.abs(self.f_min), np.abs(self.f_max))[erased & dead].max()
            dead_line.append(f"output '{name}': {int((erased & dead).sum())} of {self.n} channels of "
                       f"axis {self.axis} quantize to one value but are dead on this data (FP32 "
                       f"|x| at most {peak:.4g}, within float32's resolution of the output's "
                       "largest): not counted as collapsed nor judged (sqnr_db_channel_min and "
                       "cosine_channel_min still include them, except a channel FP32 holds at "
                       "exactly 0: it has no signal to measure noise against, counted below)")
        if len(collapsed):
            c = self._shown(collapsed, sqnr)
            share = s["t_hits"][c] / count[c]
            what = "every value quantizes" if share == 1 else f"{share:.1%} of its values quantize"
            top = self._why_judged(c)
            out.append(f"output '{name}' channel {c} of axis {self.axis}: {what} to "
                       f"{self.t_val[c]:.4g} (FP32 {self.f_min[c]:.4g} to {self.f_max[c]:.4g}){top}: "
                       f"{grid}; {len(collapsed)} of {self.n} channels collapse")
        live = np.flatnonzero(judged)
        if len(live) and cos[live].min() < RESEMBLE_MIN_COSINE and not len(collapsed):
            c = int(live[np.argmin(cos[live])])
            out.append(f"output '{name}' channel {c} of axis {self.axis}: cosine to FP32 "
                       f"{cos[c]:.3f}, SQNR {sqnr[c]:.1f} dB (FP32 "
                       f"{self.f_min[c]:.4g} to {self.f_max[c]:.4g}, emulated {self.t_min[c]:.4g} "
                       f"to {self.t_max[c]:.4g}): {grid}")
        left = int(entry.get("channels_left_out", 0))
        return out + dead_line + ([left_out_note(name, left, self.n, self.axis)] if left else [])

    def _shown(self, collapsed: np.ndarray, sqnr: np.ndarray) -> int:
        """The collapsed channel a note names: the lowest SQNR; of an output decided by its
        top class, first the one whose rows change their top class most (FP32's picks of
        it lost, and the quantized model's picks of it where FP32 picks another)."""
        if not self._ranked():
            return int(collapsed[np.argmin(sqnr[collapsed])])
        changed = self.won_fp32 + self.won_test - 2 * self.won_both
        return int(collapsed[np.lexsort((sqnr[collapsed], -changed[collapsed]))[0]])

    def _ranked(self) -> bool:
        """The output is decided by its top class on this axis and FP32 ranks at least two
        classes first on the data (:meth:`_idle` applies)."""
        return bool(self.top_on) and np.count_nonzero(self.won_fp32) >= 2

    def _why_judged(self, c: int) -> str:
        """Why collapsed channel ``c`` of an output decided by its top class is judged."""
        if not self._ranked():
            return ""
        rows = int(self.sums["count"][c])
        moved = (f"; its step changes change the decoded string of {int(self.moved[c])} of "
                 f"{self.samples} samples" if self.top is not None and self.top.moves else "")
        if self.won_fp32[c]:
            return (f"; FP32 ranks it first on {int(self.won_fp32[c])} of its {rows} values "
                    f"(samples, positions), the quantized model on {int(self.won_both[c])} "
                    f"of them and {int(self.won_test[c] - self.won_both[c])} others{moved}")
        if self.won_test[c]:
            return (f"; the quantized model ranks it first on {int(self.won_test[c])} of its "
                    f"{rows} values (samples, positions), FP32 never{moved}")
        top = self.top or TopClasses(0)
        at = f" whose value reaches {top.floor:g}" if top.floor is not None else ""
        return f"; it lies within {top.reach} bins of a top one{at}"

    def _idle_note(self, name: str, which: np.ndarray, far: np.ndarray) -> str:
        """The line saying the collapsed channels (``which``) and those of a cosine under
        RESEMBLE_MIN_COSINE (``far``) that decide nothing (:meth:`_idle`)."""
        peak = np.maximum(np.abs(self.f_min), np.abs(self.f_max))[which | far].max()
        low = f"of a cosine to FP32 under {RESEMBLE_MIN_COSINE:g}"
        what = " and ".join(
            ([f"{int(which.sum())} collapsed classes"] if which.any() else [])
            + ([f"{int(far.sum())} {'more ' if which.any() else ''}classes {low}"]
               if far.any() else []))
        near = (f" nor within {self.top.reach} bins of one that is (the bins the host "
                "averages" + (f" where the top value reaches {self.top.floor:g}"
                              if self.top.floor is not None else "") + ")"
                if self.top is not None and self.top.reach else "")
        apart = "counted apart (collapsed_never_top), " if which.any() else ""
        return (f"output '{name}': {what} that FP32 never ranks first on this data: they "
                f"change no decision (of {self.n} channels of axis {self.axis}, FP32 |x| at "
                f"most {peak:.4g}; neither FP32 nor the quantized model ranks any of them "
                f"first on a sample or position{near}, and FP32 ranks "
                f"{int(np.count_nonzero(self.won_fp32))} classes first): {apart}not judged; "
                "a class that wins on other data can lose there (sqnr_db_channel_min and "
                "cosine_channel_min still include them)")

    def _kept_note(self, name: str, which: np.ndarray, far: np.ndarray) -> str:
        """The line saying the collapsed classes (``which``) and those of a cosine under
        RESEMBLE_MIN_COSINE (``far``) that win steps but change no string (:meth:`_kept`)."""
        both = which | far
        low = f"of a cosine to FP32 under {RESEMBLE_MIN_COSINE:g}"
        what = " and ".join(
            ([f"{int(which.sum())} collapsed classes"] if which.any() else [])
            + ([f"{int(far.sum())} {'more ' if which.any() else ''}classes {low}"]
               if far.any() else []))
        lost = int((self.won_fp32 - self.won_both)[both].sum())
        new = int((self.won_test - self.won_both)[both].sum())
        how = ("the quantized model ranks them first on the same steps" if not lost + new else
               f"the quantized model keeps {int(self.won_both[both].sum())} of them and wins "
               f"{new} others; those {lost + new} step changes, each class's applied alone to "
               "FP32's steps or undone alone from the quantized model's, leave every string "
               "as it was")
        apart = "counted apart (collapsed_strings_kept), " if which.any() else ""
        return (f"output '{name}': {what} win steps but change no decoded string on this "
                f"data (of {self.n} channels of axis {self.axis}: FP32 ranks them first on "
                f"{int(self.won_fp32[both].sum())} steps, {how}): {apart}not judged; a class "
                "that wins on other data can change a string there (sqnr_db_channel_min and "
                "cosine_channel_min still include them)")

    def _positions_note(self, name: str) -> str:
        lo, hi = min(self.sizes), max(self.sizes)
        if lo == hi:  # one length on this data: the model's declared dim says positions
            dim = "an unknown dim" if self.symbolic == "?" else repr(self.symbolic)
            return (f"output '{name}': axis {self.axis} is symbolic in the model ({dim}) and "
                    "the graph tells no channel axis: read as positions (frames, tokens), "
                    f"not channels, though every one of the {self.samples} samples holds "
                    f"{hi} here, so no per-channel figure (collapsed channels, the worst "
                    "channel's SQNR and cosine) is made along it, padding positions "
                    "included; the whole-output figures judge it")
        return (f"output '{name}': axis {self.axis} varies by sample ({lo} to {hi} positions "
                f"over {self.samples} samples: every sample reaches the first {lo}, "
                f"{int(self.reach[hi - 1])} the last): it is read as positions (frames, "
                "tokens), not channels, so no per-channel figure (collapsed channels, the "
                "worst channel's SQNR and cosine) is made along it, the last positions "
                "holding only the longest samples; the whole-output figures judge it")


class ScalarFidelity:
    """One value per sample: absolute/relative error and decisions at a threshold."""

    def __init__(self) -> None:
        self.err_max = 0.0
        self.err_sum = 0.0
        self.count = 0
        self.agree = {0.5: 0, 0.0: 0}
        # per threshold: FP32's positives, those the quantized model keeps, its own positives
        self.pos = {th: [0, 0, 0] for th in self.agree}
        self.margin = dict.fromkeys(self.agree, np.inf)  # FP32's least distance to it
        self.f_min, self.f_max = np.inf, -np.inf

    def add(self, ref: np.ndarray, test: np.ndarray) -> None:
        r = np.asarray(ref, np.float64).reshape(-1)
        t = np.asarray(test, np.float64).reshape(-1)
        if r.size == 0:
            return
        err = np.abs(t - r)
        self.err_max = max(self.err_max, float(err.max()))
        self.err_sum += float(err.sum())
        self.count += r.size
        for th in self.agree:
            self.agree[th] += int(np.sum((r > th) == (t > th)))
            p = self.pos[th]
            p[0] += int(np.sum(r > th))
            p[1] += int(np.sum((r > th) & (t > th)))
            p[2] += int(np.sum(t > th))
            self.margin[th] = min(self.margin[th], float(np.abs(r - th).min()))
        self.f_min, self.f_max = min(self.f_min, float(r.min())), max(self.f_max, float(r.max()))

    def table(self) -> dict[str, float]:
        if self.count == 0:
            return {}
        th = 0.5 if 0.0 <= self.f_min and self.f_max <= 1.0 else 0.0
        span = self.f_max - self.f_min
        agreement = self.agree[th] / self.count
        return {"abs_err_max": self.err_max, "abs_err_mean": self.err_sum / self.count,
                "rel_err_max": self.err_max / span if span > 0 else self.err_max,
                "decision_agreement": agreement, "decision_threshold": th,
                f"decision_agreement@{th:g}": agreement}

    def _sides(self, th: float) -> str:
        pos, kept, own = self.pos[th]
        return sides_text(self.count, pos, kept, own)

    def notes(self, name: str) -> tuple[list[str], bool]:
        """(lines saying the error, whether it is NOT LIKE FP32)."""
        t = self.table()
        if not t:
            return [], False
        th = t["decision_threshold"]
        kind = "a probability in [0, 1]" if th == 0.5 else "not in [0, 1]"
        line = (f"output '{name}' has one value per sample ({kind}): no cosine; |error| max "
                f"{t['abs_err_max']:.4g} ({t['rel_err_max']:.1%} of FP32's range "
                f"{self.f_min:.4g} to {self.f_max:.4g}), mean {t['abs_err_mean']:.4g}; "
                f"{value('decision_agreement', t['decision_agreement'])} of samples decided "
                f"as FP32 at threshold {th:g}; {self._sides(th)}")
        # an error is large against FP32's spread, or, where every FP32 value lies farther
        # from the threshold than that spread (a wake word's scores near 0 on clips without
        # it: 4.5e-5 of error is "100 % of the range" and decides nothing), that distance
        scale = max(self.f_max - self.f_min, self.margin[th])
        bad = t["decision_agreement"] < DECISION_MIN_AGREEMENT or (
            t["abs_err_max"] > SCALAR_MAX_REL_ERR * scale if scale > 0 else
            t["rel_err_max"] > SCALAR_MAX_REL_ERR)
        if scale > self.f_max - self.f_min and t["rel_err_max"] > SCALAR_MAX_REL_ERR and not bad:
            line += (f"; the error is small against the {self.margin[th]:.3g} that every FP32 "
                     f"value lies from {th:g}, so not a loss")
        lines = [line]
        if self.f_min > th or self.f_max <= th:  # every FP32 decision the same
            lines.append(f"output '{name}': FP32 decides the same on every sample at {th:g} "
                         f"(its values {self.f_min:.4g} to {self.f_max:.4g}): the decision "
                         "agreement says little; give data with both outcomes, or judge it by "
                         "its |error|")
        return lines, bad


def restated(note: str, lines: tuple[str, ...] | list[str]) -> bool:
    """Whether an output's fidelity line in ``lines`` says ``note`` already, with FP32's
    values: a score task's ``output 'X': FP32 decides the same on every sample at 0.5:
    the decision agreement says little ...`` beside this module's ``... at 0.5 (its values
    a to b): the decision agreement says little ...`` (two warnings of one fact)."""
    head = note.partition(": the decision agreement says little")
    return bool(head[1]) and any(m != note and m.startswith(f"{head[0]} (") for m in lines)


def sides_text(n: int, pos: int, kept: int, own: int) -> str:
    """FP32's positive and negative decisions and what the quantized model made of each: a
    wake word's score is positive on a few clips, and an agreement over all of them is
    mostly its negatives'."""
    text = (f"FP32 decides {pos} of {n} positive: the quantized model keeps {kept} of them "
            f"and turns {own - kept} of the {n - pos} negatives positive")
    if 0 < min(pos, n - pos) < 0.05 * n:  # (one side empty: a line of its own says so)
        text += (f" (the agreement is mostly the {'negatives' if pos < n - pos else 'positives'}"
                 f"': judge the {min(pos, n - pos)} others by these counts)")
    return text
