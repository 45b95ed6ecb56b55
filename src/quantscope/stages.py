"""Stage composition used by the CLI and the Python API.

Each function is a thin, typed composition of the stage functions (load, find_groups,
calibrate, encode, build_qdq, evaluate); nothing here holds state between calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode
from quantscope.emulate.evaluate import Outputs, output_fidelity, run_model
from quantscope.emulate.qdq import build_qdq
from quantscope.model.groups import check_plan_names, find_groups
from quantscope.model.load import Model, load, load_proto
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
from quantscope.tasks.tensors import load_tensor_batches
from quantscope.types import Encodings, Groups, Metrics, Plan, QuantScheme, QuantscopeError, Stats

__all__ = [
    "Dataset", "open_model", "open_data", "calibrate_model", "qdq_for_plan", "evaluate_plan",
    "format_result", "describe_groups", "read_plan", "read_stats", "write_json", "write_onnx",
    "write_stats", "opset_of", "load_proto", "write_plan", "write_text", "evaluate_plans",
    "export_plan", "device_io_rows", "plan_problems", "read_text", "read_json_file",
]

Batch = dict[str, np.ndarray]


class Task(Protocol):
    """A task turns FP32 and emulated outputs of the eval batches into task metrics."""

    name: str

    def metrics(self, ref: Outputs, test: Outputs) -> Metrics: ...


@dataclass(frozen=True, eq=False)
class Dataset:
    """Calibration and evaluation batches, plus the task that scores them (if any)."""

    name: str
    calibration: tuple[Batch, ...]
    evaluation: tuple[Batch, ...]
    task: Task | None = None
    notes: tuple[str, ...] = ()

    def calibration_batches(self) -> Iterator[Batch]:
        yield from self.calibration


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
    spec: str | Path, model: Model, *, tokenizer: str | None = None, max_pairs: int | None = None
) -> Dataset:
    """Tensor files/folders, or a built-in or user task (text pairs, face images)."""
    from quantscope.tasks.registry import open_task_data

    ds = open_task_data(str(spec), model, tokenizer=tokenizer, max_pairs=max_pairs)
    if ds is not None:
        return ds
    batches = tuple(load_tensor_batches(spec, model))
    return Dataset(name=str(spec), calibration=batches, evaluation=batches)


def calibrate_model(
    model: Model, data: Dataset, *, method: str = "minmax", progress: bool = False
) -> Stats:
    return calibrate(model, find_groups(model), data.calibration_batches(), method=method,
                     progress=progress)


def qdq_for_plan(
    model: Model,
    stats: Stats,
    plan: Plan,
    *,
    method: str | None = None,
    scheme: QuantScheme | None = None,
) -> tuple[onnx.ModelProto, tuple[str, ...]]:
    """The QDQ model for a plan, and the notes the encoder made."""
    groups = find_groups(model)
    check_plan_names(plan, groups)
    enc = encode(model, groups, stats, plan, scheme=scheme, method=method)
    return build_qdq(model, groups, plan, enc), enc.notes


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
) -> dict[str, Any]:
    """Fidelity (and task metrics when the data has a task) of ``plan`` against FP32."""
    return evaluate_plans(model, data, stats, {"emulated": plan}, method=method, scheme=scheme,
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
) -> dict[str, dict[str, Any]]:
    """Like :func:`evaluate_plan` for several plans, running the FP32 model only once.

    ``reference`` is the FP32 model the metrics compare against (default: ``model``); a
    repaired model is compared with the original, since bias correction changes FP32.
    ``reference_outputs`` (its outputs on ``data.evaluation``) skips even that one run.
    """
    batches = list(data.evaluation)
    ref = reference_outputs or run_model(
        (reference or model).proto, batches, label="fp32" if progress else ""
    )
    results: dict[str, dict[str, Any]] = {}
    for label, plan in plans.items():
        qdq, notes = qdq_for_plan(model, stats, plan, method=method, scheme=scheme)
        test = run_model(qdq, batches, label=label if progress else "")
        fid = output_fidelity(ref, test)
        metrics, tables, task_notes = dict(fid.values), dict(fid.tables), ()
        if data.task is not None:
            tm = data.task.metrics(ref, test)
            metrics.update(tm.values)
            tables.update(tm.tables)
            task_notes = tm.notes
        results[label] = {
            "model": model.source, "data": data.name, "plan": plan_to_dict(plan),
            "method": method or stats.method, "metrics": metrics, "outputs": tables,
            "notes": [*data.notes, *notes, *task_notes],
        }
    return results


def format_result(result: dict[str, Any]) -> str:
    m = result["metrics"]
    lines = [f"model {result['model']}  data {result['data']}  plan default "
             f"{result['plan']['default']} (+{len(result['plan'].get('groups', {}))} overrides)"]
    lines += [f"  {k:<24} {v:.6g}" for k, v in m.items()]
    lines += [f"  note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)


def describe_groups(model: Model) -> list[dict[str, Any]]:
    return [
        {"name": g.name, "op_type": g.op_type, "kind": g.kind.value, "nodes": list(g.nodes),
         "outputs": list(g.outputs), "weight": g.weight,
         "output_shape": list(g.output_shape) if g.output_shape else None}
        for g in find_groups(model).groups
    ]


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


def scheme_for(plan: Plan) -> QuantScheme | None:
    """The quantization scheme of the plan's target, if it names one."""
    if not plan.target:
        return None
    from quantscope.targets import load_target

    return load_target(plan.target).scheme


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

    groups = find_groups(model)
    check_plan_names(plan, groups)
    scheme = scheme_for(plan)
    enc = encode(model, groups, stats, plan, scheme=scheme)
    if fmt == "alls":
        names = hn_layer_names(hn, groups) if hn else None
        return write_text(out, export_alls(plan, groups, layer_names=names,
                                           force_ranges=forced_ranges(groups, plan, enc)))
    if fmt == "qnn":
        return write_text(out, to_json(export_qnn_encodings(plan, groups, enc, version=qnn_version)))
    if fmt == "qdq":
        return write_onnx(out, build_qdq(model, groups, plan, enc))
    raise QuantscopeError(f"unknown export format '{fmt}': use alls, qnn or qdq")


def device_io_rows(model: Model, stats: Stats, plan: Plan) -> list[dict[str, Any]]:
    """Stored type, scale and zero-point of every quantized model input and output."""
    from quantscope.export.device_io import device_io

    groups = find_groups(model)
    check_plan_names(plan, groups)
    enc = encode(model, groups, stats, plan, scheme=scheme_for(plan))
    return device_io(model, groups, enc)


def plan_problems(model: Model, plan: Plan, *, seq_len: int | None = None) -> list[dict[str, Any]]:
    """Legality problems of a plan on its own target (empty when it names none)."""
    if not plan.target:
        return []
    from quantscope.plan.check import check, seq_len_shapes
    from quantscope.targets import load_target

    shapes = seq_len_shapes(model, seq_len) if seq_len else None
    problems = check(plan, find_groups(model), model, load_target(plan.target), shapes=shapes)
    return [dataclasses.asdict(p) for p in problems]


def scorer_for(data: Dataset) -> Any:
    """The analysis scorer matching the data's task (task-independent fidelity otherwise)."""
    from quantscope.analyze.scoring import Scorer, text_retrieval_scorer
    from quantscope.tasks.registry import RetrievalTask

    task = data.task
    if isinstance(task, RetrievalTask):
        mask = task.encoder.input_name("attention_mask")
        return text_retrieval_scorer(task.n_pairs, task.batches.order, mask)
    return Scorer()


def goal_verdict(result: dict[str, Any], metric: str, goal: float) -> dict[str, Any]:
    """Did the chosen plan reach ``goal`` (measured); if not, which constraint binds."""
    best = result.get("chosen", {}).get("measured")
    reached = best is not None and best >= goal
    blockers = result.get("blockers", [])
    if reached:
        verdict = f"goal {metric} >= {goal:g} reached: {best:.4g}"
    elif best is None:
        verdict = f"goal {metric} >= {goal:g} not checked: nothing was measured (give --data)"
    else:
        top = blockers[0] if blockers else None
        why = (f"binding: {top['rule']} blocks {len(top['groups'])} promotion(s) worth "
               f"{top['gain']:.3g} predicted" if top else "binding: no promotion left")
        verdict = f"goal {metric} >= {goal:g} NOT reached: best legal plan {best:.4g}; {why}"
    return {"metric": metric, "value": goal, "reached": reached, "verdict": verdict,
            "binding": None if reached or not blockers else blockers[0]["rule"]}


def format_search(result: dict[str, Any]) -> str:
    """Console form of a planner result (the plan JSON's ``pareto`` entry)."""
    c = result.get("chosen", {})
    lines = [f"metric {result.get('metric')} (predicted); budget {result.get('budget')}; "
             f"chosen: cost {c.get('cost')}, predicted {c.get('predicted')}, measured "
             f"{c.get('measured')}; budget met: {result.get('met')}"]
    for p in result.get("points", []):
        lines.append(f"  front: cost {p['cost']:<9} predicted {p['predicted']:<10} measured "
                     f"{p.get('measured')!s:<10} ({len(p.get('groups', {}))} promoted, "
                     f"{p.get('origin')})")
    for b in result.get("blockers", [])[:4]:
        lines.append(f"  blocked by {b['rule']}: {len(b['groups'])} group(s), "
                     f"{b['gain']:.3g} predicted gain forgone")
    if result.get("binding"):
        lines.append(f"binding: {result['binding']}")
    if result.get("goal"):
        lines.append(result["goal"]["verdict"])
    lines += [f"note: {n}" for n in result.get("notes", [])]
    return "\n".join(lines)
