"""Wall time of emulated a8_w8 and a16_w16 models as ratios to the FP32 model.

Same process, same inputs, several repeats, median. The FP32 baseline runs with ORT's
graph optimizations both off (like emulation) and on (like deployment on CPU), so the
ratio shows what the Q/DQ nodes cost and what disabling fusion costs.

    python bench/emulation.py [MODEL] [--batches N] [--repeats R]

MODEL defaults to the built-in minilm-l3 (needs the `models` extra); any ONNX path works
with random inputs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from quantscope.calibrate.collect import calibrate  # noqa: E402
from quantscope.emulate.encode import encode  # noqa: E402
from quantscope.emulate.qdq import build_qdq  # noqa: E402
from quantscope.emulate.session import make_session  # noqa: E402
from quantscope.model.groups import find_groups  # noqa: E402
from quantscope.stages import open_model  # noqa: E402
from quantscope.types import Plan, Precision, QuantScheme  # noqa: E402


def _feeds(model, n, seed=0):
    rng = np.random.default_rng(seed)
    types = model.value_types()
    shapes = model.value_shapes()
    out = []
    for _ in range(n):
        feed = {}
        for name in model.input_names():
            dims = [d if isinstance(d, int) else (8 if i == 0 else 64)
                    for i, d in enumerate(shapes.get(name, ()))]
            if types.get(name) == 7:  # int64 token ids / masks / token types
                feed[name] = (rng.integers(1000, 20000, dims) if name == "input_ids"
                              else np.ones(dims, np.int64) if "mask" in name
                              else np.zeros(dims, np.int64)).astype(np.int64)
            else:
                feed[name] = rng.normal(0, 1, dims).astype(np.float32)
        out.append(feed)
    return out


def _time(session, feeds, repeats):
    session.run(None, feeds[0])  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for f in feeds:
            session.run(None, f)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="minilm-l3")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model = open_model(args.model)
    groups = find_groups(model)
    feeds = _feeds(model, args.batches)
    stats = calibrate(model, groups, iter(feeds))
    base_off = _time(make_session(model.proto), feeds, args.repeats)
    base_on = _time(make_session(model.proto, optimize=True), feeds, args.repeats)
    print(f"machine: {platform.machine()} {platform.processor() or ''}, model {args.model}, "
          f"{args.batches} batches x {args.repeats} repeats (median)")
    print(f"fp32 (optimizations off)  {base_off * 1e3:8.1f} ms  1.00x")
    print(f"fp32 (ORT basic opts)     {base_on * 1e3:8.1f} ms  {base_on / base_off:.2f}x")
    for p in (Precision.A8_W8, Precision.A16_W16):
        plan = Plan.uniform(p)
        qdq = build_qdq(model, encode(model, groups, stats, plan, scheme=QuantScheme()))
        t = _time(make_session(qdq), feeds, args.repeats)
        print(f"{p.value:<25} {t * 1e3:8.1f} ms  {t / base_off:.2f}x")


if __name__ == "__main__":
    main()
