"""Time and memory of one fine-tune step: fused fake-quant against the composed ops.

    PYTHONPATH=src python bench/finetune_step.py [--model minilm-l6] [--plan P --stats S]
        [--batch 16] [--train-len 128] [--batches 6] [--rounds 3] [--threads 2]
        [--device cpu|cuda]

The student of the plan (default: uniform a8_w8 for hailo10h) runs forward + backward on
the same batches of calibration texts, alternately with ``fakequant.fake_quant`` (one
autograd node per quantizer) and ``fakequant.fake_quant_reference`` (the composed autograd
ops), in one process, each form's timed steps after an untimed one. Reported: the median seconds per step of each, their ratio, and the
bytes autograd keeps for the backward pass of one step (distinct storages, counted with
``saved_tensors_hooks``), which bounds the batch that fits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import quantscope.finetune.fakequant as fq
from quantscope.finetune.apply import fp32_weights
from quantscope.finetune.graph import to_torch
from quantscope.finetune.objectives import EmbeddingLoss
from quantscope.stages import calibrate_model, open_data, open_model, qdq_for_plan, read_stats
from quantscope.targets import load_target
from quantscope.tasks.text import (
    STDLIB_DOCS,
    detect_encoder,
    load_calibration_texts,
    load_tokenizer,
    make_batches,
    model_tokenizer,
)
from quantscope.types import Plan, Precision


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="minilm-l6")
    p.add_argument("--plan")
    p.add_argument("--stats")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--train-len", type=int, default=128)
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = open_model(args.model)
    if args.plan:
        from quantscope.serde import read_plan

        plan = read_plan(args.plan)
    else:
        plan = Plan(default=Precision.A8_W8, target="hailo10h")
    stats = read_stats(args.stats) if args.stats else calibrate_model(
        model, open_data(STDLIB_DOCS, model, max_pairs=10))
    scheme = load_target(plan.target or "hailo10h").scheme
    student = to_torch(qdq_for_plan(model, stats, plan, scheme=scheme)[0],
                       float_weights=fp32_weights(model), scheme=scheme).place(args.device)
    for q in student.parameters():
        q.requires_grad_(True)
    enc = detect_encoder(model.proto)
    tok = load_tokenizer(model_tokenizer(model.source, model.proto), max_length=args.train_len)
    texts = sorted(load_calibration_texts(STDLIB_DOCS), key=len)[-args.batch * args.batches:]
    batches = [{k: torch.from_numpy(v).to(args.device) for k, v in b.items()}
               for b in make_batches(texts, tok, enc, batch_size=args.batch).batches]
    objective = EmbeddingLoss(enc.output_index, enc.input_name("attention_mask"))

    def step(feeds: dict) -> None:
        emb = objective.target(student(feeds)[0], feeds)[0]
        (1.0 - emb.sum(dim=1) / emb.norm(dim=1)).mean().backward()
        student.zero_grad(set_to_none=True)

    def saved_bytes(feeds: dict) -> int:
        seen: dict[tuple[int, str], int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = (t.untyped_storage().data_ptr(), str(t.device))
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            emb = objective.target(student(feeds)[0], feeds)[0]
        del emb
        return sum(seen.values())

    forms = {"composed": fq.fake_quant_reference, "fused": fq.fake_quant}
    fused = fq.fake_quant
    times: dict[str, list[float]] = {k: [] for k in forms}
    memory: dict[str, int] = {}
    step(batches[0])  # warm-up
    for _ in range(args.rounds):
        for name, fn in forms.items():
            fq.fake_quant = fn
            step(batches[0])  # untimed: the allocator settles on this form's tensors first
            for feeds in batches:
                if args.device != "cpu":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                step(feeds)
                if args.device != "cpu":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
            memory[name] = saved_bytes(batches[-1])
    fq.fake_quant = fused
    shape = tuple(next(iter(batches[-1].values())).shape)
    print(f"{args.model}, {len(batches)} batches (last {shape}), {args.rounds} rounds, "
          f"{args.threads} threads, {args.device}")
    for name in forms:
        print(f"  {name:9s} median {statistics.median(times[name]):.3f} s/step, saved for "
              f"backward {memory[name] / 2**20:.0f} MiB (batch {shape})")
    ratio = statistics.median(times["composed"]) / statistics.median(times["fused"])
    print(f"  fused is {ratio:.2f}x faster, keeps {memory['fused'] / memory['composed']:.2f}x "
          "the memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
