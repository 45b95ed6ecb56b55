"""Benchmark: the planner's candidate evaluations per minute against the code the issue
measured ("today's", issue 35), both in one process.

``bench/search.py``'s ``today`` variant reproduces the issue's evaluator on the current
code base (a full QDQ graph per plan, every metric scored the old way), so every later
speed-up of the shared machinery (model loads, weight copies, the groups and ranges found
once per model) makes that baseline faster too, and its ratio measures only what differs
between the two evaluators. This bench measures against the code itself as it stood
when the issue was filed: ``--baseline`` (default ``fbe0faf3^``, the commit before the
first change made for the issue) is unpacked from git (``git archive``; nothing in the
working tree is touched) and imported beside the current ``src/`` in this process, each
version under its own ``sys.modules`` (swapped in before each of its calls). Each version
opens the model, the data and the calibration, computes FP32's outputs and measures one
untimed warm-up plan with an evaluator of its own; then the same measured greedy walk as
``bench/search.py`` (from uniform a8_w8, ``--plans`` random groups promoted to a16_w16 one
at a time, each kept when the metric does not drop) runs with each version's
``stages.plan.plan_evaluator`` (the planner's evaluator, a new one per walk), the
versions alternating ``--rounds`` times (baseline first) so that a change in the
machine's load falls on both. Printed per walk: wall and process CPU seconds, plans per
minute; then per version the median, the ratio of the medians, and whether the two walks
took the same decisions and measured the same values.

    PYTHONPATH=src .venv/bin/python bench/search_filing.py --model minilm-l6 --pairs 128
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _unpack(rev: str, into: Path) -> tuple[str, Path]:
    """``rev``'s ``src/`` unpacked under ``into`` (read from git; the tree untouched)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], check=True,
                         capture_output=True, text=True).stdout.strip()
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", sha, "src"], check=True,
                          capture_output=True).stdout
    tar = into / "src.tar"
    tar.write_bytes(blob)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return sha, into / "src"


class Version:
    """One copy of the package: its ``sys.modules`` entries, swapped in before each use."""

    def __init__(self, label: str, src: Path) -> None:
        self.label, self.src = label, str(src)
        self.modules: dict[str, ModuleType] = {}
        self.setup: dict[str, Any] = {}

    def enter(self) -> None:
        for k in [k for k in sys.modules if k == "quantscope" or k.startswith("quantscope.")]:
            del sys.modules[k]
        sys.modules.update(self.modules)
        sys.path[:] = [self.src, *(p for p in sys.path if p not in SRCS)]
        importlib.invalidate_caches()

    def leave(self) -> None:
        self.modules = {k: m for k, m in sys.modules.items()
                        if k == "quantscope" or k.startswith("quantscope.")}


SRCS: set[str] = set()


def prepare(v: Version, args: argparse.Namespace) -> tuple[str, ...]:
    """Open, calibrate, FP32's outputs and one untimed warm-up plan; the group names."""
    v.enter()
    from quantscope import stages
    from quantscope.analyze.measure import headline
    from quantscope.emulate.evaluate import run_model
    from quantscope.model.groups import find_groups
    from quantscope.stages.plan import plan_evaluator
    from quantscope.tasks.registry import at_length
    from quantscope.types import Plan, Precision

    t0 = time.perf_counter()
    model = stages.open_model(args.model)
    data = at_length(stages.open_data("stdlib-docs", model, max_pairs=args.pairs, show=False),
                     args.seq_len)
    stats = stages.calibrate_model(model, data)
    metric = headline(data, args.metric).metric
    ref = run_model(model.proto, list(data.evaluation))
    plan_evaluator(model, data, stats, metric, reference_outputs=ref)(
        Plan.uniform(Precision.A8_W8))  # warm-up: first session, lazy imports, per-model memos
    v.setup = {"model": model, "data": data, "stats": stats, "metric": metric, "ref": ref}
    names = tuple(find_groups(model).names())
    print(f"{v.label}: {len(names)} groups, metric {metric}, set-up "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    v.leave()
    return names


def walk(v: Version, order: list[str]) -> dict[str, Any]:
    """The measured greedy walk with a new ``plan_evaluator`` of ``v``."""
    v.enter()
    from quantscope.stages.plan import plan_evaluator
    from quantscope.types import Plan, Precision

    s = v.setup
    cpu, t0 = time.process_time(), time.perf_counter()
    evaluate = plan_evaluator(s["model"], s["data"], s["stats"], s["metric"],
                              reference_outputs=s["ref"])
    kept: list[str] = []
    best = float(evaluate(Plan.uniform(Precision.A8_W8)))
    values, taken = [best], [True]
    for g in order:
        value = float(evaluate(Plan(default=Precision.A8_W8, overrides=tuple(
            (x, Precision.A16_W16) for x in [*kept, g]))))
        values.append(value)
        taken.append(value >= best)
        if value >= best:
            kept, best = [*kept, g], value
    secs, cpu = time.perf_counter() - t0, time.process_time() - cpu
    del evaluate
    v.leave()
    return {"version": v.label, "seconds": round(secs, 2), "cpu_seconds": round(cpu, 2),
            "plans_per_minute": round(60 * len(values) / secs, 2), "values": values,
            "taken": taken, "chosen": best, "chosen_plan": sorted(kept),
            "load_average": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--pairs", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--plans", type=int, default=16, help="promotions measured after the start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="walks per version, alternating")
    ap.add_argument("--baseline", default="fbe0faf3^",
                    help="the git revision measured as 'today' (default: before issue 35)")
    ap.add_argument("--metric", help="the measured metric (default: the task's headline)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qs-filing-") as tmp:
        sha, old_src = _unpack(args.baseline, Path(tmp))
        SRCS.update({str(old_src), str(ROOT / "src")})
        old = Version(f"today ({sha[:8]})", old_src)
        new = Version("now (working tree)", ROOT / "src")
        names = prepare(old, args)
        now_names = prepare(new, args)
        common = tuple(n for n in names if n in set(now_names))
        if len(common) != len(names) or len(common) != len(now_names):
            print(f"groups only in the baseline: {sorted(set(names) - set(common))}; only "
                  f"now: {sorted(set(now_names) - set(common))}; the walk draws from the "
                  f"{len(common)} both have", flush=True)
        names = common
        rng = np.random.default_rng(args.seed)
        order = [names[i] for i in rng.permutation(len(names))[:args.plans]]
        rows = []
        for _ in range(args.rounds):
            for v in (old, new):
                rows.append(walk(v, order))
                r = rows[-1]
                print(f"{r['version']}: {r['seconds']} s wall, {r['cpu_seconds']} s CPU, "
                      f"{r['plans_per_minute']} plans/min, chosen {r['chosen']:.4f} "
                      f"({len(r['chosen_plan'])} groups), load {r['load_average']}",
                      flush=True)
    summary: dict[str, Any] = {}
    for v in (old, new):
        mine = [r for r in rows if r["version"] == v.label]
        summary[v.label] = {"median_seconds": statistics.median(r["seconds"] for r in mine),
                            "median_cpu_seconds": statistics.median(r["cpu_seconds"]
                                                                    for r in mine)}
    a, b = (summary[v.label] for v in (old, new))
    base, now = rows[0], rows[1]
    out = {"model": args.model, "pairs": args.pairs, "seq_len": args.seq_len,
           "plans": args.plans + 1, "baseline": sha, "rows": rows, "summary": summary,
           "speedup_wall": round(a["median_seconds"] / b["median_seconds"], 2),
           "speedup_cpu": round(a["median_cpu_seconds"] / b["median_cpu_seconds"], 2),
           "same_decisions": base["taken"] == now["taken"],
           "max_value_difference": float(np.max(np.abs(np.subtract(base["values"],
                                                                    now["values"])))),
           "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
           "cores": os.cpu_count()}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
