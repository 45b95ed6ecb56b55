"""How many calibration texts a text encoder needs (``--calib-texts N``): the time and peak
memory of calibrating on the first N of stdlib-docs' 512 calibration texts, and what the
demo's configurations measure with those stats on the same held pairs.

    python bench/calib_size.py [--model minilm-l6] [--pairs 200] [--sizes 32,64,128,256,512]
                               [--json OUT]

One process, one model and one evaluation set; each size calibrates from scratch (the
in-process calibration cache is cleared), then the demo's quantized configurations
(:func:`quantscope.demo.demo_plans`, FP32 aside) are measured in ONNX Runtime on the first
``--pairs`` pairs. The FP32 reference is computed once. Calibration seconds are wall and
CPU (user+sys) of the calibration alone. A calibration's cost follows its padded tokens,
not its texts: 32 texts make one batch padded to the longest of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from quantscope import stages  # noqa: E402
from quantscope.demo import demo_plans  # noqa: E402
from quantscope.emulate.evaluate import run_model  # noqa: E402

METRICS = ("top1_agreement", "recall@1", "embedding_cosine_mean")


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _clear_calibration_cache() -> None:
    from quantscope.stages import open as opened

    opened._KEPT.clear()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--sizes", default="32,64,128,256,512")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    model = stages.open_model(args.model)
    data = stages.open_data("stdlib-docs", model, max_pairs=args.pairs, show=False)
    plans = {k: p for k, p in demo_plans(model).items() if k != "fp32"}
    ref = run_model(model.proto, list(data.evaluation))
    rows = []
    for n in sizes:
        _clear_calibration_cache()
        cal = stages.open_data("stdlib-docs", model, max_pairs=args.pairs, show=False,
                               calib_texts=n)
        t0, c0 = time.perf_counter(), _cpu()
        stats = stages.calibrate_model(model, cal, progress=False)
        wall, cpu = time.perf_counter() - t0, _cpu() - c0
        res = stages.evaluate_plans(model, data, stats, plans, reference_outputs=ref,
                                    own_outputs=True)
        row = {"calib_texts": stats.num_samples, "calibrate_wall_s": round(wall, 2),
               "calibrate_cpu_s": round(cpu, 2),
               "padded_tokens": int(sum(b["attention_mask"].size for b in cal.calibration)),
               "figures": {k: {m: r["metrics"].get(m) for m in METRICS}
                           for k, r in res.items()}}
        rows.append(row)
        figs = "; ".join(f"{k} top-1 {v['top1_agreement']:.3f}"
                         for k, v in row["figures"].items())
        print(f"{n:4d} texts ({row['padded_tokens']} padded tokens): calibrate {wall:6.1f} s "
              f"wall, {cpu:6.1f} s CPU; {figs}", flush=True)
    out = {"model": args.model, "pairs": args.pairs, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
