"""The fast sensitivity sweep serial, in chunks, and on a local Ray cluster.

Prints, on a built-in text model and ``--pairs`` stdlib-docs pairs (both sweeps, every
group, ``sweep_fast``):

* serial: the sweep in this process (what runs without ``--ray``);
* chunked in process: the same candidates split into ``--chunks`` tasks run one after
  the other: the extra time over serial is what every task repeats (its own segment
  chains, encodings and FP32/all-low runs on its rows): the *per-task setup*;
* Ray: the sweep on a local cluster of ``--cpus`` CPUs (one chunk per CPU), and the
  round trip of an empty Ray task that receives the same shared job (model, statistics,
  rows) through the object store: the *per-task transport* overhead;
* that every result equals the serial one, bit for bit.

    python bench/scale.py [--model minilm-l3] [--pairs 64] [--cpus 2] [--chunks 4]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from quantscope import stages
from quantscope.analyze import sweep_fast
from quantscope.model.groups import find_groups
from quantscope.parallel import InProcess, ray_executor
from quantscope.types import Precision


def _noop(shared, item):
    return item


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a.rows, b.rows, strict=True)) and \
        np.array_equal(a.ref_rows, b.ref_rows) and a.noise_isolated == b.noise_isolated


def _load():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm-l3")
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--proxy", type=float, default=0.125)
    args = ap.parse_args()
    model = stages.open_model(args.model)
    data = stages.open_data("stdlib-docs", model, max_pairs=args.pairs)
    stats = stages.calibrate_model(model, data)
    groups, batches = find_groups(model), list(data.evaluation)
    kw = {"scorer": stages.scorer_for(data), "low": Precision.A8_W8,
          "high": Precision.A16_W16, "fraction": args.proxy}
    rows = sum(len(next(iter(b.values()))) for b in batches)
    print(f"{args.model}: {len(groups.groups)} groups, {2 * len(groups.groups)} candidates, "
          f"{rows} rows, proxy {args.proxy}; load average before: {_load()}")

    def timed(executor=None):
        t = time.perf_counter()
        res = sweep_fast(model, groups, stats, batches, executor=executor, **kw)
        return res, time.perf_counter() - t

    serial, t_serial = timed()
    chunked, t_chunked = timed(InProcess(args.chunks))
    ex = ray_executor(num_cpus=args.cpus)
    try:
        ex.map(_noop, None, [0] * args.cpus)  # workers up
        on_ray, t_ray = timed(ex)
        job = (model, stats, batches)
        t = time.perf_counter()
        n = 4 * args.cpus
        ex.map(_noop, job, list(range(n)))
        t_task = (time.perf_counter() - t) / n
    finally:
        ex.close()
    setup = (t_chunked - t_serial) / (2 * (args.chunks - 1))  # two sweeps, chunks-1 extra each
    print(f"serial                      {t_serial:7.1f} s")
    print(f"in process, {args.chunks} chunks/sweep   {t_chunked:7.1f} s  -> per-task setup "
          f"{setup:.2f} s")
    print(f"Ray, {ex.workers} CPUs, {ex.workers} chunks/sweep {t_ray:7.1f} s  "
          f"({t_serial / t_ray:.2f}x serial)")
    print(f"Ray empty task with the shared job: {t_task * 1e3:.0f} ms per task")
    print(f"identical to serial: chunked {_same(serial, chunked)}, Ray {_same(serial, on_ray)}"
          f"; load average after: {_load()}")


if __name__ == "__main__":
    main()
