"""Stage composition used by the CLI and the Python API.

Each function is a thin, typed composition of the stage functions (load, find_groups,
calibrate, encode, build_qdq, evaluate); nothing here holds state between calls.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.evaluate import (
    compare_model,
    compare_models,
    kept,
    open_runs,
    run_model,
    scale_error,
)
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.groups import find_groups
from quantscope.model.load import Model, load, load_proto
from quantscope.progress import say
from quantscope.serde import (
    plan_to_dict,
    read_json,
    read_plan,
    read_stats,
    write_json,
    write_onnx,
    write_plan,
    write_stats,
    write_text,
)
from quantscope.tasks.headline import Headline
from quantscope.tasks.registry import at_length
from quantscope.tasks.tensors import TENSOR_BATCH, load_tensor_batches
from quantscope.types import (
    SHARED,
    Batch,
    Dataset,
    Encodings,
    Feeds,
    GroupKind,
    Groups,
    Outputs,
    Plan,
    Precision,
    QuantScheme,
    QuantscopeError,
    Stats,
    batch_rows,
    take_rows,
)

if TYPE_CHECKING:
    from quantscope.parallel import Executor
    from quantscope.plan.joint import Measure, Offer, Repair
    from quantscope.plan.refine import Evaluate
    from quantscope.repair import Repair as GraphRepair
    from quantscope.targets.profile import Target
    from quantscope.types import Sensitivity

__all__ = [
    "Dataset", "open_model", "open_data", "calibrate_model", "qdq_for_plan", "evaluate_plan",
    "format_result", "describe_groups", "read_plan", "read_stats", "write_json", "write_onnx",
    "write_stats", "opset_of", "load_proto", "write_plan", "write_text", "evaluate_plans",
    "export_plan", "device_io_rows", "plan_problems", "read_text", "read_json_file",
]

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
) -> Dataset:
    """Tensor files/folders, or a built-in or user task (text pairs, face images).

    ``layout``: :class:`quantscope.tasks.layout.LayoutSpec` values (``--layout``), what
    each output of tensor data is; outputs not declared may be detected (a detection head).
    ``batch_axes``: each named input's (or output's) sample axis (``--batch-axis``); for
    tensor data an input whose samples are not on axis 0 is said on stderr (``show``)."""
    from quantscope.tasks.registry import open_task_data, tensor_task
    from quantscope.tasks.tensors import check_batch_axes

    if batch_axes:
        check_batch_axes(model, batch_axes)
    ds = open_task_data(str(spec), model, tokenizer=tokenizer, max_pairs=max_pairs)
    if ds is not None and layout:
        raise QuantscopeError(f"--layout applies to tensor data (.npy/.npz); data '{spec}' "
                              "has its own task: leave --layout out")
    if ds is None:
        task, notes = tensor_task(model, str(spec), tuple(layout))
        batches = tuple(load_tensor_batches(spec, model, batch_axes=batch_axes))
        ds = Dataset(name=str(spec), calibration=batches, evaluation=batches, task=task,
                     notes=notes)
        fed = next((b for b in batches if isinstance(b, Feeds)), None)
        if fed is not None:
            note = f"{spec}: {_layout_text(fed)}"
            ds = dataclasses.replace(ds, notes=(*ds.notes, note))
            say(f"note: {note}", show=show)
    elif batch_axes:
        raise QuantscopeError(f"--batch-axis applies to tensor data (.npy/.npz); '{spec}' is "
                              "a task whose batches quantscope builds: leave it out")
    if output is not None:
        if output not in model.output_names():
            raise QuantscopeError(f"--output '{output}' is no output of the model (outputs: "
                                  f"{', '.join(model.output_names())})")
        ds = dataclasses.replace(ds, output=output)
    return ds


def output_channel_axes(model: Model, batches: Sequence[Batch] = ()) -> dict[str, int]:
    """Each output's channel axis as the graph tells it (:mod:`quantscope.model.axes`), as
    the scorers see the output: sample-first (an output whose samples lie on axis ``a`` of
    a :class:`Feeds` batch is moved there first, so a channel axis before ``a`` shifts by
    one; an output whose channel axis is its sample axis gets none)."""
    from quantscope.model.axes import output_channel_axes as graph_axes

    axes = graph_axes(model)
    moved = getattr(next(iter(batches), None), "out_axes", ()) or ()
    out = {}
    for i, name in enumerate(model.output_names()):
        if name not in axes:
            continue
        c, a = axes[name], moved[i] if i < len(moved) else 0
        if c == a and a:
            continue
        out[name] = c + 1 if c < a else c
    return out


def _layout_text(batch: Feeds) -> str:
    """Which inputs hold their samples on another axis than 0, and the per-run limit."""
    parts = [f"input '{k}' has no sample axis: every batch gets it whole" if a == SHARED
             else f"input '{k}' is batched on axis {a}" for k, a in batch.axes.items() if a]
    if batch.limit is not None:
        parts.append(f"the model takes {batch.limit} sample(s) per run (static shape): "
                     "the samples run that many at a time")
    return "; ".join(parts)


def held_out(data: Dataset, batches: int | None) -> tuple[list[Batch], Dataset, str | None]:
    """Fit feeds (the first ``batches`` calibration batches; of a static model that takes
    ``L`` samples per run, ``32 / L`` times as many) and data to score on that
    never includes them. Tensor data whose evaluation rows are its calibration rows is
    split: fitting on the first half of the batches (of the rows, for one batch),
    scoring on the rest. A task bound to its rows (faces) cannot be split: the note
    says it is scored on rows it was fitted on."""
    first = next(iter(data.calibration), None)
    if batches is not None and isinstance(first, Feeds) and first.limit:
        # a static model runs a few samples per batch: count batches of the usual 32 samples
        batches *= max(1, TENSOR_BATCH // first.limit)
    feeds = list(data.calibration)[:batches]
    fitted = {id(b) for b in feeds}
    rest = tuple(b for b in data.evaluation if id(b) not in fitted)
    if len(rest) == len(data.evaluation):
        return feeds, data, None
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


def calibrate_model(
    model: Model, data: Dataset, *, method: str = "minmax", progress: bool = False
) -> Stats:
    return calibrate(model, find_groups(model), data.calibration, method=method,
                     progress=progress)


def qdq_for_plan(
    model: Model,
    stats: Stats,
    plan: Plan,
    *,
    method: str | None = None,
    scheme: QuantScheme | None = None,
) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """The QDQ model for a plan (in its target's scheme), and the notes the encoder made.

    ``scheme`` applies only to a plan that names no target (see :func:`scheme_for`).
    """
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan, scheme), method=method)
    return q.proto, (*q.notes, *q.coverage.lines())


def evaluate_plan(
    model: Model,
    data: Dataset,
    stats: Stats,
    plan: Plan,
    *,
    method: str | None = None,
    scheme: QuantScheme | None = None,
    progress: bool = False,
    reference: Model | None = None,
    reference_outputs: Outputs | None = None,
    saturation: bool = True,
) -> dict[str, Any]:
    """Fidelity (and task metrics when the data has a task) of ``plan`` against FP32.

    The graph measured is :func:`qdq_for_plan`'s, the one ``export-qdq`` writes.
    """
    return evaluate_plans(model, data, stats, {"emulated": plan}, method=method, scheme=scheme,
                          saturation=saturation,
                          progress=progress, reference=reference,
                          reference_outputs=reference_outputs)["emulated"]


def evaluate_plans(
    model: Model,
    data: Dataset,
    stats: Stats,
    plans: dict[str, Plan],
    *,
    method: str | None = None,
    scheme: QuantScheme | None = None,
    progress: bool = False,
    reference: Model | None = None,
    reference_outputs: Outputs | None = None,
    saturation: bool = True,
    error_scales: Sequence[float] = (),
) -> dict[str, dict[str, Any]]:
    """Like :func:`evaluate_plan` for several plans, running the FP32 model only once.

    ``error_scales`` (task data only): also the task metrics of each plan's error scaled
    by each factor (:func:`quantscope.emulate.evaluate.scale_error`), under
    ``"error_scales"``: how much smaller the error would have to be for a goal.

    ``saturation``: also calibrate (up to ``SATURATION_ROWS`` of) the evaluation rows and
    report, per plan, the tensors whose values leave their calibrated range.

    ``reference`` is the FP32 model the metrics compare against (default: ``model``); a
    repaired model is compared with the original, since bias correction changes FP32.
    ``reference_outputs`` (its outputs on ``data.evaluation``) skips even that one run.
    """
    batches = list(data.evaluation)
    data_stats, n_rows = _saturation_stats(model, batches) if saturation else (None, 0)
    keep = getattr(data.task, "keep", None)  # what the task reads of each batch's outputs
    lockstep = reference_outputs is None and len(plans) == 1  # no FP32 raw outputs held
    ref = reference_outputs or (None if lockstep else run_model(
        (reference or model).proto, batches, label="fp32" if progress else ""))
    ref_kept = None if ref is None else kept(ref, batches, keep)
    results: dict[str, dict[str, Any]] = {}
    for label, plan in plans.items():
        q = quantize_model(model, stats, plan, scheme=scheme_for(plan, scheme), method=method)
        emulated = open_runs(q.proto, batches, label if progress else "")
        coverage, saturated = q.coverage.to_dict(), _saturation_entry(data_stats, q.encodings, n_rows)
        q_notes = q.notes
        del q  # the session holds the graph: the QDQ proto's weights go before the runs
        # raw outputs judged unless a task reads them its own way (text: padded tokens);
        # a row-local output task (detections, maps) reads the raw outputs themselves
        judge = data.task is None or getattr(data.task, "row_local", False)
        score: dict[str, Any] = {"keep": keep, "only": data.output, "judge": judge,
                                 "channel_axes": output_channel_axes(model, batches)}
        if ref is None:
            fp32 = open_runs((reference or model).proto, batches)
            fid, ref_kept, test = compare_models(fp32, emulated, **score)
        else:
            fid, test = compare_model(emulated, ref, **score)
        metrics, tables, task_notes = dict(fid.values), dict(fid.tables), fid.notes
        scaled: dict[str, Any] = {}
        if data.task is not None:
            tm = data.task.metrics(ref_kept, test)
            metrics.update(tm.values)
            tables.update(tm.tables)
            task_notes = (*task_notes, *tm.notes)
            if error_scales:
                scaled = {"error_scales": [
                    {"scale": float(f), **data.task.metrics(
                        ref_kept, scale_error(ref_kept, test, f)).values}
                    for f in error_scales]}
        results[label] = {
            "model": model.source, "data": data.name, "plan": plan_to_dict(plan),
            "method": method or stats.method, "metrics": metrics, "outputs": tables,
            "coverage": coverage, **saturated, **scaled,
            "notes": [*model.notes, *data.notes, *q_notes, *task_notes],
        }
    return results


SATURATION_ROWS = 256  # evaluation rows whose ranges are checked against the calibration's


def _saturation_stats(model: Model, batches: list[Batch]) -> tuple[Stats, int]:
    """Streaming statistics of (up to SATURATION_ROWS of) the evaluation rows."""
    rows, part = 0, []
    for b in batches:
        if rows >= SATURATION_ROWS:
            break
        part.append(b)
        rows += batch_rows(b)
    return calibrate(model, find_groups(model), part), rows


def _saturation_entry(data_stats: Stats | None, enc: Encodings, n_rows: int) -> dict[str, Any]:
    from quantscope.calibrate.saturation import saturation, saturation_note

    if data_stats is None:
        return {}
    rows = saturation(data_stats, enc)
    note = saturation_note(rows, n_rows)
    return {"saturation": {"rows": n_rows, "tensors": [c.to_dict() for c in rows]},
            **({"saturation_note": note} if note else {})}


OUTPUT_LINE = ("sqnr_db", "sqnr_db_channel_min", "collapsed_channels", "cosine_mean",
               "abs_err_max", "decision_agreement")
"""What the console shows per output (those an output has: one-value outputs have no
cosine, tensors without channels no channel figures)."""


def format_result(result: dict[str, Any]) -> str:
    m = result["metrics"]
    lines = [f"model {result['model']}  data {result['data']}  plan default "
             f"{result['plan']['default']} (+{len(result['plan'].get('groups', {}))} overrides)"]
    lines += [f"  {k:<24} {v:.6g}" for k, v in m.items()]
    outs = {k: v for k, v in result.get("outputs", {}).items() if "sqnr_db" in v}
    if len(outs) > 1 or any("sqnr_db_channel_min" in v for v in outs.values()):
        lines += [f"  output {k}: " + ", ".join(
            f"{key} {v[key]:.4g}" for key in OUTPUT_LINE if key in v) for k, v in outs.items()]
    if "coverage" in result:
        lines += ["  " + line for line in _coverage_lines(result["coverage"])]
    if result.get("saturation_note"):
        lines.append(f"  {result['saturation_note']}")
    lines += [f"  note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


def _coverage_lines(cov: dict[str, Any]) -> list[str]:
    from quantscope.emulate.coverage import Coverage

    return Coverage(
        weights_quantized=cov["weights_quantized"],
        activations_quantized=cov["activations_quantized"],
        weights_float=tuple((r["tensor"], r["op_type"], r["why"]) for r in cov["weights_float"]),
        lookup_tables=tuple(cov["lookup_tables"]),
        ops_float=tuple((r["node"], r["op_type"], r["why"]) for r in cov["ops_float"]),
    ).lines()


def describe_groups(model: Model) -> list[dict[str, Any]]:
    return [
        {"name": g.name, "op_type": g.op_type, "kind": g.kind.value, "nodes": list(g.nodes),
         "outputs": list(g.outputs), "weight": g.weight,
         "output_shape": list(g.output_shape) if g.output_shape else None}
        for g in find_groups(model).groups
    ]


def split_tokens(model: Model, *, seq_len: int | None = None, chunk: int | None = None,
                 input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
                 linears: bool = False) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.tokens.split_tokens`, its FP32 function checked.

    Returns the rewrite and the largest relative output difference to the original on
    sample inputs: token feeds of ``seq_len`` tokens and of half a chunk (empty later
    chunks), or float inputs at their shapes.
    """
    from quantscope.model.shapes import given_shapes
    from quantscope.repair.tokens import sample_feeds
    from quantscope.repair.tokens import split_tokens as split
    from quantscope.repair.verify import check_function

    given = dict(given_shapes(model, None, input_shapes) or {})
    r = split(model, shapes=given, chunk=chunk, seq_len=seq_len, linears=linears)
    if not r.changes:
        return r, 0.0
    effect = dict(r.effect)  # a static token input runs at its own length only
    lengths = ((seq_len, max(1, int(effect["chunk"]) // 2)) if seq_len
               else (int(effect["tokens"]),))
    feeds = sample_feeds(model, lengths, shapes=given)
    return r, check_function(model.proto, r.proto, feeds, what="tokensplit")


def split_heads(model: Model, *, seq_len: int | None = None,
                input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
                ) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.heads.split_heads`, its FP32 function checked.

    Returns the rewrite and the largest relative output difference to the original on
    sample inputs (token feeds of ``seq_len`` tokens, else of 32 and 7 tokens; or float
    inputs at their shapes).
    """
    from quantscope.model.shapes import given_shapes
    from quantscope.repair.heads import split_heads as split
    from quantscope.repair.tokens import sample_feeds
    from quantscope.repair.verify import check_function

    given = dict(given_shapes(model, None, input_shapes) or {})
    r = split(model, shapes=given, seq_len=seq_len)
    if not r.changes:
        return r, 0.0
    feeds = sample_feeds(model, (seq_len,) if seq_len else (32, 7), shapes=given,
                         what="headsplit")
    return r, check_function(model.proto, r.proto, feeds, what="headsplit")


def scale_rows(model: Model, *, growth: float | None = None, seq_len: int | None = None,
               input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
               ) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.rowscale.rowscale`, its FP32 function checked (token feeds
    of ``seq_len`` tokens, else of 32 and 7 tokens; or float inputs at their shapes)."""
    from quantscope.model.shapes import given_shapes
    from quantscope.repair.rowscale import GROWTH, rowscale
    from quantscope.repair.tokens import sample_feeds
    from quantscope.repair.verify import check_function

    given = dict(given_shapes(model, None, input_shapes) or {})
    r = rowscale(model, growth=GROWTH if growth is None else growth)
    if not r.changes:
        return r, 0.0
    feeds = sample_feeds(model, (seq_len,) if seq_len else (32, 7), shapes=given,
                         what="rowscale")
    return r, check_function(model.proto, r.proto, feeds, what="rowscale")


def _stats_rewrite(model: Model, stats: Stats, rewrite: Any, what: str, *,
                   seq_len: int | None,
                   input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
                   ) -> tuple[GraphRepair, float]:
    """``rewrite(model, stats)`` with its FP32 function checked on sample feeds (token
    feeds of ``seq_len`` tokens, else 32 and 7; or float inputs at their shapes). Refused
    when the stats know none of the model's Linear outputs."""
    from quantscope.model.shapes import given_shapes
    from quantscope.repair.tokens import sample_feeds
    from quantscope.repair.verify import check_function

    weighted = [g for g in find_groups(model).groups if g.kind is GroupKind.WEIGHTED]
    if weighted and not any(t in stats.tensors for g in weighted for t in g.outputs):
        raise QuantscopeError(
            "the stats file has no statistics for this model's Linear outputs: it was "
            "calibrated on another model; run 'quantscope calibrate' on this one")
    given = dict(given_shapes(model, None, input_shapes) or {})
    r = rewrite(model, stats)
    if not r.changes:
        return r, 0.0
    feeds = sample_feeds(model, (seq_len,) if seq_len else (32, 7), shapes=given, what=what)
    return r, check_function(model.proto, r.proto, feeds, what=what)


def out_scale(model: Model, stats: Stats, *, min_ratio: float | None = None,
              seq_len: int | None = None,
              input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
              ) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.outscale.outscale`, FP32 checked (:func:`_stats_rewrite`)."""
    from quantscope.repair.outscale import MIN_RATIO, outscale

    ratio = MIN_RATIO if min_ratio is None else min_ratio
    return _stats_rewrite(model, stats, lambda m, s: outscale(m, s, min_ratio=ratio),
                          "outscale", seq_len=seq_len, input_shapes=input_shapes)


def peel_channels(model: Model, stats: Stats, *, factor: float | None = None,
                  max_channels: int | None = None, seq_len: int | None = None,
                  input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
                  ) -> tuple[GraphRepair, float]:
    """:func:`quantscope.repair.peel.peel`, FP32 checked (:func:`_stats_rewrite`)."""
    from quantscope.repair.peel import FACTOR, MAX_PEEL, peel

    f = FACTOR if factor is None else factor
    k = MAX_PEEL if max_channels is None else max_channels
    return _stats_rewrite(model, stats, lambda m, s: peel(m, s, factor=f, max_peel=k), "peel",
                          seq_len=seq_len, input_shapes=input_shapes)


def tokenizer_beside(spec: str, proto: onnx.ModelProto, out: str | Path) -> tuple[Path, Path] | None:
    """(tokenizer, where it must go) when a model written to ``out`` would lose the
    tokenizer ``spec``'s model names or sits with; None when there is none or it is there.
    """
    from quantscope.tasks.text import model_tokenizer

    source = model_tokenizer(resolve_model_path(spec), proto)
    if source is None:
        return None
    dest = Path(out).parent / source.name
    if dest.exists():
        if dest.resolve() == source.resolve() or dest.read_bytes() == source.read_bytes():
            return None
        raise QuantscopeError(
            f"'{dest}' exists and is not the tokenizer of '{spec}' ({source}): write the "
            "model into another folder (its tokenizer file goes beside it)")
    return source, dest


def opset_of(proto: onnx.ModelProto) -> int:
    return next((i.version for i in proto.opset_import if i.domain in ("", "ai.onnx")), 0)


def read_text(path: str | Path, what: str) -> str:
    path = Path(path)
    if not path.is_file():
        raise QuantscopeError(f"{what} file '{path}' does not exist: check the path")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise QuantscopeError(f"{what} file '{path}' is not UTF-8 text") from None


def read_json_file(path: str | Path, what: str) -> Any:
    return read_json(path, what)


def forced_ranges(
    groups: Groups, plan: Plan, enc: Encodings
) -> dict[str, tuple[float, float]]:
    """Group -> pinned output range, for tensors whose range method the plan overrides.

    On Hailo this becomes ``quantization_param(<layer>, force_range_out=[lo, hi])``: the
    compiler then uses the range quantscope measured instead of its own calibration.
    """
    owner = {t: g.name for g in groups.groups for t in g.outputs}
    out: dict[str, tuple[float, float]] = {}
    for tensor in dict(plan.ranges) | dict(plan.pinned):
        if tensor in owner and tensor in enc.activations:
            lo, hi = enc.activations[tensor].range()
            out[owner[tensor]] = (round(float(lo), 6), round(float(hi), 6))
    return out


# export format -> the vendor whose compiler reads it (QDQ ONNX: any)
FORMAT_VENDORS = {"alls": "Hailo", "qnn": "Qualcomm"}


def check_plan_target(plan: Plan, target: str | None, *, plan_name: str = "the plan") -> None:
    """Refuse a plan made for another target than the one it meets (``check``, ``lint``,
    ``run``): one line naming both. A plan that names no target meets any."""
    if plan.target and target and plan.target != target:
        raise QuantscopeError(
            f"{plan_name} was made for target '{plan.target}', not '{target}': use --target "
            f"{plan.target}, or plan again with --target {target} (a plan's legality and "
            "grid belong to its target)")


def check_plan_format(plan: Plan, fmt: str, *, plan_name: str = "the plan") -> None:
    """Refuse to write one vendor's file from a plan made for another vendor's target (a
    QNN plan as a Hailo ``.alls``): one line naming both."""
    from quantscope.targets import load_target

    vendor = FORMAT_VENDORS.get(fmt)
    if vendor is None or not plan.target:
        return
    try:
        target = load_target(plan.target)
    except QuantscopeError:
        return  # a target from a TOML file, not at hand by name: its vendor is unknown here
    if target.vendor != vendor:
        raise QuantscopeError(
            f"{plan_name} was made for target '{plan.target}' ({target.vendor}), and --format "
            f"{fmt} writes a {vendor} file: export it with --format "
            + next((f for f, v in FORMAT_VENDORS.items() if v == target.vendor), "qdq")
            + f", or plan again with a {vendor} --target")


def alls_target(text: str) -> str | None:
    """The target a quantscope ``.alls`` names in its first line, if any."""
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    prefix = "# quantscope plan for "
    if not first.startswith(prefix):
        return None
    name = first[len(prefix):].split(":")[0].strip()
    return None if name in ("", "hailo") else name


def export_plan(
    model: Model,
    stats: Stats,
    plan: Plan,
    *,
    fmt: str,
    out: str | Path,
    hn: dict[str, Any] | None = None,
    qnn_version: str = "1.0.0",
) -> Path:
    """Translate one plan into a vendor format (or the QDQ model) and write it atomically."""
    from quantscope.export.hailo_alls import export_alls, hn_layer_names
    from quantscope.export.qnn_encodings import export_qnn_encodings, to_json

    check_plan_format(plan, fmt)
    groups = find_groups(model)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan), groups=groups)
    enc = q.encodings
    if fmt == "alls":
        names = hn_layer_names(hn, groups) if hn else None
        return write_text(out, export_alls(plan, groups, layer_names=names,
                                           force_ranges=forced_ranges(groups, plan, enc)))
    if fmt == "qnn":
        return write_text(out, to_json(export_qnn_encodings(plan, groups, enc, version=qnn_version)))
    if fmt == "qdq":
        return write_onnx(out, q.proto)
    raise QuantscopeError(f"unknown export format '{fmt}': use alls, qnn or qdq")


def device_io_rows(model: Model, stats: Stats, plan: Plan) -> list[dict[str, Any]]:
    """Stored type, scale and zero-point of every quantized model input and output."""
    from quantscope.export.device_io import device_io

    groups = find_groups(model)
    q = quantize_model(model, stats, plan, scheme=scheme_for(plan), groups=groups)
    return device_io(model, groups, q.encodings)


def plan_problems(
    model: Model, plan: Plan, *, seq_len: int | None = None,
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = (),
) -> list[dict[str, Any]]:
    """Legality problems of a plan on its own target (empty when it names none)."""
    if not plan.target:
        return []
    from quantscope.model.shapes import given_shapes
    from quantscope.plan.check import check
    from quantscope.targets import load_target

    shapes = given_shapes(model, seq_len, input_shapes)
    problems = check(plan, find_groups(model), model, load_target(plan.target), shapes=shapes)
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


def _plan_measure(model: Model, data: Dataset, target: Target | None, method: str | None,
                  reference_outputs: Outputs | None) -> Measure:
    ref = reference_outputs or run_model(model.proto, list(data.evaluation))
    scheme = None if target is None else target.scheme

    def measure(m: Model, s: Stats, p: Plan) -> dict[str, float]:
        return evaluate_plan(m, data, s, p, method=method, scheme=scheme,
                             reference_outputs=ref, saturation=False)["metrics"]

    return measure


def _plan_repair(feeds: Sequence[Batch], target: Target | None) -> Repair:
    from quantscope.plan.joint import Repaired
    from quantscope.repair.apply import run_repairs

    scheme = None if target is None else target.scheme

    def repair(m: Model, s: Stats, p: Plan, names: Sequence[str]) -> Repaired:
        out = run_repairs(m, s, p, feeds, repairs=names, scheme=scheme)
        label = f"{m.source} (repaired: {','.join(names)})"
        return Repaired(load_proto(out.proto, label), out.stats, out.plan, out.records)

    return repair


def plan_evaluator(model: Model, data: Dataset, stats: Stats, metric: str,
                   feeds: Sequence[Batch] = (), *, target: Target | None = None,
                   method: str | None = None, reference_outputs: Outputs | None = None,
                   progress: bool = False) -> Evaluate:
    """``evaluate(plan) -> float`` for the planner: ``metric`` of the plan by real emulation,
    after the plan's repairs (meta ``repairs``; they need the calibration ``feeds``),
    against the FP32 outputs of the original ``model`` (computed once)."""
    from quantscope.plan.joint import repair_evaluator

    return repair_evaluator(model, stats, metric,
                            measure=_plan_measure(model, data, target, method, reference_outputs),
                            repair=_plan_repair(feeds, target) if feeds else None,
                            progress=progress)


def plan_repair_offer(model: Model, data: Dataset, stats: Stats, sens: Sensitivity,
                      target: Target, names: Sequence[str],
                      feeds: Sequence[Batch], *, task_metric: str,
                      shapes: dict[str, tuple[int, ...]] | None = None,
                      method: str | None = None, reference_outputs: Outputs | None = None,
                      progress: bool = False) -> Offer:
    """:func:`quantscope.plan.joint.offer_repairs` with real emulation and repairs."""
    from quantscope.plan.joint import offer_repairs
    from quantscope.repair.apply import REPAIRS

    unknown = [n for n in names if n not in REPAIRS]
    if unknown:
        raise QuantscopeError(f"unknown repair '{unknown[0]}': use {', '.join(REPAIRS)}")
    return offer_repairs(model, stats, sens, target, names,
                         measure=_plan_measure(model, data, target, method, reference_outputs),
                         repair=_plan_repair(feeds, target), task_metric=task_metric,
                         shapes=shapes, progress=progress)


WHATIF_KEYS = ("embedding_cosine_mean", "recall@1", "sqnr_db")  # shown beside the metric
# factors the plan's own error is scaled by (whatif's headroom rows)
ERROR_SCALES = (0.7, 0.5, 0.35, 0.25, 0.18, 0.12, 0.08, 0.05)


def needed_scale(rows: Sequence[dict[str, Any]], metric: str, goal: float, at_one: float,
                 ) -> float | None:
    """The error scale at which ``metric`` reaches ``goal`` (higher is better), interpolated
    linearly in log(scale) between the measured rows (scale 1 is ``at_one``): 1.0 when the
    plan meets it already, None when even the smallest measured scale misses it."""
    pts = sorted([(1.0, at_one), *((float(r["scale"]), float(r[metric])) for r in rows)],
                 reverse=True)
    if at_one >= goal:
        return 1.0
    for (s0, v0), (s1, v1) in itertools.pairwise(pts):
        if v1 >= goal:
            t = 0.0 if v1 == v0 else (goal - v0) / (v1 - v0)
            return float(math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0))))
    return None


def _headroom(plan_run: dict[str, Any], metric: str, goal: float | None) -> dict[str, Any] | None:
    rows = plan_run.get("error_scales")
    if not rows or metric not in rows[0]:
        return None
    keys = (metric, *(k for k in WHATIF_KEYS if k in rows[0] and k != metric))
    out: dict[str, Any] = {
        "rows": [{"scale": r["scale"], **{k: r[k] for k in keys}} for r in rows],
        "note": "the plan's own error in the task's outputs (FP32 + s x (plan - FP32)), s "
                "times as large: how far the goal is, in one number; a real fix leaves "
                "an error of another shape, so this is a yardstick, not a forecast"}
    if goal is not None:
        need = needed_scale(rows, metric, goal, plan_run["metrics"][metric])
        out.update(goal=goal, needed=need)
        out["sentence"] = headroom_sentence(metric, out)
    return out


def whatif_families(model: Model, data: Dataset, stats: Stats, plan: Plan, *,
                    metric: str | None = None, method: str | None = None,
                    progress: bool = False,
                    reference_outputs: Outputs | None = None,
                    plan_result: dict[str, Any] | None = None,
                    goal: float | None = None) -> dict[str, Any]:
    """Where a plan's error is, measured: the plan, then the plan with every group of one
    op kind that it keeps below 16 bit lifted to a16_w16 (legality and cost aside), one
    kind at a time, then all of them at once (the plan's 16-bit ceiling).

    With task data, also the headroom: the metric with the plan's own error scaled by each
    of :data:`ERROR_SCALES` (no extra model run) and, with ``goal``, the scale at which the
    metric reaches it ("the error must shrink to 0.5x"). ``plan_result`` must then carry
    ``error_scales`` (evaluate it with ``error_scales=ERROR_SCALES``) or none are shown.

    One evaluation per kind (FP32 runs once; ``plan_result``: the plan's own evaluation on
    the same rows, when the caller has it, is not run again). The gains are not additive: a kind whose
    lift gains little is not what binds; when every kind gains little and all together gain
    much, the error is spread over the whole graph.
    """
    from quantscope.targets.profile import op_kind

    head = headline(data, metric)
    head.check_goal(goal)
    metric = head.metric
    low: dict[str, list[str]] = {}
    for g in find_groups(model).groups:
        p = plan.precision_of(g.name)
        if p.act_bits is None:
            continue  # float: nothing to lift
        if p.act_bits < 16 or (p.weight_bits is not None and p.weight_bits < 16):
            low.setdefault(op_kind(g), []).append(g.name)
    if not low:
        raise QuantscopeError("the plan keeps no group below 16 bit: nothing to lift")

    def lifted(names: list[str]) -> Plan:
        keep = [(n, q) for n, q in plan.overrides if n not in set(names)]
        return dataclasses.replace(plan, overrides=(*keep, *((n, Precision.A16_W16)
                                                             for n in names)))

    plans = {**{k: lifted(v) for k, v in sorted(low.items())},
             "all": lifted([n for v in low.values() for n in v])}
    if plan_result is None:  # the plan itself, with its headroom rows
        reference_outputs = reference_outputs or run_model(
            model.proto, list(data.evaluation), label="fp32" if progress else "")
        plan_result = evaluate_plans(model, data, stats, {"plan": plan}, method=method,
                                     saturation=False, progress=progress,
                                     reference_outputs=reference_outputs,
                                     error_scales=ERROR_SCALES)["plan"]
    runs = evaluate_plans(model, data, stats, plans, method=method, saturation=False,
                          progress=progress, reference_outputs=reference_outputs)
    runs["plan"] = plan_result
    if metric not in runs["plan"]["metrics"]:
        raise QuantscopeError(f"metric '{metric}' is not measured on this data: use one of "
                              + ", ".join(sorted(runs["plan"]["metrics"])))

    def row(name: str) -> dict[str, Any]:
        m = runs[name]["metrics"]
        return {metric: m[metric], **{k: m[k] for k in WHATIF_KEYS if k in m and k != metric},
                "gain": m[metric] - runs["plan"]["metrics"][metric]}

    return {"metric": metric, "plan": row("plan"),
            "kinds": [{"kind": k, "groups": len(v), **row(k)} for k, v in sorted(low.items())],
            "all": {"groups": sum(len(v) for v in low.values()), **row("all")},
            "note": "legality and cost aside: each row lifts one op kind's groups below 16 "
                    "bit to a16_w16; gains are not additive",
            **({"headroom": h} if (h := _headroom(runs["plan"], metric, goal)) else
               {"headroom_note": "the goal was not placed: how far it is needs task data "
                                 "(text pairs, faces); scaling a tensor model's error by s "
                                 "adds exactly 20*log10(1/s) dB of SQNR"}
               if goal is not None else {})}


def format_whatif(result: dict[str, Any]) -> str:
    """The console form of :func:`whatif_families`."""
    m = result["metric"]

    def line(label: str, r: dict[str, Any]) -> str:
        extra = "  ".join(f"{k} {r[k]:.6g}" for k in WHATIF_KEYS if k in r)
        return f"  {label:<34} {m} {r[m]:.4g} ({r['gain']:+.4g})  {extra}"

    out = [f"where the plan's error is ({result['note']}):", line("the plan", result["plan"])]
    out += [line(f"{r['kind']} ({r['groups']} groups) at a16_w16", r) for r in result["kinds"]]
    out.append(line(f"all {result['all']['groups']} at a16_w16", result["all"]))
    h = result.get("headroom")
    if result.get("headroom_note"):
        out.append(f"note: {result['headroom_note']}")
    if h:
        out.append(f"how far the goal is ({h['note']}):")
        out += ["  error x" + f"{r['scale']:<5g} " + "  ".join(
            f"{k} {r[k]:.6g}" for k in r if k != "scale") for r in h["rows"]]
        if "goal" in h:
            out.append(f"  {h['sentence']}")
    return "\n".join(out)


def headroom_sentence(metric: str, h: dict[str, Any]) -> str:
    """One line: how much smaller the plan's error must be for the goal."""
    need, goal = h.get("needed"), h["goal"]
    if need is None:
        return (f"{metric} {goal:g} is not reached even at x{h['rows'][-1]['scale']:g} of the "
                "plan's error")
    if need >= 1.0:
        return f"the plan meets {metric} {goal:g}"
    return (f"{metric} {goal:g} needs the plan's error at x{need:.2g} or less "
            f"({1 / need:.1f} times smaller; interpolated between measured scales)")


def default_metric(data: Dataset | None) -> str:
    """The measured metric a plan is judged by when the user names none: the data's
    task's headline (:func:`quantscope.tasks.headline.headline_of`)."""
    return headline(data).metric


def headline(data: Dataset | None, metric: str | None = None) -> Headline:
    """The headline metric (key, direction, goal range, unit) of ``data``, or of the
    ``metric`` the user named."""
    from quantscope.tasks.headline import headline_of

    return headline_of(None if data is None else data.task, metric)


FIDELITY_PRIMARIES = ("sqnr_db_channel_min", "sqnr_db", "cosine_mean")
"""What the fidelity scorer can rank by (every one is in each of its scores)."""


def scorer_for(data: Dataset, model: Model | None = None, metric: str | None = None) -> Any:
    """The analysis scorer of the data's task (its row scoring), else every output's
    fidelity (the one ``--output`` when given), ranking by ``metric`` (``--metric``) when
    it is one of :data:`FIDELITY_PRIMARIES`, so the analysis ranks by what the plan is
    then judged by."""
    from quantscope.analyze.scoring import outputs_scorer, task_scorer
    from quantscope.tasks.headline import row_scoring_of

    rows = row_scoring_of(data.task, () if model is None else model.output_names())
    if rows is not None:
        return task_scorer(rows)
    if model is None:
        scorer = outputs_scorer()
    else:
        names = model.output_names()
        axes = output_channel_axes(model, data.evaluation)
        scorer = outputs_scorer(only=None if data.output is None else names.index(data.output),
                                channel_axes={names.index(k): a for k, a in axes.items()})
    if metric in FIDELITY_PRIMARIES:
        scorer = dataclasses.replace(scorer, primary=metric)
    return scorer


def _call(fn: Callable[[Any], Any], item: Any) -> Any:
    return fn(item)


def _measure_all(executor: Executor, evaluate: Callable[[Plan], float], progress: bool,
                 plans: Sequence[Plan]) -> list[float]:
    """Each plan measured by ``evaluate`` as one task of ``executor`` (results in order)."""
    say(f"plan: measuring {len(plans)} plan(s) as {executor.workers}-way parallel tasks",
        show=progress)
    return [float(v) for v in executor.map(_call, evaluate, list(plans))]


def _keep_finetune(pareto: dict[str, Any]) -> bool:
    """Keep the fine-tuned plan only if it measured at least as well as the plan without
    it (the planner's measurement with its repairs, else the precisions alone) and its
    fine-tuned FP32 model, measured against the original, is at least as good as the
    fine-tuned plan itself (else the float model leans on the 8-bit grid and is no
    faithful fallback); records the decision in ``pareto["finetune"]``."""
    ft = pareto["finetune"]
    base = pareto.get("chosen", {}).get("measured")
    base = ft.get("before") if base is None else base
    after = ft.get("after")
    higher = pareto.get("higher_is_better", True)

    def at_least(a: Any, b: Any) -> bool:
        return a is None or b is None or (a >= b if higher else a <= b)

    drift = (ft.get("fp32_drift") or {}).get(ft.get("metric"))
    better, faithful = at_least(after, base), at_least(drift, after)
    keep = ft.get("skipped") is None and better and faithful
    ft["kept"] = keep
    if not keep and ft.get("skipped") is None:
        ft["dropped"] = (
            f"measured {after:.4g} with finetune against {base:.4g} without" if not better else
            f"its fine-tuned FP32 model measures {drift:.4g} against the original, worse than "
            f"the fine-tuned plan's {after:.4g}: the float model leans on the 8-bit grid and "
            "is no faithful fallback") + ": the plan returned is the one without it"
    return keep


def goal_verdict(result: dict[str, Any], metric: str | Headline, goal: float, *,
                 split: bool = False, chunked: bool = False) -> dict[str, Any]:
    """Did the chosen plan reach ``goal`` (measured, in the metric's direction and unit);
    if not, which constraint binds (and the rewrite around it, unless the model is already
    ``split`` by heads / ``chunked`` by tokens)."""
    from quantscope.tasks.headline import describe_metric

    h = describe_metric(metric) if isinstance(metric, str) else metric
    metric = h.metric
    best = result.get("chosen", {}).get("measured")
    ft = result.get("finetune") or {}
    tuned = ft.get("after") if ft.get("kept", True) else None
    if tuned is not None:  # the plan returned is the fine-tuned one
        best = tuned if best is None else (max if h.higher_is_better else min)(best, tuned)
    reached = h.reached(best, goal)
    blockers = result.get("blockers", [])
    if reached and result.get("uniform_meets_goal"):
        verdict = (f"goal {h.goal_text(goal)} reached by uniform a8_w8 ({best:.4g}): no "
                   "promotion bought, the plan is uniform a8_w8")
    elif reached:
        verdict = f"goal {h.goal_text(goal)} reached: {best:.4g}"
    elif best is None:
        verdict = f"goal {h.goal_text(goal)} not checked: nothing was measured (give --data)"
    else:
        top = blockers[0] if blockers else None
        why = (f"binding: {top['rule']} blocks {len(top['groups'])} promotion(s) worth "
               f"{top['gain']:.3g} predicted" if top else "binding: no promotion left")
        verdict = f"goal {h.goal_text(goal)} NOT reached: best legal plan {best:.4g}; {why}"
    out = {"metric": metric, "unit": h.unit, "value": goal, "reached": reached,
           "verdict": verdict,
           "binding": None if reached or not blockers else blockers[0]["rule"]}
    if out["binding"] and str(out["binding"]).endswith(".super_defuse") and not chunked:
        out["hint"] = TOKENSPLIT_HINT
    elif out["binding"] and str(out["binding"]).endswith(".attention_16bit") and not split:
        out["hint"] = HEADSPLIT_HINT
    return out


TOKENSPLIT_HINT = (
    "hint: LayerNorms and residual Adds work token by token: 'quantscope tokensplit MODEL "
    "--seq-len N --out split.onnx' splits them into layers of fewer tokens, under the size "
    "limit (unverified on a device); calibrate, analyze and plan the split model")

HEADSPLIT_HINT = (
    "hint: attention stays at 8 bit; 'quantscope headsplit MODEL --out split.onnx' makes "
    "each head a layer of its own, so every head's scores, Softmax and context get their "
    "own 8-bit grid (unverified on a device); calibrate, analyze and plan the split model")


def format_search(result: dict[str, Any]) -> str:
    """Console form of a planner result (the plan JSON's ``pareto`` entry)."""
    c = result.get("chosen", {})
    lines = [f"metric {result.get('metric')} (predicted); budget {result.get('budget')}; "
             f"chosen: cost {c.get('cost')}, predicted {c.get('predicted')}, measured "
             f"{c.get('measured')}; budget met: {result.get('met')}"]
    if result.get("measured_on"):
        lines.append(f"measured on: {result['measured_on']}")
    for p in result.get("points", []):
        lines.append(f"  front: cost {p['cost']:<9} predicted {p['predicted']:<10} measured "
                     f"{p.get('measured')!s:<10} ({len(p.get('groups', {}))} promoted, "
                     f"{p.get('origin')})")
    for b in result.get("blockers", [])[:4]:
        lines.append(f"  blocked by {b['rule']}: {len(b['groups'])} group(s), "
                     f"{b['gain']:.3g} predicted gain forgone")
    if result.get("binding"):
        lines.append(f"binding: {result['binding']}")
    ft = result.get("finetune")
    if ft:
        drift = ", ".join(f"{k} {v:.4g}" for k, v in ft.get("fp32_drift", {}).items())
        lines.append(f"finetune ({'+'.join(ft['repairs'])}, {ft['seconds']} s): {ft['metric']} "
                     f"{ft['before']} -> {ft['after']} (measured in ORT); fine-tuned FP32 vs "
                     f"original FP32: {drift}" + (f"; skipped: {ft['skipped']}"
                                                  if ft.get("skipped") else "")
                     + (f"; DROPPED: {ft['dropped']}" if ft.get("dropped") else ""))
    for r in result.get("seq_lens", []):
        fit = f", {r['texts_fit']:.0%} of the texts fit" if "texts_fit" in r else ""
        lines.append(f"  seq {r['seq_len']}: cost {r['cost']}, predicted {r['predicted']}, "
                     f"measured {r['measured']}, {r['promoted']} promoted, binding "
                     f"{r['binding'] or '-'}{fit}"
                     + ("   <- chosen" if r["seq_len"] == result.get("seq_len") else ""))
    if result.get("goal"):
        lines.append(result["goal"]["verdict"])
        if result["goal"].get("hint"):
            lines.append(result["goal"]["hint"])
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


# ---------------------------------------------------------------- planning (`quantscope plan`)

@dataclass(frozen=True)
class PlanOptions:
    """What the plan search is asked for, besides the model, its analysis and the target.

    ``min_quality`` is in the analysis' predicted metric; ``goal`` is in the measured
    ``metric`` (needs data); ``repairs`` are measured, so they need data and statistics.
    """

    min_quality: float | None = None
    max_cost: float | None = None
    seq_len: int | None = None
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # --input-shape overrides
    metric: str | None = None  # None: the data's default (see default_metric)
    goal: float | None = None
    repairs: tuple[str, ...] = ()
    repair_batches: int = 8
    seed: int = 0

    def check_inputs(self, *, data: bool, stats: bool) -> None:
        """One-line errors for options the given data contradicts (call before opening it)."""
        if self.min_quality is not None and data:
            raise QuantscopeError(
                "--min-quality is in the analysis' predicted metric (output SQNR, dB) while "
                "--data measures the task metric: use --max-cost with --data, or --min-quality "
                "without --data"
            )
        if self.repairs and not (data and stats):
            raise QuantscopeError("--repairs needs --data and --stats: repairs are measured")


@dataclass(frozen=True)
class PlanResult:
    """A searched plan and the records its plan file keeps next to it."""

    plan: Plan
    pareto: dict[str, Any]  # the plan file's ``pareto`` entry (front, budget, blockers, goal)
    repairs: tuple[dict[str, Any], ...] = ()  # the repairs chosen, with their reasons
    offer: Offer | None = None  # every requested repair as measured alone (with --repairs)

    def file_extra(self) -> dict[str, Any]:
        """The plan file's keys besides the plan itself (``write_plan``'s ``extra``)."""
        extra: dict[str, Any] = {"pareto": self.pareto}
        if self.repairs:
            extra["repairs"] = list(self.repairs)
        if self.offer is not None:
            extra["repair_offer"] = {"measured": list(self.offer.measured),
                                     "notes": list(self.offer.notes)}
        return extra


def plan_model(
    model: Model,
    analysis: Sensitivity,
    target: Target,
    options: PlanOptions = PlanOptions(),
    *,
    data: Dataset | None = None,
    stats: Stats | None = None,
    progress: bool = False,
    executor: Executor | None = None,
) -> PlanResult:
    """Search a legal plan from an analysis; with ``data`` and ``stats`` the front is
    re-measured by real emulation and ``options.repairs`` are measured and searched too;
    ``executor`` (e.g. Ray) measures the batch of best-predicted points in parallel.

    ``finetune`` among the repairs is not a search move (one fine-tune costs minutes): the
    chosen plan, with its repairs, is fine-tuned and measured again, and
    ``pareto["finetune"]`` records both measurements, the fine-tuned FP32 model's own
    drift from the original and the time; the plan returned is the fine-tuned one (its
    learned ranges pinned, ``finetune`` in its repairs, so ``repair --plan`` rebuilds it)
    when it measured at least as well as the plan without it, else the plan without it
    (``kept``/``dropped`` say which).
    """
    from quantscope.model.shapes import given_shapes
    from quantscope.plan.search import plan_from_analysis

    options.check_inputs(data=data is not None, stats=stats is not None)
    head = headline(data, options.metric)
    if data is not None or options.metric:  # without data the goal is not measured
        head.check_goal(options.goal)  # before any work: a goal the metric cannot take
    if options.metric is None:
        options = dataclasses.replace(options, metric=head.metric)
    truncated = None
    if data is not None and options.seq_len is not None:
        cut = at_length(data, options.seq_len)  # measured on what that length runs
        truncated, data = (cut.notes[-1] if cut is not data else None), cut
    finetune = "finetune" in options.repairs
    if finetune:
        options = dataclasses.replace(
            options, repairs=tuple(r for r in options.repairs if r != "finetune"))
    shapes = given_shapes(model, options.seq_len, options.input_shapes)
    evaluate, offer = None, None
    if data is not None and stats is not None:
        evaluate, offer = _plan_measurement(model, analysis, target, options, data, stats,
                                            shapes=shapes, progress=progress)
    if options.goal is not None and evaluate is not None:
        uniform = _uniform_if_enough(model, analysis, target, options, head, evaluate, shapes)
        if uniform is not None:  # uniform a8_w8 meets the goal: buy no cost
            if truncated:
                uniform.pareto["measured_on"] = truncated
            uniform.pareto["goal"] = goal_verdict(uniform.pareto, head, options.goal)
            return uniform
    many = None
    if evaluate is not None and executor is not None:
        many = functools.partial(_measure_all, executor, evaluate, progress)
    plan, extra = plan_from_analysis(model, analysis, target, min_quality=options.min_quality,
                                     max_cost=options.max_cost, shapes=shapes,
                                     evaluate=evaluate, evaluate_many=many,
                                     seed=options.seed, repairs=offer.options if offer else ())
    pareto = extra["pareto"]
    if truncated:
        pareto["measured_on"] = truncated
    if finetune and data is not None and stats is not None:
        tuned, pareto["finetune"] = finetune_chosen(model, data, stats, plan, target, options,
                                                    progress=progress)
        if _keep_finetune(pareto):
            plan = tuned
    if options.goal is not None:
        from quantscope.repair.heads import METADATA_KEY as HEADS
        from quantscope.repair.tokens import METADATA_KEY as TOKENS

        done = {p.key for p in model.proto.metadata_props} & {HEADS, TOKENS}
        pareto["goal"] = goal_verdict(pareto, head, options.goal,
                                      split=HEADS in done, chunked=TOKENS in done)
    return PlanResult(plan=plan, pareto=pareto, repairs=tuple(extra.get("repairs", ())),
                      offer=offer)


UNIFORM_PLANNER = "quantscope.stages uniform a8_w8 meets the goal/1"


def _uniform_if_enough(model: Model, analysis: Sensitivity, target: Target,
                       options: PlanOptions, head: Headline, evaluate: Evaluate,
                       shapes: dict[str, tuple[int, ...]] | None) -> PlanResult | None:
    """Uniform a8_w8 as the plan when it is legal on ``target``, within ``max_cost`` and
    measures at the goal already (no promotion is bought then); else None (search)."""
    from quantscope.plan.check import check

    if options.max_cost is not None and options.max_cost < 1.0:
        return None
    plan = Plan(default=Precision.A8_W8, target=target.name)
    problems = check(plan, find_groups(model), model, target, shapes=shapes)
    if any(p.severity == "error" for p in problems):
        return None
    value = float(evaluate(plan))
    if not head.reached(value, float(options.goal)):  # type: ignore[arg-type]
        return None
    note = (f"uniform a8_w8 measures {head.metric} {value:.6g}, at the goal "
            f"({head.goal_text(float(options.goal))}): it is the plan, no promotion bought "  # type: ignore[arg-type]
            "(the search was not run)")
    point = {"cost": 1.0, "predicted": round(analysis.base, 6), "measured": round(value, 6),
             "origin": "start", "step": 0, "groups": {}}
    pareto: dict[str, Any] = {
        "metric": analysis.metric, "higher_is_better": analysis.higher_is_better,
        "budget": {"min_quality": options.min_quality, "max_cost": options.max_cost},
        "met": True, "chosen": {k: point[k] for k in ("cost", "predicted", "measured")},
        "binding": None, "blockers": [], "points": [point], "trials": [point], "skipped": [],
        "notes": [note], "uniform_meets_goal": True,
    }
    meta = (("planner", UNIFORM_PLANNER), ("metric", head.metric),
            ("seed", str(options.seed)), ("cost", "1"), ("measured", f"{value:.6g}"),
            ("note", note))
    plan = Plan(default=Precision.A8_W8, target=target.name, meta=meta)
    return PlanResult(plan=plan, pareto=pareto)


def finetune_chosen(
    model: Model, data: Dataset, stats: Stats, plan: Plan, target: Target,
    options: PlanOptions, *, progress: bool = False,
) -> tuple[Plan, dict[str, Any]]:
    """The chosen plan's repairs plus ``finetune``, measured against the original FP32."""
    import time

    from quantscope.repair.apply import run_repairs

    chosen = [r for r in dict(plan.meta).get("repairs", "").split(",") if r]
    names = [*chosen, "finetune"]
    feeds = list(data.calibration)[: options.repair_batches]
    t0 = time.perf_counter()
    out = run_repairs(model, stats, plan, feeds, repairs=names, scheme=target.scheme,
                      task=data.task, progress=progress)
    tuned = load_proto(out.proto, f"{model.source} (repaired: {','.join(names)})")
    ref = run_model(model.proto, list(data.evaluation))
    runs = evaluate_plans(tuned, data, out.stats, {
        "plan": out.plan, "fp32": Plan.uniform(Precision.FLOAT)}, reference_outputs=ref,
        saturation=False, progress=progress)
    before = evaluate_plan(model, data, stats, plan, reference_outputs=ref,
                           saturation=False)["metrics"]
    keys = (options.metric, "embedding_cosine_mean", "recall@1", "sqnr_db")
    rec = next(r for r in out.records if r.name == "finetune")
    result = {
        "metric": options.metric, "repairs": names,
        "before": before.get(options.metric), "after": runs["plan"]["metrics"].get(options.metric),
        "before_metrics": {k: before[k] for k in keys if k in before},
        "after_metrics": {k: runs["plan"]["metrics"][k] for k in keys
                          if k in runs["plan"]["metrics"]},
        "fp32_drift": {k: runs["fp32"]["metrics"][k] for k in keys
                       if k in runs["fp32"]["metrics"]},
        "seconds": round(time.perf_counter() - t0, 1), "record": rec.reason,
        "skipped": rec.skipped,
    }
    meta = (*[(k, v) for k, v in out.plan.meta if k != "repairs"], ("repairs", ",".join(names)))
    return dataclasses.replace(out.plan, meta=meta), result


def plan_lengths(
    model: Model,
    analysis: Sensitivity,
    target: Target,
    options: PlanOptions,
    lengths: Sequence[int],
    *,
    data: Dataset | None = None,
    stats: Stats | None = None,
    progress: bool = False,
    executor: Executor | None = None,
) -> PlanResult:
    """Sequence length as a decision: one search per allowed length (legality depends on
    it: super-defuse binds at 256, not at 128); the result is the best length's plan, and
    ``pareto["seq_lens"]`` has every length's chosen point, what binds there and, for
    text data, the fraction of texts that fit. Best = highest measured quality (predicted
    without data), ties to the longer length."""
    rows, results = [], {}
    for n in lengths:
        r = plan_model(model, analysis, target, dataclasses.replace(options, seq_len=n),
                       data=data, stats=stats, progress=progress, executor=executor)
        c = r.pareto.get("chosen", {})
        q = c.get("measured") if c.get("measured") is not None else c.get("predicted")
        rows.append({"seq_len": n, "cost": c.get("cost"), "predicted": c.get("predicted"),
                     "measured": c.get("measured"), "binding": r.pareto.get("binding"),
                     "promoted": len(r.plan.overrides), **_fit(data, n)})
        results[n] = (q, r)
    best = max(lengths, key=lambda n: (results[n][0] if results[n][0] is not None
                                       else float("-inf"), n))
    chosen = results[best][1]
    pareto = {**chosen.pareto, "seq_len": best, "seq_lens": rows}
    return dataclasses.replace(chosen, pareto=pareto)


def _fit(data: Dataset | None, n: int) -> dict[str, float]:
    lengths = None if data is None else data.token_lengths
    if lengths is None or len(lengths) == 0:
        return {}
    return {"texts_fit": float(np.mean(lengths <= n))}


def _plan_measurement(
    model: Model,
    analysis: Sensitivity,
    target: Target,
    options: PlanOptions,
    data: Dataset,
    stats: Stats,
    *,
    shapes: dict[str, tuple[int, ...]] | None,
    progress: bool,
) -> tuple[Any, Offer | None]:
    """The planner's real-emulation evaluator, and the measured repair offer if asked."""
    if not options.repairs:
        return plan_evaluator(model, data, stats, options.metric, target=target), None
    ref = run_model(model.proto, list(data.evaluation), label="fp32" if progress else "")
    feeds = list(data.calibration)[: options.repair_batches]
    offer = plan_repair_offer(model, data, stats, analysis, target, list(options.repairs),
                              feeds, task_metric=options.metric, shapes=shapes,
                              reference_outputs=ref, progress=progress)
    evaluate = plan_evaluator(model, data, stats, options.metric, feeds, target=target,
                              reference_outputs=ref, progress=progress)
    return evaluate, offer
