"""What each repair costs (seconds) and what it buys on a real encoder, uniform a8_w8, every op.

    python bench/repairs.py [MODEL] [--pairs N] [--calib N] [--iterations K] [--skip NAME ...]

MODEL: minilm-l3 (default) or minilm-l6. Data: the first N pairs of ``stdlib-docs``
(query = docstring summary, document = body) and N calibration texts disjoint from them.
Prints, per variant, the repair's time, mean cosine of the mean-pooled L2-normalised
embeddings to FP32, top-1 retrieval agreement with FP32 and recall@1 (FP32 on the first
line). Every variant is calibrated afresh on its own (repaired) model.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.encode import encode
from quantscope.emulate.qdq import build_qdq
from quantscope.emulate.session import make_session, runner
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.repair.adaround import adaround
from quantscope.repair.bias_correction import correct_biases
from quantscope.repair.equalize import equalize_pairs
from quantscope.repair.ranges import choose_range_methods, encode_with_methods
from quantscope.repair.smooth import smooth_outliers
from quantscope.repair.split import split_channels
from quantscope.stages import open_model
from quantscope.tasks.metrics import recall_at_k, row_cosines, top1_agreement
from quantscope.tasks.text import (
    detect_encoder,
    embed,
    load_calibration_texts,
    load_pairs,
    load_tokenizer,
    make_batches,
    model_tokenizer,
)
from quantscope.types import Plan, Precision, QuantScheme

PLAN = Plan.uniform(Precision.A8_W8)


def _embed(proto, texts_batches, encoder):
    run = runner(make_session(proto))
    return [embed(run, b, encoder) for b in texts_batches]


def _metrics(ref, test):
    (rq, rd), (tq, td) = ref, test
    cos = row_cosines(np.concatenate([rq, rd]), np.concatenate([tq, td]))
    return {
        "cos": float(cos.mean()),
        "top1": top1_agreement(rq, rd, tq, td),
        "r@1": recall_at_k(tq, td, ks=(1,))[1],
    }


def _qdq(model: Model, calib, methods=None):
    groups = find_groups(model)
    stats = calibrate(model, groups, calib)
    enc = (
        encode(model, groups, stats, PLAN, scheme=QuantScheme())
        if methods is None
        else encode_with_methods(model, groups, stats, PLAN, methods)
    )
    return build_qdq(model, enc), stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="minilm-l3")
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--calib", type=int, default=128)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--skip", nargs="*", default=[])
    args = ap.parse_args()
    model = open_model(args.model)
    enc = detect_encoder(model.proto)
    tok = load_tokenizer(model_tokenizer(model.source, model.proto), max_length=128)
    pairs = load_pairs("stdlib-docs")
    n = min(args.pairs, len(pairs))
    evals = [make_batches(pairs.queries[:n], tok, enc), make_batches(pairs.documents[:n], tok, enc)]
    calib = list(make_batches(load_calibration_texts("stdlib-docs")[: args.calib], tok, enc))
    proxy = calib[:2]
    ref = _embed(model.proto, evals, enc)
    print(
        f"{args.model}: {n} pairs, {len(calib)} calibration batches; FP32 r@1 "
        f"{recall_at_k(*ref, ks=(1,))[1]:.3f}"
    )
    base_qdq, stats = _qdq(model, calib)
    rows: list[tuple[str, float, dict]] = [
        ("a8_w8 (no repair)", 0.0, _metrics(ref, _embed(base_qdq, evals, enc)))
    ]

    def variant(name: str, make: Callable[[], tuple[Model, dict | None, float]]) -> None:
        if name.split()[0] in args.skip:
            return
        t0 = time.perf_counter()
        m, methods, _ = make()
        cost = time.perf_counter() - t0
        qdq, _ = _qdq(m, calib, methods)
        rows.append((name, cost, _metrics(ref, _embed(qdq, evals, enc))))
        print(f"  {name:<34} {cost:7.1f} s  {rows[-1][2]}", file=sys.stderr)

    def smooth(alpha: float) -> tuple[Model, None, float]:
        rep = smooth_outliers(model, stats, proxy, alpha=alpha, rescale_others=True)
        return rep.model(), None, rep.seconds

    variant("equalize (CLE)", lambda: (equalize_pairs(model, proxy).model(), None, 0.0))
    variant("split (outlier channels)", lambda: (split_channels(model, proxy, stats=stats).model(),
                                                 None, 0.0))
    variant("smooth (alpha 0.5, +Mul)", lambda: smooth(0.5))
    variant("smooth (alpha 0.8, +Mul)", lambda: smooth(0.8))
    variant(
        "ranges (output proxy)",
        lambda: (model, choose_range_methods(model, stats, PLAN, proxy).mapping(), 0.0),
    )
    variant(
        "ranges (local proxy)",
        lambda: (model, choose_range_methods(model, stats, PLAN, proxy="local").mapping(), 0.0),
    )
    variant(
        "bias (weight mode)",
        lambda: (correct_biases(model, calib[:8], PLAN, stats=stats).model(), None, 0.0),
    )
    variant(
        "adaround",
        lambda: (
            adaround(model, calib[:8], PLAN, stats=stats, iterations=args.iterations).model(),
            None,
            0.0,
        ),
    )
    print(f"{'variant':<36} {'seconds':>8} {'cos':>7} {'top1':>7} {'r@1':>7}")
    for name, cost, m in rows:
        print(f"{name:<36} {cost:8.1f} {m['cos']:7.4f} {m['top1']:7.3f} {m['r@1']:7.3f}")


if __name__ == "__main__":
    main()
