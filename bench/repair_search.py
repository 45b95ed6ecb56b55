"""What a plan search pays to repair each candidate, with and without the repair memo.

    python bench/repair_search.py [MODEL] [--data D] [--target T] [--plans K]
                                  [--repairs equalize,bias,ranges]

The plan search measures every candidate plan after its repairs (``plan --repairs``,
``run``'s joint search). ``equalize``, ``smooth`` and ``split`` never read the plan, so
the search's repair (``stages.plan_measure._plan_repair``) keeps their result for the
model (``repair.apply.RepairMemo``) and runs only the plan's own steps (bias, ranges …)
per candidate. In one process, baseline first: K plans (uniform a8_w8, then seeded mixes
with a random quarter of the groups at a16_w16) repaired by ``run_repairs`` with no memo,
then by the search's repair; the seconds per plan, the ratio, and the largest difference
of any repaired weight between the two (0.0: the same models).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import numpy_helper

from quantscope.calibrate.collect import calibrate
from quantscope.model.groups import find_groups
from quantscope.repair.apply import run_repairs
from quantscope.stages import open_data, open_model
from quantscope.stages.plan_measure import _plan_repair
from quantscope.targets import load_target
from quantscope.types import Plan, Precision


def _plans(model, k: int, seed: int = 0) -> list[Plan]:
    names = [g.name for g in find_groups(model).groups]
    rng = np.random.default_rng(seed)
    plans = [Plan.uniform(Precision.A8_W8)]
    while len(plans) < k:
        up = rng.choice(len(names), size=max(1, len(names) // 4), replace=False)
        plans.append(Plan(Precision.A8_W8, tuple((names[i], Precision.A16_W16)
                                                 for i in sorted(up))))
    return plans


def _weights(proto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default="mobilefacenet")
    ap.add_argument("--data", default="faces")
    ap.add_argument("--target", default="hailo8l")
    ap.add_argument("--plans", type=int, default=4)
    ap.add_argument("--repairs", default="equalize,bias,ranges")
    ap.add_argument("--batches", type=int, default=8, help="calibration feeds (plan's default)")
    a = ap.parse_args()
    model = open_model(a.model)
    data = open_data(a.data, model, show=False)
    feeds = list(data.calibration)[: a.batches]
    stats = calibrate(model, find_groups(model), iter(feeds))
    target, names = load_target(a.target), a.repairs.split(",")
    plans = _plans(model, a.plans)
    print(f"{a.model}, {a.data}, {a.target}: {len(plans)} plans, repairs {a.repairs}, "
          f"{len(feeds)} calibration feeds")
    t0 = time.perf_counter()
    base = [run_repairs(model, stats, p, feeds, repairs=names, scheme=target.scheme)
            for p in plans]
    t_base = time.perf_counter() - t0
    repair = _plan_repair(feeds, target)
    t0 = time.perf_counter()
    memo = [repair(model, stats, p, names) for p in plans]
    t_memo = time.perf_counter() - t0
    diff = 0.0
    for b, m in zip(base, memo, strict=True):
        wb, wm = _weights(b.proto), _weights(m.model.proto)
        assert wb.keys() == wm.keys()
        diff = max([diff] + [float(np.abs(wb[k] - wm[k]).max()) for k in wb])
    print(f"no memo (baseline): {t_base / len(plans):.1f} s per plan")
    print(f"search's repair (memo): {t_memo / len(plans):.1f} s per plan, "
          f"{t_base / t_memo:.2f}x; largest repaired-weight difference {diff:g}")


if __name__ == "__main__":
    main()
