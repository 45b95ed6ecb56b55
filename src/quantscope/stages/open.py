"""Opening what a command works on: a model, its data (and the held-out split), its
calibration, its groups, a plan's legality problems and the shapes note.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from quantscope.calibrate.collect import calibrate
from quantscope.kept import Kept
from quantscope.model.groups import find_groups
from quantscope.model.load import FLOAT_TYPES, Model, load
from quantscope.progress import say
from quantscope.tasks.face_split import halves_by_person, splits_by_people
from quantscope.tasks.tensors import TENSOR_BATCH, limit_reason, load_tensor_batches
from quantscope.types import (
    SHARED,
    Batch,
    Dataset,
    Feeds,
    Plan,
    QuantscopeError,
    Stats,
    batch_rows,
    take_rows,
)


def resolve_model_path(spec: str) -> Path:
    """A built-in model name or a path -> path of an ONNX file."""
    from quantscope.zoo import resolve_model

    return Path(resolve_model(spec))


def open_model(spec: str | Path) -> Model:
    """A built-in model name or an ONNX path -> the loaded :class:`Model`."""
    from quantscope.zoo import BUILTIN_MODELS

    path = resolve_model_path(str(spec))
    if not path.exists() and path.suffix != ".onnx" and len(path.parts) == 1:
        raise QuantscopeError(
            f"unknown model '{spec}': give an .onnx path or a built-in name "
            f"({', '.join(BUILTIN_MODELS)})"
        )
    return load(path)


def open_data(
    spec: str | Path, model: Model, *, tokenizer: str | None = None,
    max_pairs: int | None = None, output: str | None = None, layout: Sequence[Any] = (),
    batch_axes: Mapping[str, int] | None = None, show: bool = True,
    prefixes: Any = None, calib_texts: int | None = None,
) -> Dataset:
    """Tensor files/folders, or a built-in or user task (text pairs, face images).

    ``layout``: :class:`quantscope.tasks.layout.LayoutSpec` values (``--layout``), what
    each output of tensor data is; outputs not declared may be detected (a detection head).
    ``batch_axes``: each named input's (or output's) sample axis (``--batch-axis``); for
    tensor data an input whose samples are not on axis 0 is said on stderr (``show``).
    ``prefixes``: :class:`quantscope.tasks.text.TextPrefixes` of text data (None: none);
    ``calib_texts``: text data calibrates on its first N texts (None: up to 512)."""
    from quantscope.tasks.neighbours import check_neighbour_samples
    from quantscope.tasks.pixels import pixels_note
    from quantscope.tasks.registry import open_task_data, tensor_task
    from quantscope.tasks.tensors import (
        cast_note,
        check_batch_axes,
        sample_dim_guess,
        unused_arrays,
    )
    from quantscope.tasks.verify import check_sample_count, label_arrays

    if batch_axes:
        check_batch_axes(model, batch_axes)
    ds = open_task_data(str(spec), model, tokenizer=tokenizer, max_pairs=max_pairs,
                        output=output, calib_texts=calib_texts,
                        **({"prefixes": prefixes} if prefixes else {}))
    if ds is not None and layout:
        raise QuantscopeError(f"--layout applies to tensor data (.npy/.npz); data '{spec}' "
                              "has its own task: leave --layout out")
    if ds is None:
        batches = tuple(load_tensor_batches(spec, model, batch_axes=batch_axes))
        fed = next((b for b in batches if isinstance(b, Feeds)), None)
        # each output's sample axis: a layout's axis= counts the output as declared
        samples = {} if fed is None else {
            o: a for o, a in zip(model.output_names(), fed.out_axes, strict=False) if a}
        task, notes = tensor_task(model, str(spec), tuple(layout), samples)
        check_sample_count(task, sum(batch_rows(b) for b in batches))
        check_neighbour_samples(task, sum(batch_rows(b) for b in batches))
        ds = Dataset(name=str(spec), calibration=batches, evaluation=batches, task=task,
                     notes=notes)
        made = pixels_note(spec)
        if made:  # how the images became these tensors: every result says it
            ds = dataclasses.replace(ds, notes=(*ds.notes, made))
            say(f"note: {made}", show=show)
        cast = cast_note(spec, model)
        if cast:  # said, not an error: float64 data is common, float32 what the model takes
            ds = dataclasses.replace(ds, notes=(*ds.notes, f"{spec}: {cast}"))
            say(f"note: {spec}: {cast}", show=show)
        unused = [u for u in unused_arrays(spec, model)  # a verify layout's labels: read
                  if not any(u.startswith(f"'{a}' ") for a in label_arrays(task))]
        if unused:  # said, not an error: a label array beside the inputs is common
            note = (f"{spec}: {len(unused)} array(s) no model input takes, not fed: "
                    f"{', '.join(unused[:5])}{' …' if len(unused) > 5 else ''} (inputs: "
                    f"{', '.join(model.input_names())}; rename an array meant for one)")
            ds = dataclasses.replace(ds, notes=(*ds.notes, note))
            say(f"note: {note}", show=show)
        guess = sample_dim_guess(model, batch_axes, None if fed is None else fed.axes)
        if guess:
            ds = dataclasses.replace(ds, notes=(*ds.notes, f"{spec}: {guess}"))
            say(f"note: {spec}: {guess}", show=show)
        if fed is not None:
            note = f"{spec}: {_layout_text(fed, tuple(model.output_names()))}"
            ds = dataclasses.replace(ds, notes=(*ds.notes, note))
            say(f"note: {note}", show=show)
        for note in constant_inputs(batches, model):
            ds = dataclasses.replace(ds, notes=(*ds.notes, f"{spec}: {note}"))
            say(f"note: {spec}: {note}", show=show)
    elif batch_axes:
        raise QuantscopeError(f"--batch-axis applies to tensor data (.npy/.npz); '{spec}' is "
                              "a task whose batches quantscope builds: leave it out")
    if output is not None:
        if output not in model.output_names():
            raise QuantscopeError(f"--output '{output}' is no output of the model (outputs: "
                                  f"{', '.join(model.output_names())})")
        ds = dataclasses.replace(ds, output=output)
    return ds

ONE_VALUE = "so its range is calibrated on that value alone"
"""In every note of :func:`constant_inputs` (``run``'s verdict repeats them as warnings)."""


def constant_inputs(batches: Sequence[Mapping[str, Any]], model: Model) -> list[str]:
    """One line per float input that holds one value over all the data (a zero initial
    state or cache, a setting such as a TTS's speed): its grid is calibrated on that value
    alone, and a deployment that feeds others clips them."""
    types, out = model.value_types(), []
    for k in model.input_names():
        arrays = [np.asarray(b[k]) for b in batches if k in b and np.size(b[k])]
        if types.get(k) not in FLOAT_TYPES or not arrays:
            continue
        lo, hi = min(float(a.min()) for a in arrays), max(float(a.max()) for a in arrays)
        if lo == hi:
            out.append(
                f"input '{k}' holds one value ({lo:g}) over all the data, {ONE_VALUE} "
                f"(a grid of {min(lo, 0.0):g} to "
                f"{max(hi, 0.0):g}): a deployment that feeds it others (a streaming model's "
                "carried state or cache, a setting such as a speed) has them clipped there, "
                "and no figure here shows it; give data with the values it takes (the "
                "states of consecutive chunks run through the model)")
    return out


def _layout_text(batch: Feeds, outputs: tuple[str, ...]) -> str:
    """Which inputs hold their samples on another axis than 0, and the per-run limit."""
    parts = [f"input '{k}' has no sample axis: every batch gets it whole" if a == SHARED
             else f"input '{k}' is batched on axis {a}" for k, a in batch.axes.items() if a]
    parts += [f"output '{o}' is batched on axis {a}"
              for o, a in zip(outputs, batch.out_axes, strict=False) if a]
    if batch.limit is not None:
        parts.append(f"the model takes {batch.limit} sample(s) per run "
                     f"({limit_reason(batch.mixes)}): the samples run that many at a time")
    return "; ".join(parts)


def held_out(data: Dataset, batches: int | None) -> tuple[list[Batch], Dataset, str | None]:
    """Fit feeds (the first ``batches`` calibration batches; of a static model that takes
    ``L`` samples per run, ``32 / L`` times as many) and data to score on that
    never includes them. Tensor data whose evaluation rows are its calibration rows is
    split: fitting on the first half of the batches (of the rows, for one batch),
    scoring on the rest. Face data is split by person (:func:`_held_out_people`). Another
    task bound to its rows cannot be split: the note says it is scored on rows it was
    fitted on."""
    first = next(iter(data.calibration), None)
    if batches is not None and isinstance(first, Feeds) and first.limit:
        # a static model runs a few samples per batch: count batches of the usual 32 samples
        batches *= max(1, TENSOR_BATCH // first.limit)
    feeds = list(data.calibration)[:batches]
    fitted = {id(b) for b in feeds}
    rest = tuple(b for b in data.evaluation if id(b) not in fitted)
    if len(rest) == len(data.evaluation):
        return feeds, data, None
    if splits_by_people(data.task) and len(data.calibration) == len(data.evaluation) and all(
            a is b for a, b in zip(data.calibration, data.evaluation, strict=True)):
        return _held_out_people(data, feeds, len(feeds))
    if data.task is not None and not getattr(data.task, "row_local", False):
        return feeds, data, (f"{data.name}: the evaluation rows include the "
                             f"{len(feeds)} batch(es) the repairs were fitted on")
    if rest:
        return feeds, dataclasses.replace(data, evaluation=rest), (
            f"scored on {len(rest)} held-out batch(es), fitted on {len(feeds)}")
    rows = list(data.evaluation)
    if len(rows) == 1:
        n = batch_rows(rows[0])
        if n < 2:
            raise QuantscopeError(f"data '{data.name}' has one sample: give at least two, so "
                                  "the repairs are scored on rows they were not fitted on")
        fit = [take_rows(rows[0], slice(None, n // 2))]
        score = (take_rows(rows[0], slice(n // 2, None)),)
    else:
        fit, score = rows[: len(rows) // 2], tuple(rows[len(rows) // 2:])
    return fit, dataclasses.replace(data, evaluation=score), (
        f"data '{data.name}' has no separate evaluation set: the repairs are fitted on the "
        f"first half and scored on the other half (held out)")


def _held_out_people(data: Dataset, feeds: list[Batch], batches: int
                     ) -> tuple[list[Batch], Dataset, str | None]:
    """Face data split by person as ``run`` splits it (``tasks.face_split``): the repairs
    fitted on the first ``batches`` batches of one half of the people, scored on the
    other half (its own pairs); a half too small: not split, said."""
    halves = halves_by_person(data.task, tuple(data.evaluation))  # type: ignore[arg-type]
    if isinstance(halves, str):
        return feeds, data, (f"{data.name}: the evaluation rows include the {len(feeds)} "
                             f"batch(es) the repairs were fitted on (not split by person: "
                             f"a half would hold {halves})")
    fit = list(halves.batches[0])[:batches]
    fed = halves.tasks[0].identity[: sum(batch_rows(b) for b in fit)]  # type: ignore[index]
    held = halves.tasks[1]
    chips = len(held.identity)  # type: ignore[arg-type]
    return fit, dataclasses.replace(data, name=f"{data.name} (held-out people)",
                                    evaluation=halves.batches[1], task=held), (
        f"data '{data.name}' split by person: the repairs are fitted on {len(fed)} chips of "
        f"{len(np.unique(fed))} people and scored on the other {halves.people[1]} people "
        f"({chips} chips, {len(held.pairs)} pairs among them; held out, no person in "
        "both)")


KEPT_STATS = 3  # calibrations this process keeps by content at least (the last ones) ...
KEPT_STATS_BYTES = 128 * 2**20  # ... and more while their histograms fit in this


def _stats_bytes(stats: Stats) -> int:
    return sum(t.hist.nbytes + t.channel_absmax.nbytes for t in stats.tensors.values())


_KEPT: Kept[tuple[str, str, str], Stats] = Kept(budget=KEPT_STATS_BYTES, weigh=_stats_bytes,
                                               least=KEPT_STATS)


def calibrate_model(
    model: Model, data: Dataset, *, method: str = "minmax", progress: bool = False
) -> Stats:
    """Every calibration batch of ``data`` through ``model``
    (:func:`quantscope.calibrate.collect.calibrate`).

    The last ones are kept by content (the model's graph, the batches, the method): at
    least :data:`KEPT_STATS`, more while they hold at most :data:`KEPT_STATS_BYTES`
    (minilm-l3's take ~3 MB each). The same graph on the same batches gives
    the same statistics, and a run asks for them more than once: the auto choice's round
    2 rebuilds each retried set from the given model (minilm-l3: the same graph three
    times, 5 s each), and the calibrate stage calibrates the graph the choice kept, on the
    same fit data (6-8 s), after the choice's 4 later trials."""
    from quantscope.analyze.evalcache import content_digest, model_digest

    key = (model_digest(model.proto), content_digest(list(data.calibration)), method)
    got = _KEPT.get(key)
    if got is not None:
        say("calibrate: this graph's statistics on these batches, as calibrated before in "
            "this process", show=progress)
        return got
    return _KEPT.put(key, calibrate(model, find_groups(model), data.calibration,
                                    method=method, progress=progress))

def describe_groups(model: Model) -> list[dict[str, Any]]:
    return [
        {"name": g.name, "op_type": g.op_type, "kind": g.kind.value, "nodes": list(g.nodes),
         "outputs": list(g.outputs), "weight": g.weight,
         "output_shape": list(g.output_shape) if g.output_shape else None}
        for g in find_groups(model).groups
    ]

def plan_problems(
    model: Model, plan: Plan, *, seq_len: int | None = None,
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
) -> list[dict[str, Any]]:
    """Legality problems of a plan on its own target (empty when it names none): the
    plan's (:func:`~quantscope.plan.check.check`) and the model's operators the target does
    not take or no list names (:func:`~quantscope.plan.op_support.op_problems`)."""
    if not plan.target:
        return []
    from quantscope.model.shapes import given_shapes
    from quantscope.plan.check import check
    from quantscope.plan.op_support import op_problems
    from quantscope.targets import load_target

    shapes = given_shapes(model, seq_len, input_shapes)
    target = load_target(plan.target)
    problems = op_problems(model, target, shapes) + check(plan, find_groups(model), model, target,
                                                  shapes=shapes)
    return [dataclasses.asdict(p) for p in problems]


def shape_note(
    model: Model, seq_len: int | None = None,
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
) -> str | None:
    """Which tensors' shapes came from a sample run (None: shape inference had them all)."""
    from quantscope.model.shapes import given_shapes
    from quantscope.model.shapes import shape_note as note

    return note(model, given_shapes(model, seq_len, input_shapes))


# ---------------------------------------------------------------- planner measurements
# plan/ measures and repairs only through callables passed in (plan.joint.Measure, Repair):
# this is where they are bound to evaluate_plan and run_repairs.
