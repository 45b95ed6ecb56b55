"""Quantization-aware distillation on a real encoder, measured in ONNX Runtime.

    PYTHONPATH=src python bench/finetune.py [--model minilm-l6] [--pairs 1000] [--steps 200]
        [--plan plan.json] [--stats stats.npz] [--taps ln --tap-weight 1] [--extra-pairs]
        [--no-ranges] [--train-len 128] [--batch 16] [--lr 2e-5] [--range-lr 1e-3]
        [--vector-lr LR] [--score-loss] [--rank-weight W --rank-tau T] [--average D]
        [--checkpoint ck.pt] [--seq-len N] [--device cpu|cuda] [--save-delta DIR]
        [--min-tokens N] [--json out.json]

Plan: uniform a8_w8 for ``hailo10h`` (its scheme: activations unsigned asymmetric, weights
symmetric per channel), or ``--plan``. Data: ``stdlib-docs``; evaluation on the first
``--pairs`` pairs; training on the 512 calibration texts (disjoint from every pair), plus
with ``--extra-pairs`` the texts of pairs 1000-1499 (disjoint from the first 1,000), a
random ``--holdout`` fraction held out for early stopping. Every figure printed is measured
in ONNX Runtime on the QDQ graph the writer builds for (fine-tuned model, plan + pinned
ranges); the fine-tuned FP32 model is also measured against the original FP32 model.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
import torch
from finetune_report import finetune_record, finish, save_delta

from quantscope.emulate.evaluate import run_model
from quantscope.emulate.session import make_session
from quantscope.finetune.apply import finetuned_model, finetuned_plan, fp32_weights
from quantscope.finetune.distill import FinetuneConfig, distill
from quantscope.finetune.graph import to_torch
from quantscope.finetune.objectives import EmbeddingLoss, layernorm_outputs
from quantscope.stages import (
    at_length,
    calibrate_model,
    evaluate_plans,
    open_data,
    open_model,
    qdq_for_plan,
    read_stats,
)
from quantscope.tasks.text import (
    STDLIB_DOCS,
    detect_encoder,
    load_calibration_texts,
    load_pairs,
    load_tokenizer,
    make_batches,
    model_tokenizer,
)
from quantscope.types import Plan, Precision

KEYS = ("top1_agreement", "recall@1", "recall@1_fp32", "embedding_cosine_mean",
        "embedding_cosine_p01", "embedding_sqnr_db")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="minilm-l6")
    p.add_argument("--target", default="hailo10h")
    p.add_argument("--pairs", type=int, default=1000)
    p.add_argument("--plan")
    p.add_argument("--stats")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--train-len", type=int, default=128)
    p.add_argument("--holdout", type=float, default=0.1)
    p.add_argument("--extra-pairs", action="store_true")
    p.add_argument("--train-texts", type=int, default=0, help="use only the first N (0: all)")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--range-lr", type=float, default=1e-3)
    p.add_argument("--vector-lr", type=float, default=None)
    p.add_argument("--no-ranges", action="store_true")
    p.add_argument("--taps", choices=("none", "ln"), default="none")
    p.add_argument("--tap-weight", type=float, default=1.0)
    p.add_argument("--mse-weight", type=float, default=0.0)
    p.add_argument("--score-loss", action="store_true",
                   help="weight embedding errors as the similarity scores see them")
    p.add_argument("--rank-weight", type=float, default=0.0,
                   help="add this x the KL of the similarity distribution over a bank of "
                        "teacher training embeddings (0: off)")
    p.add_argument("--rank-tau", type=float, default=0.02)
    p.add_argument("--average", type=float, default=0.0,
                   help="evaluate and keep an exponential moving average of the learned "
                        "parameters with this decay (0: off)")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default=None,
                   help="torch device of the fine-tune (default: cuda when present, else cpu)")
    p.add_argument("--max-minutes", type=float, default=None)
    p.add_argument("--checkpoint")
    p.add_argument("--no-before", action="store_true", help="skip measuring the plan as is")
    p.add_argument("--seq-len", type=int, default=None,
                   help="measure on the texts truncated at this length (a plan for it)")
    p.add_argument("--save-delta", metavar="DIR",
                   help="also write the trained weights as differences (finetune_apply.py "
                        "measures them again, e.g. after a run on a GPU machine)")
    p.add_argument("--min-tokens", type=int, default=0,
                   help="train only on texts longer than this many tokens (the longest "
                        "bucket of a 'quantscope route' deployment)")
    p.add_argument("--json")
    return p.parse_args()


def _train_batches(model: Any, args: argparse.Namespace) -> tuple[list, list]:
    texts = list(load_calibration_texts(STDLIB_DOCS))
    if args.extra_pairs:
        pairs = load_pairs(STDLIB_DOCS)
        texts += list(pairs.queries[1000:]) + list(pairs.documents[1000:])
    if args.train_texts:
        texts = texts[: args.train_texts]
    if args.min_tokens:  # a length bucket's model trains on the texts it runs
        from quantscope.tasks.text import token_lengths

        full = load_tokenizer(model_tokenizer(model.source, model.proto))
        texts = [t for t, n in zip(texts, token_lengths(texts, full), strict=True)
                 if n > args.min_tokens]
        print(f"training on the {len(texts)} texts longer than {args.min_tokens} tokens")
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(texts))
    n_hold = max(1, int(round(args.holdout * len(texts))))
    enc = detect_encoder(model.proto)
    tok = load_tokenizer(model_tokenizer(model.source, model.proto), max_length=args.train_len)
    hold = make_batches([texts[i] for i in idx[:n_hold]], tok, enc, batch_size=args.batch)
    train = make_batches([texts[i] for i in idx[n_hold:]], tok, enc, batch_size=args.batch)
    return list(train.batches), list(hold.batches)


def _pick(result: dict[str, Any]) -> dict[str, float]:
    return {k: round(float(result["metrics"][k]), 5) for k in KEYS if k in result["metrics"]}


def _parity(student: Any, qdq: Any, objective: EmbeddingLoss, batches: list) -> dict[str, float]:
    """Pooled embeddings of the trained torch student and of ORT on the rebuilt graph."""
    session = make_session(qdq)
    cos, diff = [], []
    for feeds in batches:
        with torch.no_grad():
            a = objective.target(student(feeds)[0], feeds)[0].cpu().numpy()
        outs = [torch.from_numpy(o) for o in session.run(None, feeds)]
        b = objective.target(outs, feeds)[0].numpy()
        cos.append((a * b).sum(axis=1))
        diff.append(np.abs(a - b).max())
    c = np.concatenate(cos)
    return {"cosine_mean": round(float(c.mean()), 6), "cosine_min": round(float(c.min()), 6),
            "max_abs_diff": round(float(max(diff)), 6)}


def main() -> int:
    args = _args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = open_model(args.model)
    data = open_data(STDLIB_DOCS, model, max_pairs=args.pairs)
    if args.seq_len:
        data = at_length(data, args.seq_len)
    stats = read_stats(args.stats) if args.stats else calibrate_model(model, data)
    plan = Plan(default=Precision.A8_W8, target=args.target)
    if args.plan:
        from quantscope.serde import read_plan

        plan = read_plan(args.plan)
    from quantscope.targets import load_target

    scheme = load_target(plan.target or args.target).scheme
    ref = run_model(model.proto, list(data.evaluation))
    before = {"metrics": {}} if args.no_before else evaluate_plans(
        model, data, stats, {"before": plan}, scheme=scheme, reference_outputs=ref)["before"]
    print(f"before: {_pick(before)}  ({time.perf_counter() - t0:.0f} s)", flush=True)
    train, hold = _train_batches(model, args)
    enc = detect_encoder(model.proto)
    mask = enc.input_name("attention_mask")
    cfg = FinetuneConfig(
        steps=args.steps, lr=args.lr, range_lr=args.range_lr, vector_lr=args.vector_lr, learn_ranges=not args.no_ranges,
        warmup=args.warmup, eval_every=args.eval_every,
        taps=layernorm_outputs(model) if args.taps == "ln" else (),
        tap_weight=args.tap_weight if args.taps != "none" else 0.0, mask_input=mask,
        threads=args.threads, score_loss=args.score_loss, rank_weight=args.rank_weight,
        rank_tau=args.rank_tau, average=args.average, device=args.device,
        max_seconds=args.max_minutes * 60 if args.max_minutes else None)
    objective = EmbeddingLoss(enc.output_index, mask, mse_weight=args.mse_weight)
    student = to_torch(qdq_for_plan(model, stats, plan, scheme=scheme)[0],
                       float_weights=fp32_weights(model), scheme=scheme)
    res = distill(student, to_torch(model.proto), objective, train, hold, cfg,
                  checkpoint=args.checkpoint, progress=True)
    print(res.summary(), flush=True)
    if args.save_delta:
        save_delta(res.weights, res.ranges, fp32_weights(model), args.save_delta)
    ft_model, ft_plan = finetuned_model(model, res), finetuned_plan(plan, res)
    parity = _parity(student, qdq_for_plan(ft_model, stats, ft_plan, scheme=scheme)[0],
                     objective, hold[:2])
    print(f"torch student vs ORT on the rebuilt QDQ graph (2 held-out batches): {parity}")
    after = evaluate_plans(ft_model, data, stats, {"after": ft_plan, "fp32": Plan.uniform(
        Precision.FLOAT)}, scheme=scheme, reference=model, reference_outputs=ref)
    out = {
        "settings": vars(args), "before": _pick(before), "after": _pick(after["after"]),
        "finetuned_fp32_vs_original": _pick(after["fp32"]), "torch_vs_ort": parity,
        "finetune": finetune_record(res),
    }
    return finish(out, t0, args.json)


if __name__ == "__main__":
    sys.exit(main())
