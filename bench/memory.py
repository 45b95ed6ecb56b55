"""Peak RSS of ``evaluate`` against FP32 inference on the same data.

Each figure is the peak resident set (``ru_maxrss``) of its own fresh process, which opens
the model and the data the same way:

* ``fp32``: FP32 inference: every evaluation batch run through the FP32 model once
  (``make_session``, as evaluate runs it), keeping what the task reads of each batch (the
  pooled rows of text data; the outputs otherwise);
* ``evaluate``: :func:`quantscope.stages.evaluate_plan` of a uniform plan (FP32 reference,
  the emulated plan, fidelity, task metrics, the saturation check) with statistics
  calibrated beforehand in a third process, as ``quantscope evaluate --stats`` runs;
* ``analyze`` (``--analyze``): :func:`quantscope.analyze.analyze` as ``run``'s analyze
  stage calls it (both sweeps, ``--proxy`` of the rows), with the same statistics, at
  ``--seq-len`` tokens; ``fp32`` is then measured at that length too;
* ``search`` (``--search``): the plan search's evaluator (incremental, scored as the
  planner reads it: ``bench/search.py``'s ``incremental+cheap``) on its measured greedy
  walk of ``--plans`` promotions, with the activation cache on (``--cache-fp32`` sets
  :data:`quantscope.analyze.activation_cache.CACHE_FP32` in that process); it prints its
  plans per minute and the cache's budget too.

    python bench/memory.py [MODEL ...] [--pairs 1000] [--precision a8_w8]
    python bench/memory.py minilm-l3 --analyze --seq-len 128 --pairs 200
    python bench/memory.py mpnet-base --search --seq-len 256 --pairs 300 --plans 6

MODEL defaults to minilm-l6, minilm-l3 (data: stdlib-docs, ``--pairs`` pairs) and
dlib-face (data: faces); ``MODEL=DATA`` names other data.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT = ("minilm-l6=stdlib-docs", "minilm-l3=stdlib-docs", "dlib-face=faces")


def _child(args: argparse.Namespace) -> None:
    from quantscope import stages
    from quantscope.emulate.session import make_session
    from quantscope.serde import read_stats, write_stats
    from quantscope.types import Plan, Precision

    model = stages.open_model(args.model)
    data = stages.open_data(args.data, model, max_pairs=args.pairs)
    if args.seq_len:
        data = stages.at_length(data, args.seq_len)
    t = time.perf_counter()
    if args.child == "calibrate":
        write_stats(args.stats, stages.calibrate_model(model, data))
    elif args.child == "fp32":
        sess = make_session(model.proto)
        keep = getattr(data.task, "keep", None)
        kept = []
        for feeds in data.evaluation:
            out = tuple(sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()}))
            kept.append(keep(out, feeds) if keep else out)
    elif args.child == "analyze":
        from quantscope.analyze import memory

        memory.WINDOW_MODELS = args.window_models or float("inf")
        _analyze(model, data, read_stats(args.stats), args.proxy)
    elif args.child == "search":
        extra = _search(model, data, read_stats(args.stats), args)
    else:
        stats = read_stats(args.stats)
        stages.evaluate_plan(model, data, stats, Plan.uniform(Precision(args.precision)))
    seconds = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak_rss": rss, "seconds": seconds,
                      **(extra if args.child == "search" else {})}))


def _search(model, data, stats, args: argparse.Namespace) -> dict:
    """The planner's evaluator on ``bench/search.py``'s greedy walk (its FP32 reference
    inside the figure, as the plan stage computes and holds it: the pooled rows)."""
    from search import Setup, cheap, greedy_sequence

    from quantscope.analyze import activation_cache
    from quantscope.analyze.measure import headline, reference_kept_outputs
    from quantscope.model.groups import find_groups

    if args.cache_fp32 is not None:
        activation_cache.CACHE_FP32 = args.cache_fp32
    metric = headline(data, None).metric
    # the reference as the plan stage holds it: FP32's pooled rows, no per-token outputs
    setup = Setup(model, data, stats, metric, None, reference_kept_outputs(model, data))
    evaluate = cheap(setup)
    names = tuple(g.name for g in find_groups(model).groups)
    values, _, seconds, _ = greedy_sequence(evaluate, names, args.plans, 0)
    engine = evaluate.engine
    return {"plans_per_minute": round(len(values) / seconds * 60, 2),
            "cache": " / ".join(engine.notes), "engine": engine.counts.engine}


def _analyze(model, data, stats, proxy: float) -> None:
    """The analyze stage of ``run`` (steps.analyze) on the fit data."""
    from quantscope import stages
    from quantscope.analyze import analyze
    from quantscope.model.groups import find_groups
    from quantscope.targets import load_target

    scorer = stages.scorer_for(data, model, None)
    analyze(model, find_groups(model), stats, list(data.evaluation), scorer=scorer,
            target=load_target("hailo10h"), proxy_fraction=proxy, progress=False)


def _run(args: argparse.Namespace, child: str, model: str, data: str, stats: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", child, "--model", model, "--data", data,
           "--pairs", str(args.pairs), "--stats", str(stats), "--precision", args.precision,
           "--seq-len", str(args.seq_len or 0), "--proxy", str(args.proxy),
           "--window-models", str(args.window_models), "--plans", str(args.plans),
           *(["--cache-fp32", str(args.cache_fp32)] if args.cache_fp32 is not None else [])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=list(DEFAULT))
    ap.add_argument("--pairs", type=int, default=1000)
    ap.add_argument("--precision", default="a8_w8")
    ap.add_argument("--child", choices=["calibrate", "fp32", "evaluate", "analyze", "search"])
    ap.add_argument("--analyze", action="store_true", help="measure analyze, not evaluate")
    ap.add_argument("--search", action="store_true",
                    help="measure the plan search's evaluator, not evaluate")
    ap.add_argument("--plans", type=int, default=6, help="--search: promotions measured")
    ap.add_argument("--cache-fp32", type=float, default=None,
                    help="--search: activation_cache.CACHE_FP32 (default: the code's)")
    ap.add_argument("--seq-len", type=int, default=0)
    ap.add_argument("--proxy", type=float, default=0.125)
    ap.add_argument("--window-models", type=float, default=2.0,
                    help="analyze: candidate session weights held at once, in models "
                    "(0: no bound but the memory available: every candidate at once)")
    ap.add_argument("--model", default="")
    ap.add_argument("--data", default="")
    ap.add_argument("--stats", default="")
    args = ap.parse_args()
    if args.child:
        return _child(args)
    gb = 1024 ** 3
    print(f"{args.precision}, {args.pairs} pairs for text data; peak RSS per fresh process")
    for spec in args.models:
        model, _, data = spec.partition("=")
        data = data or ("faces" if "face" in model else "stdlib-docs")
        with tempfile.TemporaryDirectory() as tmp:
            stats = Path(tmp) / "stats.npz"
            _run(args, "calibrate", model, data, stats)
            load = _load()
            fp32 = _run(args, "fp32", model, data, stats)
            what = "analyze" if args.analyze else "search" if args.search else "evaluate"
            ev = _run(args, what, model, data, stats)
        at = f", {args.seq_len} tokens" if args.seq_len else ""
        if args.analyze:
            at += f", windows of {args.window_models or 'all'} models' weights"
        print(f"\n{model} on {data}{at} (load average before: {load}, after: {_load()})")
        print(f"  fp32 inference  peak RSS {fp32['peak_rss'] / gb:5.2f} GB  "
              f"({fp32['seconds']:.1f} s)")
        print(f"  {what:<15} peak RSS {ev['peak_rss'] / gb:5.2f} GB  ({ev['seconds']:.1f} s)"
              f"  {ev['peak_rss'] / fp32['peak_rss']:.2f}x fp32")
        if args.search:
            print(f"  search: {ev['plans_per_minute']} plans/min; {ev['cache']}; {ev['engine']}")


if __name__ == "__main__":
    main()
