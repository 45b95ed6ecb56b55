"""Plans ranked per minute: the torch ranker (``--rank-engine torch``) against ORT, and
whether they rank the same way.

One model, one data set, one list of candidate plans (uniform a8_w8, uniform a16_w16 and
seeded random mixes of a8_w4 / a8_w8 / a16_w16 per group, the kind of plans a search
compares). Both engines score every plan against the same FP32 outputs (one ORT run, not
timed) with the same metric code (``evaluate_plan`` for ORT; ``finetune.rank.score_runs``
over the torch outputs). Reported: seconds and plans per minute of each engine (torch
with and without building its graph, which happens once per search), their ratio, the
rank agreement (Spearman's rho over the plans, the fraction of plan pairs ordered alike,
the same best plan) and the largest difference of a plan's figure.

    python bench/rank.py [MODEL] [--pairs N] [--seq-len N] [--plans N] [--device cpu|cuda]

``rank_benchmark(...)`` is the function ``bench/search.py`` can call with its own model,
data and plans; ``candidate_plans(...)`` makes the plans above.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Any

import numpy as np

from quantscope import stages
from quantscope.analyze.measure import evaluate_plan
from quantscope.emulate.evaluate import run_model
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.tasks.registry import at_length
from quantscope.types import Dataset, Plan, Precision, QuantScheme, Stats

MIX = (Precision.A8_W4, Precision.A8_W8, Precision.A16_W16)


def candidate_plans(model: Model, n: int, seed: int = 0) -> dict[str, Plan]:
    """Uniform a8_w8 and a16_w16, then ``n - 2`` seeded mixes (each group a8_w4, a8_w8 or
    a16_w16 with equal odds)."""
    names = find_groups(model).names()
    rng = np.random.default_rng(seed)
    plans = {"a8_w8": Plan.uniform(Precision.A8_W8), "a16_w16": Plan.uniform(Precision.A16_W16)}
    for i in range(max(n - 2, 0)):
        picks = rng.integers(0, len(MIX), len(names))
        plans[f"mix{i}"] = Plan(default=Precision.A8_W8, overrides=tuple(
            (g, MIX[k]) for g, k in zip(names, picks, strict=True) if MIX[k] != Precision.A8_W8))
    return plans


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if len(a) < 2 or ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _pairs_alike(a: list[float], b: list[float]) -> float:
    n, same = 0, 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            n += 1
            same += np.sign(a[i] - a[j]) == np.sign(b[i] - b[j])
    return same / n if n else float("nan")


def rank_benchmark(model: Model, data: Dataset, stats: Stats, plans: dict[str, Plan], *,
                   metric: str, device: str = "cpu",
                   scheme: QuantScheme | None = None) -> dict[str, Any]:
    """Both engines over ``plans`` (module docstring); the figures and the timings."""
    import torch

    from quantscope.finetune.rank import TorchMeasure

    ref = run_model(model.proto, list(data.evaluation))  # shared FP32 outputs, not timed
    t0 = time.perf_counter()
    ort = {k: float(evaluate_plan(model, data, stats, p, scheme=scheme, reference_outputs=ref,
                                  saturation=False)["metrics"][metric])
           for k, p in plans.items()}
    t_ort = time.perf_counter() - t0
    t0 = time.perf_counter()
    measure = TorchMeasure(model, data, scheme=scheme, device=device, reference_outputs=ref)
    measure.ranker(model, stats)
    if device == "cuda":
        torch.cuda.synchronize()
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    ranked = {k: float(measure(model, stats, p)[metric]) for k, p in plans.items()}
    t_torch = time.perf_counter() - t0
    keys = [k for k in plans if np.isfinite(ort[k]) and np.isfinite(ranked[k])]
    a, b = [ort[k] for k in keys], [ranked[k] for k in keys]
    n = len(plans)
    return {
        "plans": n, "metric": metric, "device": device,
        "torch_threads": torch.get_num_threads(),
        "ort_seconds": round(t_ort, 2), "torch_build_seconds": round(t_build, 2),
        "torch_seconds": round(t_torch, 2),
        "ort_plans_per_min": round(60 * n / t_ort, 2),
        "torch_plans_per_min": round(60 * n / t_torch, 2),
        "torch_plans_per_min_with_build": round(60 * n / (t_torch + t_build), 2),
        "speedup": round(t_ort / t_torch, 2),
        "spearman": round(_spearman(a, b), 4), "pairs_alike": round(_pairs_alike(a, b), 4),
        "same_best": max(keys, key=ort.get) == max(keys, key=ranked.get) if keys else None,
        "max_abs_diff": round(max(abs(x - y) for x, y in zip(a, b, strict=True)), 6)
        if keys else None,
        "figures": {k: {"ort": round(ort[k], 6), "torch": round(ranked[k], 6)} for k in plans},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="minilm-l3")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--plans", type=int, default=8)
    ap.add_argument("--metric", default="embedding_sqnr_db")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", help="write the result here too")
    args = ap.parse_args()
    model = stages.open_model(args.model)
    data = at_length(stages.open_data("stdlib-docs", model, max_pairs=args.pairs), args.seq_len)
    stats = stages.calibrate_model(model, data)
    out = rank_benchmark(model, data, stats, candidate_plans(model, args.plans),
                         metric=args.metric, device=args.device)
    out.update(model=args.model, pairs=args.pairs, seq_len=args.seq_len,
               machine=f"{platform.machine()}, {os.cpu_count()} CPUs")
    print(f"{args.model} seq {args.seq_len}, {args.pairs} pairs, {out['plans']} plans, "
          f"{args.metric}: ORT {out['ort_plans_per_min']} plans/min; torch ({args.device}) "
          f"{out['torch_plans_per_min']} plans/min ({out['torch_plans_per_min_with_build']} "
          f"with its {out['torch_build_seconds']} s build), x{out['speedup']}; Spearman "
          f"{out['spearman']}, pairs alike {out['pairs_alike']}, same best {out['same_best']}, "
          f"largest difference {out['max_abs_diff']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
