"""Stage composition used by the CLI and the Python API.

Each function is a thin, typed composition of the stage functions (load, find_groups,
calibrate, encode, build_qdq, evaluate); nothing here holds state between calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode
from quantscope.emulate.evaluate import Outputs, evaluate_fidelity
from quantscope.emulate.qdq import build_qdq
from quantscope.model.groups import check_plan_names, find_groups
from quantscope.model.load import Model, load
from quantscope.serde import (
    plan_to_dict,
    read_plan,
    read_stats,
    write_json,
    write_onnx,
    write_stats,
)
from quantscope.tasks.tensors import load_tensor_batches
from quantscope.types import Metrics, Plan, QuantScheme, Stats

__all__ = [
    "Dataset", "open_model", "open_data", "calibrate_model", "qdq_for_plan", "evaluate_plan",
    "format_result", "describe_groups", "read_plan", "read_stats", "write_json", "write_onnx",
    "write_stats", "opset_of",
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
    try:
        from quantscope.zoo import resolve_model
    except ImportError:  # the zoo is optional at this layer
        return Path(spec)
    return Path(resolve_model(spec))


def open_model(spec: str | Path) -> Model:
    return load(resolve_model_path(str(spec)))


def open_data(spec: str | Path, model: Model, *, tokenizer: str | None = None) -> Dataset:
    """Tensor files/folders, or a built-in or user task (text pairs, face images)."""
    try:
        from quantscope.tasks.registry import open_task_data
    except ImportError:
        open_task_data = None
    if open_task_data is not None:
        ds = open_task_data(str(spec), model, tokenizer=tokenizer)
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
) -> dict[str, Any]:
    """Fidelity (and task metrics when the data has a task) of ``plan`` against FP32."""
    qdq, notes = qdq_for_plan(model, stats, plan, method=method, scheme=scheme)
    fid, ref, test = evaluate_fidelity(model, qdq, list(data.evaluation), progress=progress)
    metrics = dict(fid.values)
    tables = dict(fid.tables)
    task_notes: tuple[str, ...] = ()
    if data.task is not None:
        tm = data.task.metrics(ref, test)
        metrics.update(tm.values)
        tables.update(tm.tables)
        task_notes = tm.notes
    return {
        "model": model.source,
        "data": data.name,
        "plan": plan_to_dict(plan),
        "method": method or stats.method,
        "metrics": metrics,
        "outputs": tables,
        "notes": [*data.notes, *notes, *task_notes],
    }


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
