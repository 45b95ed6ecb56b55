"""Which part of a plan's error is what: the fine-tune's torch student (the plan's QDQ
graph, converted) on the held-out texts of ``bench/finetune.py``, with its quantizers as
they are, with activations rounded but not clipped, with exact activations (weights still
quantized), and with exact weights (activations still quantized).

    PYTHONPATH=src python bench/error_parts.py MODEL STATS PLAN [--train-len 128]
        [--checkpoint ck.pt]    # the best state of a bench/finetune.py --checkpoint run

Prints ``1 - cosine`` of the pooled, normalised embeddings against the FP32 model for each.
The torch student is the fine-tune's view of the plan (it agrees with ORT to element
rounding, docs/finetune.md); this is a diagnosis, not a reported plan figure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parent))
from finetune import _train_batches  # noqa: E402

from quantscope.emulate.qdq import scheme_for  # noqa: E402
from quantscope.finetune import fakequant as fq  # noqa: E402
from quantscope.finetune.apply import fp32_weights  # noqa: E402
from quantscope.finetune.graph import to_torch  # noqa: E402
from quantscope.finetune.objectives import EmbeddingLoss  # noqa: E402
from quantscope.serde import read_plan  # noqa: E402
from quantscope.stages import open_model, qdq_for_plan, read_stats  # noqa: E402
from quantscope.tasks.text import detect_encoder  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model")
    p.add_argument("stats")
    p.add_argument("plan")
    p.add_argument("--train-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--checkpoint", help="load the best state of a fine-tune checkpoint")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, stats, plan = open_model(args.model), read_stats(args.stats), read_plan(args.plan)
    scheme = scheme_for(plan, None)
    _, hold = _train_batches(model, SimpleNamespace(extra_pairs=True, train_texts=0,
                                                    holdout=0.1, train_len=args.train_len,
                                                    batch=16))
    enc = detect_encoder(model.proto)
    obj = EmbeddingLoss(enc.output_index, enc.input_name("attention_mask"))
    student = to_torch(qdq_for_plan(model, stats, plan)[0], float_weights=fp32_weights(model),
                       scheme=scheme)
    if args.checkpoint:
        student.load_state_dict(torch.load(args.checkpoint, weights_only=False)["best"][2])
    teacher = to_torch(model.proto)
    with torch.no_grad():
        targets = [obj.target(teacher(f)[0], f)[0] for f in hold]
    act, wq = fq.ActQuant.forward, fq.WeightQuant.forward

    def unclipped(self: fq.ActQuant, x: torch.Tensor) -> torch.Tensor:
        s, z = self.scale_zp()
        if self.axis is not None and s.dim() == 1:
            shape = fq._channel_shape(x.dim(), self.axis % x.dim())
            s, z = s.reshape(shape), z.reshape(shape)
        return (torch.round(x / s + z) - z) * s

    cases = {"as planned": (act, wq), "activations rounded, not clipped": (unclipped, wq),
             "activations exact (weights quantized)": (lambda self, x: x, wq),
             "weights exact (activations quantized)": (act, lambda self, w: w)}
    try:
        for name, (a, w) in cases.items():
            fq.ActQuant.forward, fq.WeightQuant.forward = a, w
            with torch.no_grad():
                cos = torch.cat([(obj.target(student(f)[0], f)[0] * t).sum(1)
                                 for f, t in zip(hold, targets, strict=True)])
            print(f"{name:40s} 1 - cosine {1 - float(cos.mean()):.3e}", flush=True)
    finally:
        fq.ActQuant.forward, fq.WeightQuant.forward = act, wq


if __name__ == "__main__":
    main()
