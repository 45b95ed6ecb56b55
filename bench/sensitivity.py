"""Benchmark: the two-way sensitivity sweep, fast (segments + row subsets) vs naive.

Prints, on a built-in text model and ``--texts`` stdlib-docs texts (half queries, half
their documents):

* T: one full FP32 forward pass over all texts (ORT default optimisations, best of 3)
* the fast sweep time (both sweeps, every group) and its ratio to (groups x T)
* the naive sweep time (one full QDQ model per candidate, every text) and its ratio
* Spearman rank correlation of the fast ranking vs the naive one (output SQNR of the
  pooled embeddings per candidate), per sweep and pooled
* how stable the reference ranking itself is: Spearman between the rankings of the
  even and the odd rows of the reference sweep (two disjoint halves of the texts)

    .venv/bin/python bench/sensitivity.py --model minilm-l6 --texts 256 --proxy 0.125
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import date

import numpy as np
import onnxruntime as ort
from scipy.stats import spearmanr

from quantscope.analyze import sweep_fast, sweep_naive, sweep_segments
from quantscope.analyze.rows import run_plan_rows
from quantscope.analyze.scoring import fidelity, text_retrieval_scorer
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import build_qdq
from quantscope.model.groups import find_groups
from quantscope.stages import open_model
from quantscope.tasks.text import (
    detect_encoder,
    load_calibration_texts,
    load_pairs,
    load_tokenizer,
    make_batches,
    model_tokenizer,
)
from quantscope.types import Precision, QuantScheme


def fp32_seconds(model, batches, repeats=3):
    sess = ort.InferenceSession(model.proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for b in batches:
            sess.run(None, {k: v for k, v in b.items() if k in names})
        best = min(best, time.perf_counter() - t)
    return best


def sqnr_keys(res, sweep, rows=slice(None)):
    return np.array(
        [
            fidelity(res.ref_of(i)[rows], r[rows])["sqnr_db"]
            for i, (c, r) in enumerate(zip(res.candidates, res.rows, strict=True))
            if c.sweep == sweep
        ]
    )


def naive_check(model, groups, stats, batches, ref, args, kw):
    """Full QDQ models for a sample of candidates vs the exact segment reference."""
    picks = np.linspace(0, len(ref.candidates) - 1, args.naive_sample).round().astype(int)
    worst_db, worst_rel = 0.0, 0.0
    for i in picks:
        c = ref.candidates[i]
        enc = encode(model, groups, stats, c.plan, scheme=QuantScheme())
        qdq = build_qdq(model, enc)
        rows = run_plan_rows(model, groups, batches, qdq, kw["scorer"])
        a = fidelity(ref.ref_of(i), rows)["sqnr_db"]
        b = fidelity(ref.ref_of(i), ref.rows[i])["sqnr_db"]
        worst_db = max(worst_db, abs(a - b))
        scale = np.abs(rows).max()
        worst_rel = max(worst_rel, float(np.abs(rows - ref.rows[i]).max() / scale))
    return {"candidates": int(len(picks)), "max_sqnr_diff_db": worst_db,
            "max_rel_row_diff": worst_rel}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--proxy", type=float, default=0.125)
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--no-naive", action="store_true")
    ap.add_argument(
        "--reference",
        choices=("naive", "segments-exact"),
        default="naive",
        help="ranking to compare against: naive full-model sweep (default), or the exact "
        "segment sweep on every row (equal to naive to 1e-6, see tests; much faster)",
    )
    ap.add_argument(
        "--naive-sample",
        type=int,
        default=0,
        help="with --reference segments-exact: also run K candidates (evenly spaced) as "
        "full naive QDQ models on every row and report how far the reference is from them",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = open_model(args.model)
    groups = find_groups(model)
    enc, pairs = detect_encoder(model.proto), load_pairs("stdlib-docs")
    tok = load_tokenizer(model_tokenizer(model.source, model.proto))
    half = args.texts // 2
    tb = make_batches([*pairs.queries[:half], *pairs.documents[:half]], tok, enc)
    cal = make_batches(load_calibration_texts("stdlib-docs")[: args.calib], tok, enc)
    stats = calibrate(model, groups, cal)
    scorer = text_retrieval_scorer(half, tb.order, enc.input_name("attention_mask"))
    kw = {"scorer": scorer, "low": Precision.A8_W8, "high": Precision.A16_W16}
    t_fp = fp32_seconds(model, list(tb))
    n = len(groups.groups)
    if args.proxy >= 1:
        fast = sweep_segments(model, groups, stats, list(tb), **kw, progress=True)
    else:
        fast = sweep_fast(model, groups, stats, list(tb), **kw, fraction=args.proxy, progress=True)
    t_fp_after = fp32_seconds(model, list(tb))
    out = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "date": str(date.today()),
        "model": args.model,
        "texts": 2 * half,
        "groups": n,
        "rows_per_sweep": dict(fast.row_counts),
        "fp32_forward_s": t_fp,
        "fp32_forward_s_after": t_fp_after,
        "fast_sweep_s": fast.seconds,
        "fast_ratio": fast.seconds / (n * t_fp),
        "fast_ratio_after": fast.seconds / (n * t_fp_after),
    }
    print(json.dumps(out), flush=True)
    if not args.no_naive:
        if args.reference == "naive":
            naive = sweep_naive(model, groups, stats, list(tb), **kw, progress=True)
        else:
            naive = sweep_segments(model, groups, stats, list(tb), **kw, optimize_float=False)
        out["reference"] = args.reference
        out["naive_sweep_s"] = naive.seconds
        out["naive_ratio"] = naive.seconds / (n * t_fp)
        for sweep in ("enable_one", "disable_one"):
            out[f"spearman_{sweep}"] = float(
                spearmanr(sqnr_keys(fast, sweep), sqnr_keys(naive, sweep))[0]
            )
        both = [
            np.concatenate([sqnr_keys(r, s) for s in ("enable_one", "disable_one")])
            for r in (fast, naive)
        ]
        out["spearman_pooled"] = float(spearmanr(*both)[0])
        for sweep in ("enable_one", "disable_one"):
            halves = [sqnr_keys(naive, sweep, slice(k, None, 2)) for k in (0, 1)]
            out[f"reference_split_half_{sweep}"] = float(spearmanr(*halves)[0])
            ref_keys, fast_keys = sqnr_keys(naive, sweep), sqnr_keys(fast, sweep)
            top = set(np.argsort(-ref_keys)[:10])
            out[f"top10_overlap_{sweep}"] = len(top & set(np.argsort(-fast_keys)[:10]))
    if args.naive_sample and not args.no_naive and args.reference == "segments-exact":
        out["naive_check"] = naive_check(model, groups, stats, list(tb), naive, args, kw)
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
