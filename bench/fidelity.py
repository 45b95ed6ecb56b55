"""How far is the emulated grid from ONNX Runtime's own integer kernels?

The emulator runs every QuantizeLinear/DequantizeLinear as written (ORT graph
optimizations off): float arithmetic on values that lie on the target grid. With
optimizations on, ORT fuses the same QDQ graph into integer kernels (QLinearMatMul,
MatMulInteger, QLinearConv, ...) where it has them. Both run in this process on the same
inputs; the script prints the output difference and the task metric under both, plus the
wall-time ratio.

    python bench/fidelity.py [MODEL] [--pairs N]
"""

from __future__ import annotations

import argparse
import time

from quantscope import stages
from quantscope.emulate.evaluate import output_fidelity, run_model
from quantscope.types import Plan, Precision


def _timed(proto, batches, *, kernels):
    t = time.perf_counter()
    out = run_model(proto, batches, integer_kernels=kernels)
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="minilm-l3")
    ap.add_argument("--data", default="stdlib-docs")
    ap.add_argument("--pairs", type=int, default=300)
    args = ap.parse_args()
    model = stages.open_model(args.model)
    data = stages.open_data(args.data, model, max_pairs=args.pairs)
    stats = stages.calibrate_model(model, data)
    batches = list(data.evaluation)
    ref, t_ref = _timed(model.proto, batches, kernels=False)
    print(f"model {args.model}, data {args.data} ({args.pairs} pairs), fp32 {t_ref:.1f} s")
    for p in (Precision.A8_W8, Precision.A16_W16):
        qdq, _ = stages.qdq_for_plan(model, stats, Plan.uniform(p))
        emu, t_emu = _timed(qdq, batches, kernels=False)
        ker, t_ker = _timed(qdq, batches, kernels=True)
        diff = output_fidelity(emu, ker).values
        line = (f"{p.value:<8} emulated vs ORT integer kernels: cosine mean {diff['cosine_mean']:.6f}, "
                f"SQNR {diff['sqnr_db']:.1f} dB; time emulated {t_emu / t_ref:.2f}x, "
                f"ORT integer kernels {t_ker / t_ref:.2f}x of fp32")
        if data.task is not None:
            m_emu = data.task.metrics(ref, emu).values
            m_ker = data.task.metrics(ref, ker).values
            key = "top1_agreement" if "top1_agreement" in m_emu else "embedding_cosine_mean"
            line += f"; {key}: emulated {m_emu[key]:.3f}, ORT integer kernels {m_ker[key]:.3f}"
        print(line)


if __name__ == "__main__":
    main()
