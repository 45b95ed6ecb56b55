"""Quantization-aware distillation of a face embedder, measured in ONNX Runtime on ``faces``.

    PYTHONPATH=src python bench/finetune_faces.py [--model dlib-face|mobilefacenet]
        [--target hailo10h] [--plan plan.json] [--steps 300] [--views 16] [--batch 16]
        [--max-minutes 15] [--json out.json]

Nothing the figures are scored on is fitted on: calibration, training and early stopping
use augmented views (crop, flip, colour jitter, JPEG, down-scale; ``tasks.images.augment``)
of the 18 scikit-image sample photos only, resized to the model's chip size: no face chip
(the built-in ``faces`` set) is seen before scoring. The teacher is the FP32 model; the
student is the plan's QDQ graph (default: uniform a8_w8 for the target); the loss is every
output's MSE normalised by its variance (``OutputsLoss``). Every figure printed is measured
in ONNX Runtime on the QDQ graph the writer builds for (fine-tuned model, plan + pinned
ranges), against the original FP32 model; the fine-tuned FP32 model is measured too.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import numpy as np
import torch
from finetune_report import finetune_record, finish
from PIL import Image

from quantscope.finetune.apply import finetune as run_finetune
from quantscope.finetune.apply import finetuned_model, finetuned_plan, split_holdout
from quantscope.finetune.distill import FinetuneConfig
from quantscope.finetune.objectives import OutputsLoss
from quantscope.stages import calibrate_model, evaluate_plans, open_data, open_model
from quantscope.targets import load_target
from quantscope.tasks.faces import style_for_input
from quantscope.tasks.images import SKIMAGE_PHOTOS, augment, source_photos
from quantscope.types import Plan, Precision

SEED = 11


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="dlib-face")
    p.add_argument("--target", default="hailo10h")
    p.add_argument("--plan")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--views", type=int, default=16, help="augmented views per photo")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--range-lr", type=float, default=2e-2)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-minutes", type=float, default=15.0)
    p.add_argument("--json")
    return p.parse_args()


def photo_batches(model: Any, views: int, batch: int) -> list[dict[str, np.ndarray]]:
    """Augmented views of the scikit-image photos (no face chip), in the model's chip form."""
    name = model.input_names()[0]
    style = style_for_input(tuple(model.value_shapes()[name]))
    photos, _ = source_photos()
    photos = photos[: len(SKIMAGE_PHOTOS)]
    rng = np.random.default_rng(SEED)
    chips = np.stack([np.asarray(Image.fromarray(augment(p, rng)).resize(
        (style.chip_size, style.chip_size), Image.BICUBIC)) for p in photos for _ in range(views)])
    chips = chips[rng.permutation(len(chips))]
    x = style.preprocess(chips)
    return [{name: x[i:i + batch]} for i in range(0, len(x), batch)]


def _pick(metrics: dict[str, Any]) -> dict[str, float]:
    keys = [k for k in metrics if any(s in k for s in ("tar", "far", "agreement", "cosine",
                                                        "sqnr", "collapse"))]
    return {k: round(float(metrics[k]), 5) for k in keys
            if isinstance(metrics[k], (int, float, np.floating))}


def main() -> int:
    args = _args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = open_model(args.model)
    faces = open_data("faces", model)
    feeds = photo_batches(model, args.views, args.batch)
    photos = dataclasses.replace(faces, calibration=tuple(feeds))
    stats = calibrate_model(model, photos)
    plan = Plan(default=Precision.A8_W8, target=args.target)
    if args.plan:
        from quantscope.serde import read_plan

        plan = read_plan(args.plan)
    scheme = load_target(plan.target or args.target).scheme
    before = evaluate_plans(model, faces, stats, {"before": plan}, scheme=scheme)["before"]
    print(f"before: {_pick(before['metrics'])}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    train, hold = split_holdout(feeds)
    cfg = FinetuneConfig(steps=args.steps, lr=args.lr, range_lr=args.range_lr,
                         eval_every=args.eval_every, threads=args.threads,
                         max_seconds=args.max_minutes * 60)
    res = run_finetune(model, stats, plan, OutputsLoss(), train, hold, cfg, scheme=scheme,
                       progress=True)
    print(res.summary(), flush=True)
    ft_model, ft_plan = finetuned_model(model, res), finetuned_plan(plan, res)
    after = evaluate_plans(ft_model, faces, stats, {"after": ft_plan, "fp32": Plan.uniform(
        Precision.FLOAT)}, scheme=scheme, reference=model)
    out = {
        "settings": vars(args), "training_rows": sum(len(next(iter(b.values()))) for b in train),
        "holdout_rows": sum(len(next(iter(b.values()))) for b in hold),
        "before": _pick(before["metrics"]), "after": _pick(after["after"]["metrics"]),
        "finetuned_fp32_vs_original": _pick(after["fp32"]["metrics"]),
        "finetune": finetune_record(res),
    }
    return finish(out, t0, args.json)


if __name__ == "__main__":
    sys.exit(main())
