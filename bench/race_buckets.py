"""Benchmark: ``buckets --race`` (a set of candidates where a race can stop some) measured
three ways in one process: every candidate measured in full (no race), raced with a full
QDQ session per candidate (the racer before the engine), raced on the incremental engine
(``stages/race.RaceRuns``, what ``buckets --race`` runs now).

The candidate sets (``--set``), every candidate on the one model and statistics:

* ``family``: the product's rule-made candidates on ``--target`` at ``--at`` tokens
  (``plan --max-legal --variants``: every legal group at 16 bit, then whole Linear families
  back at a8_w8), and uniform a8_w8: nested costs, few can stop;
* ``single``: uniform a8_w8 with one group at a16_w16, for ``--k`` groups drawn at random
  (seed 0): which one group to buy, costs close, a worse and no cheaper one can stop.

Prints, per way, the wall and process CPU seconds of ``choose_deployment``, what the race
stopped and at how many pairs, the race's engine counts, and whether the choice (buckets,
candidates, mean cosine) equals the full measurement's.

    PYTHONPATH=src nice -n 10 python bench/race_buckets.py --model minilm-l3 --pairs 512
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from quantscope import stages
from quantscope.model.groups import find_groups
from quantscope.model.shapes import given_shapes
from quantscope.plan.candidates import max_legal, variants
from quantscope.plan.deployment import Candidate
from quantscope.stages import buckets as buckets_stage
from quantscope.stages import race as race_stage
from quantscope.targets import load_target
from quantscope.types import Plan, Precision


def candidate_set(name: str, model, stats, target: str, at: int, k: int
                  ) -> tuple[Candidate, ...]:
    uniform = Plan(default=Precision.A8_W8, target=target)
    if name == "family":
        t = load_target(target)
        made = max_legal(model, t, given_shapes(model, at, ()))
        more, _ = variants(model, t, given_shapes(model, at, ()), made)
        plans = {"all16": made.plan, **{c.name: c.plan for c in more}, "a8w8": uniform}
    else:
        names = find_groups(model).names()
        pick = np.random.default_rng(0).permutation(len(names))[:k]
        plans = {"a8w8": uniform, **{f"g{i}": Plan(default=Precision.A8_W8, target=target,
                                                     overrides=((names[i], Precision.A16_W16),))
                                     for i in sorted(pick)}}
    return tuple(Candidate(n, model, stats, p) for n, p in plans.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="minilm-l3")
    ap.add_argument("--pairs", type=int, default=512)
    ap.add_argument("--set", default="single", choices=("single", "family"))
    ap.add_argument("--k", type=int, default=8, help="candidates of the single set (+ a8w8)")
    ap.add_argument("--target", default="hailo10h")
    ap.add_argument("--at", type=int, default=128)
    ap.add_argument("--seq-lens", default="64,128")
    ap.add_argument("--max-cost", type=float, default=10.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    model = stages.open_model(args.model)
    data = stages.open_data("stdlib-docs", model, max_pairs=args.pairs)
    stats = stages.calibrate_model(model, data)
    cands = candidate_set(args.set, model, stats, args.target, args.at, args.k)
    lens = tuple(int(x) for x in args.seq_lens.split(","))
    kw = {"max_cost": args.max_cost, "seq_lens": lens, "max_buckets": 2}
    real = race_stage.race_errors
    ran: list = []

    def full_graph(*a, shared=(), ran=None, **k):  # the racer before the engine
        return real(*a, **k)

    def on_engine(*a, **k):
        return real(*a, ran=ran, **k)

    rows, base = [], None
    print(f"{args.model}: {len(cands)} candidates ({args.set}), {args.pairs} pairs, "
          f"lengths {lens}, {os.cpu_count()} cores")
    for way, race, fn in (("full measurement", None, real), ("race, full graph", 0.95, full_graph),
                          ("race, engine", 0.95, on_engine)):
        buckets_stage.race_errors = fn
        ran.clear()
        t, cpu = time.perf_counter(), time.process_time()
        choice = buckets_stage.choose_deployment(model, data, cands, args.target, race=race, **kw)
        secs, cpu = time.perf_counter() - t, time.process_time() - cpu
        doc = choice.to_dict()
        base = base or doc
        row = {"way": way, "seconds": round(secs, 2), "cpu_seconds": round(cpu, 2),
               "same_buckets": doc["buckets"] == base["buckets"],
               "cosine_mean": choice.cosine_mean, "load": round(os.getloadavg()[0], 1)}
        if choice.race is not None:
            row["stopped"] = {c["name"]: c["n"] for c in choice.race["candidates"] if c["stopped"]}
            row["looks"] = choice.race["looks"]
        if ran:
            row["engine"] = ran[0].counts.to_dict()
        rows.append(row)
        print(json.dumps(row))
    buckets_stage.race_errors = real
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "pairs": args.pairs, "set": args.set,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
