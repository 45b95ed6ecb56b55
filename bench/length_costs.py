"""The deploy stage's cost table (``stages.buckets.length_costs``: every candidate plan's
cost at every compiled length) before and after stop 56's three lookups, in one process:

- ``Plan.precision_of`` built a dict of the plan's overrides on every call (once per group
  per plan per length, and again per edge): now once per plan;
- a weighted group's work read its weight array (``initializer_array``, a copy of the
  data) for its shape, and ``weight_count`` scanned every initializer: now the shapes
  are read once per model (``Model.initializer_dims``);
- ``Model.value_shapes`` walked every value info on each call: now once per model.

The baseline puts the three old forms back (monkeypatched, the same process) on fresh
model objects; the shape inference per length is cached either way (a fresh model each
run pays for it in both). The costs must be equal to the last bit.

    PYTHONPATH=src python bench/length_costs.py RUN_FOLDER

``RUN_FOLDER``: a finished ``quantscope run`` folder of a text encoder with a deployment
(``rewritten.onnx`` or the model, ``stats.npz``, ``len-*/plan.json``), e.g. minilm-l6's.
"""

from __future__ import annotations

import argparse
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from quantscope import stages
from quantscope.model.load import Model
from quantscope.plan import cost
from quantscope.plan.deployment import Candidate
from quantscope.serde import read_plan
from quantscope.stages import buckets as B
from quantscope.targets import load_target
from quantscope.types import Plan

LENGTHS = (16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)


@contextmanager
def old_forms() -> Any:
    """The three lookups as they were before stop 56."""
    saved = (Plan.precision_of, Model.initializer_dims, Model.value_shapes, cost.weight_count)

    def precision_of(self: Plan, group: str) -> Any:
        return dict(self.overrides).get(group, self.default)

    def initializer_dims(self: Model, name: str) -> tuple[int, ...]:
        return tuple(self.initializer_array(name).shape)  # group_work read the array

    def weight_count(group: Any, model: Model | None) -> float:
        if model is None or group.kind is not cost.GroupKind.WEIGHTED or group.weight is None:
            return 0.0
        return float(next((math.prod(t.dims) for t in model.graph.initializer
                           if t.name == group.weight), 0))

    def value_shapes(self: Model) -> dict[str, Any]:
        return dict(Model._value_shapes.func(self))  # type: ignore[attr-defined]

    Plan.precision_of, Model.initializer_dims, Model.value_shapes = (  # type: ignore[method-assign]
        precision_of, initializer_dims, value_shapes)
    cost.weight_count = weight_count
    try:
        yield
    finally:
        (Plan.precision_of, Model.initializer_dims, Model.value_shapes,  # type: ignore[method-assign]
         cost.weight_count) = saved


def table(folder: Path, target: str) -> tuple[np.ndarray, float]:
    """The cost table of the folder's deployment plans at LENGTHS, on a fresh model."""
    path = folder / "rewritten.onnx"
    model = stages.open_model(str(path if path.is_file() else folder / "model.onnx"))
    stats = stages.read_stats(folder / "stats.npz")
    cands = tuple(Candidate(name=d.name, model=model, stats=stats,
                            plan=read_plan(d / "plan.json"))
                  for d in sorted(folder.glob("len-*")))
    t = time.perf_counter()
    costs = B.length_costs(model, cands, load_target(target), LENGTHS)
    return costs, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--target", default="hailo10h")
    args = ap.parse_args()
    best: dict[str, float] = {}
    tables: dict[str, np.ndarray] = {}
    for variant in ("before", "after") * 2:
        if variant == "before":
            with old_forms():
                tables[variant], s = table(args.folder, args.target)
        else:
            tables[variant], s = table(args.folder, args.target)
        best[variant] = min(best.get(variant, np.inf), s)
        print(f"{variant}: {s:.2f} s")
    same = np.array_equal(tables["before"], tables["after"])
    print(f"{len(tables['after'])} plans x {len(LENGTHS)} lengths: before {best['before']:.2f} s, "
          f"after {best['after']:.2f} s, {best['before'] / best['after']:.2f}x; "
          f"costs equal: {same}")


if __name__ == "__main__":
    main()
