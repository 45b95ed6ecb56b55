"""What a heavy stage of ``run`` will hold at its peak, estimated before its work.

The analysis' sweep has its own plan (:func:`quantscope.analyze.memory.plan_memory`:
windows within a budget, a refusal when not one candidate fits). The other heavy stages
get an estimate here, made of what each holds at once, each part computed where its fact
is (the model's weights: :func:`~quantscope.analyze.memory.weight_bytes`; a batch's
tensors: :func:`~quantscope.analyze.memory.tensor_sizer`; one run's working tensors:
:func:`~quantscope.analyze.memory.run_bytes`; the activation cache's budget:
:func:`~quantscope.analyze.activation_cache.cache_memory`; the segment sessions'
budget: :func:`~quantscope.analyze.incremental.session_budget`; the calibration's
taps per run: :func:`~quantscope.calibrate.collect.rows_per_run`'s budget):

=============  ========================================================================
calibrate      held before it; the tapped model's copy and its session (3 x weights);
               the tapped tensors of one run (as many rows as the tap budget allows,
               at least one) twice (ONNX Runtime's outputs and their NumPy copies) and
               that run's working tensors; the observers' histograms
plan           held before it; the FP32 reference session and the segment sessions'
               budget, each session its weights twice (:data:`SESSION_COPIES`); a
               session's build, the largest segment's (:data:`BUILD_COPIES`); the
               FP32 reference (every output of the fit data, held through the search)
               and the activation cache's budget beside it; one run's
               working tensors at the largest batch; the outputs of a batch held twice
               (FP32's and a plan's); with repairs offered, a repair's
               tapped tensors at its largest batch (twice, as calibrate's), the repaired
               models kept
evaluate       held before it; every held-out output held twice (FP32's reference and
               the plan's, until scored); the larger of a plan's pass (a quantized
               model's copy and its session, 3 x weights, and one run's working tensors
               at the largest batch) and the saturation check's calibration of the
               held-out rows (as calibrate's)
deploy         held before it; the larger of the length candidates' evaluator (plan's
               parts but the FP32 session, whose pass ends before the candidates run;
               its activation cache at most the candidates' cap) and measuring the kept
               deployment (one bucket's quantized model, its session and one run's
               working tensors at a time); nothing when one compiled model is decided
               (``pipeline.memory.deploy_estimate`` returns None)
=============  ========================================================================

"Held before it" is the process's resident set when the stage starts (the model, the
data, what earlier stages left): the stage's own peak (``run.json``'s ``peak_rss_mb``)
counts it too. The estimate is said, kept in ``run.json`` (``note_memory_estimate``) and,
where it passes the memory available, said once more with what lowers it; nothing is
refused here (the analysis' sweep refuses by its own rule).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from quantscope.analyze.memory import (
    GB,
    MB,
    available_bytes,
    run_bytes,
    tensor_sizer,
    weight_bytes,
)
from quantscope.emulate.release import resident_bytes
from quantscope.model.load import Model
from quantscope.types import Batch, batch_rows, take_rows

# a run's tapped outputs are held twice until it returns: ONNX Runtime's and their NumPy
# copies (minilm-l3's calibration, 3 rows: 204 MB of taps, the run 560 MB over its session;
# mobilefacenet's bias repair on the faces: 465 MB of taps, ~850 MB over the search)
OUTPUT_COPIES = 2
# an emulation session (ONNX Runtime, optimizations off) keeps its weights twice, its
# graph's initializers and the tensors it runs with, after a collection and a heap trim:
# 128-137 MB for a 64 MB float model (tests/test_stage_memory.py), minilm-l3's 52 segment
# sessions 166 MB for 66 MB, its embedding segment's 99 MB for 45 MB
SESSION_COPIES = 2
# building one held them five times at once: the QDQ proto, its emulation form
# (``session.emulation_form``: the weights dequantized), the form's serialized bytes and
# the session's two; minilm-l3's embedding segment peaked 232 MB over its start for 45 MB.
# Measured before a session took its large weights as buffers (``session.external_weights``,
# stop 70: no serialized copy of them any more): an upper bound now, not re-measured (each
# stage's estimate is still within 2x of its peak, tests/test_stage_memory.py)
BUILD_COPIES = 5


@dataclass(frozen=True)
class StageMemory:
    """One stage's estimated peak: what it is made of (label, bytes), what the process
    held before it, and the memory available (bytes; None where unknown)."""

    stage: str
    parts: tuple[tuple[str, int], ...]
    resident: int
    available: int | None
    lower: str  # what lowers it (said when it passes the memory available)

    @property
    def peak(self) -> int:
        return self.resident + sum(b for _, b in self.parts)

    @property
    def over(self) -> bool:
        """The stage's own part passes the memory available (which leaves out what the
        process holds already)."""
        return self.available is not None and self.peak - self.resident > self.available

    def text(self) -> str:
        parts = ", ".join(f"{label} ~{b / MB:.0f} MB" for label, b in self.parts)
        free = f"; {self.available / GB:.1f} GB available" if self.available else ""
        return (f"~{self.peak / GB:.2f} GB peak (held before it ~{self.resident / MB:.0f} "
                f"MB, {parts}{free})")

    def over_line(self) -> str | None:
        """One line when the estimate passes the memory available, naming what lowers it."""
        if not self.over or self.available is None:
            return None
        return (f"{self.stage}: the estimate, ~{(self.peak - self.resident) / GB:.1f} GB on "
                f"top of the ~{self.resident / GB:.1f} GB held, passes the "
                f"{self.available / GB:.1f} GB available: the kernel may end the run; to "
                f"lower it: {self.lower}")


def _estimate(stage: str, parts: Sequence[tuple[str, int]], lower: str,
              resident: int | None, available: int | None) -> StageMemory:
    return StageMemory(stage, tuple((label, int(b)) for label, b in parts),
                       resident if resident is not None else (resident_bytes() or 0),
                       available if available is not None else available_bytes(), lower)


def _largest(batches: Sequence[Batch]) -> Batch | None:
    return max(batches, key=lambda b: sum(int(getattr(v, "nbytes", 0)) for v in b.values()),
               default=None)


def _outputs_over(model: Model, batches: Sequence[Batch],
                  sizer: Callable[[Sequence[str]], int]) -> int:
    """The model's outputs over every batch: the largest batch's sized, scaled by the
    batches' bytes (what grows with rows and length)."""
    largest = _largest(batches)
    if largest is None:
        return 0
    size = [sum(int(getattr(v, "nbytes", 0)) for v in b.values()) for b in batches]
    return int(sizer(model.output_names()) * sum(size) / max(max(size), 1))


CALIBRATE_LOWER = ("a smaller --seq-len or --input-shape (a run's tapped tensors grow with "
                   "them), or a machine with more memory")


def calibrate_memory(model: Model, batches: Sequence[Batch], taps: Sequence[str], *,
                     max_rows: int, budget: int, resident: int | None = None,
                     available: int | None = None) -> StageMemory:
    """The calibration's peak (:func:`quantscope.calibrate.collect.calibrate` runs
    ``max_rows`` at most, as many as keep the tapped tensors within ``budget``, and always
    one)."""
    from quantscope.calibrate.observe import HIST_BINS

    weights = weight_bytes(model)
    largest = _largest(batches)
    if largest is None:
        return _estimate("calibrate", [("the tapped model and its session",
                                        (1 + SESSION_COPIES) * weights)],
                         CALIBRATE_LOWER, resident, available)
    one = take_rows(largest, slice(0, 1)) if batch_rows(largest) > 1 else largest
    per_row = tensor_sizer(model, [one])(taps)
    rows = min(max_rows, batch_rows(largest), max(1, budget // max(per_row, 1)))
    run_at = take_rows(largest, slice(0, rows)) if rows < batch_rows(largest) else largest
    sizer = tensor_sizer(model, [run_at])
    tapped = sizer(taps)
    work = run_bytes(model, sizer)
    widest = max((sizer([t]) for t in taps), default=0)
    parts = [("the tapped model and its session", (1 + SESSION_COPIES) * weights),
             (f"the tapped tensors of a run of {rows} row(s), twice", OUTPUT_COPIES * tapped),
             ("its working tensors", work),
             # an observer's pass: the bin indices (int64) and masks of the widest tap
             ("an observer's pass over the widest", 3 * widest),
             (f"{len(taps)} observers' histograms", len(taps) * HIST_BINS * 8)]
    return _estimate("calibrate", parts, CALIBRATE_LOWER, resident, available)


PLAN_LOWER = ("fewer --pairs (the search scores every fit pair) or a shorter --seq-len "
              "(every tensor grows with it), or a machine with more memory")


def _evaluator_parts(model: Model, batches: Sequence[Batch], *, cache_cap: int | None,
                     available: int | None, fp32_session: bool = True
                     ) -> list[tuple[str, int]]:
    """What measuring plan after plan holds: the incremental evaluator's sessions and
    activation cache as :class:`~quantscope.analyze.incremental.IncrementalRunner` sizes
    them on ``batches`` (at most ``cache_cap``), each session its weights
    :data:`SESSION_COPIES` times, a session's build (the largest segment's weights
    :data:`BUILD_COPIES` times, less what it keeps), the FP32 reference's session (with
    ``fp32_session``), one run at the largest batch and a batch's outputs twice."""
    from quantscope.analyze.activation_cache import cache_memory
    from quantscope.analyze.incremental import crossing, session_budget
    from quantscope.analyze.segments import find_segments, segment_bytes
    from quantscope.model.groups import find_groups

    segments = find_segments(model, find_groups(model))
    weights = segment_bytes(model, segments)
    sessions = session_budget(weights)
    cache = cache_memory(model, batches, crossing(model, segments), sessions,
                         cache_cap=cache_cap, available=available)
    sizer = tensor_sizer(model, batches)
    fp32 = [("the FP32 session", SESSION_COPIES * weight_bytes(model))] if fp32_session else []
    return [*fp32,
            ("the segment sessions", SESSION_COPIES * sessions),
            ("a segment session's build", (BUILD_COPIES - SESSION_COPIES) * max(weights,
                                                                                default=0)),
            ("the activation cache", cache.cache_bytes),
            ("a run's working tensors at the largest batch", run_bytes(model, sizer)),
            ("a batch's outputs, FP32's and a plan's", 2 * sizer(model.output_names()))]


def plan_search_memory(model: Model, batches: Sequence[Batch], *,
                       repair_feeds: Sequence[Batch] = (), taps: Sequence[str] = (),
                       memo: int = 0, resident: int | None = None,
                       available: int | None = None) -> StageMemory:
    """The plan search's peak: its evaluator's (:func:`_evaluator_parts`) on ``batches``
    (the fit data's evaluation batches) and the FP32 reference beside it (every output of
    ``batches``). With repairs offered
    (``repair_feeds``: the batches they fit on; their full passes read the same
    reference): a repair's tapped tensors (``taps``) at its largest batch, and the
    ``memo`` repaired models the search keeps
    (:class:`~quantscope.repair.apply.RepairMemo`'s size)."""
    sizer = tensor_sizer(model, batches)
    # the FP32 reference every plan is scored against (with repairs, theirs too: one),
    # held through the search beside the activation cache (h74)
    ref = _outputs_over(model, batches, sizer)
    parts = [*_evaluator_parts(model, batches, cache_cap=None, available=available),
             ("the FP32 reference (every output of the fit data)", ref)]
    if repair_feeds:
        parts += [("a repair's tapped tensors of a batch, twice",
                   OUTPUT_COPIES * tensor_sizer(model, repair_feeds)(taps)),
                  (f"{memo} repaired models kept", memo * weight_bytes(model))]
    return _estimate("plan", parts, PLAN_LOWER, resident, available)


EVALUATE_LOWER = ("fewer --pairs or a smaller --eval-data (every held-out output is kept "
                  "until scored), a shorter --seq-len, or a machine with more memory")


def evaluate_memory(model: Model, batches: Sequence[Batch], taps: Sequence[str], *,
                    checked: Sequence[Batch], max_rows: int, budget: int,
                    read_repaired: bool = False, resident: int | None = None,
                    available: int | None = None) -> StageMemory:
    """The held-out evaluation's peak (FP32, uniform a8_w8, the plan, one at a time): the
    outputs held throughout, and the larger of a plan's pass and the saturation check's
    calibration of the ``checked`` rows (:func:`calibrate_memory`'s parts, ``taps`` at
    ``max_rows`` and ``budget``), which run one after the other. ``read_repaired``: the
    repaired model is read from its file and compared with the working model (its bytes
    and its proto beside the working model's: 2 x weights)."""
    sizer = tensor_sizer(model, batches)
    one = (1 + SESSION_COPIES) * weight_bytes(model) + run_bytes(model, sizer)
    check = calibrate_memory(model, checked, taps, max_rows=max_rows, budget=budget,
                             resident=0, available=0)
    parts = [("the held-out outputs, FP32's and a plan's", 2 * _outputs_over(model, batches,
                                                                            sizer)),
             (f"the larger of the saturation check's calibration (~{check.peak / MB:.0f} MB, "
              f"as calibrate's) and a plan's pass (~{one / MB:.0f} MB: a quantized model, "
              "its session, its working tensors), run apart", max(one, check.peak))]
    if read_repaired:
        parts.append(("reading repaired.onnx beside the working model",
                      2 * weight_bytes(model)))
    return _estimate("evaluate", parts, EVALUATE_LOWER, resident, available)


DEPLOY_LOWER = ("--lengths off (one compiled model: no length candidates measured), fewer "
                "--pairs, or a machine with more memory")


def deploy_memory(model: Model, batches: Sequence[Batch], *, cache_cap: int,
                  resident: int | None = None, available: int | None = None) -> StageMemory:
    """The compiled lengths' peak (``run``'s deploy stage): the larger of choosing (the
    length candidates measured one after another on the fit ``batches`` by one incremental
    evaluator, :func:`_evaluator_parts`, its activation cache at most ``cache_cap``; their
    pooled embeddings, a few MB, left out) and measuring the kept deployment on the
    held-out texts (one bucket's QDQ model and its session at a time, 3 x weights, and one
    run's working tensors), which run apart (the evaluator's memory given back between:
    :func:`quantscope.stages.lengths.deploy_lengths`). The FP32 pass on the fit texts ends
    before the candidates run: its session is not beside them."""
    choose = _evaluator_parts(model, batches, cache_cap=cache_cap, available=available,
                              fp32_session=False)
    measure = ((1 + SESSION_COPIES) * weight_bytes(model)
               + run_bytes(model, tensor_sizer(model, batches)))
    parts = choose if sum(b for _, b in choose) >= measure else [
        ("a bucket's quantized model, its session and its working tensors", measure)]
    return _estimate("deploy", parts, DEPLOY_LOWER, resident, available)
