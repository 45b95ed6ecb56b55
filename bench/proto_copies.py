"""A model's load and a plan's Q/DQ build, with and without stop 77's copy savings.

    python bench/proto_copies.py [MODEL ...] [--rounds 5]

MODEL defaults to minilm-l3 and minilm-l6. Two variants in one process, alternating,
the baseline first in each round; the figure is each one's fastest round:

- **before**: the weights appended with protobuf's ``extend`` (what the loader, the
  version converter's light path and ``build_qdq`` did), the opset conversion run at
  every load, and ``build_qdq`` copying the whole model before replacing its nodes and
  initializers;
- **now**: ``model.weightless.append_copies`` (``add().CopyFrom`` each), the conversion
  kept by content, ``build_qdq`` copying the weights once.

The statistics for the quantization are the model's own on 8 pairs of stdlib-docs
(calibrated once, untimed). The loaded protos and the Q/DQ graphs of the two variants
are compared byte for byte.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import onnx

from quantscope import stages
from quantscope.emulate import qdq
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model import weightless
from quantscope.model.load import load
from quantscope.types import Plan, Precision
from quantscope.zoo import resolve_model


def _extend(container: Any, messages: Any) -> None:
    container.extend(messages)


@contextlib.contextmanager
def before() -> Iterator[None]:
    saved = (weightless.append_copies, qdq.append_copies, qdq.build_qdq)
    weightless.append_copies = qdq.append_copies = _extend
    real_build = qdq.build_qdq
    qdq.build_qdq = lambda m, e: _build_qdq_before_with(real_build, m, e)
    try:
        yield
    finally:
        weightless.append_copies, qdq.append_copies, qdq.build_qdq = saved


def _build_qdq_before_with(real: Any, model: Any, encodings: Any) -> onnx.ModelProto:
    """``build_qdq`` as it was: it first copied the whole model (weights too) and then
    replaced its nodes and initializers, appending the kept weights with ``extend``
    (``before`` makes ``append_copies`` that)."""
    onnx.ModelProto().CopyFrom(model.proto)
    return real(model, encodings)


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["minilm-l3", "minilm-l6"])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    for name in a.models:
        path = resolve_model(name)
        model = load(path)
        data = stages.open_data("stdlib-docs", model, max_pairs=8, show=False)
        stats = stages.calibrate_model(model, data)
        plan = Plan(default=Precision.A8_W8)
        scheme = scheme_for(plan)
        best: dict[str, dict[str, float]] = {"before": {}, "now": {}}
        outs: dict[str, tuple[bytes, bytes]] = {}
        for _ in range(a.rounds):
            for variant in ("before", "now"):
                ctx = before() if variant == "before" else contextlib.nullcontext()
                with ctx:
                    if variant == "before":
                        weightless._CONVERTED.clear()  # converted at every load
                    t_load, loaded = _timed(load, path)
                    t_q, q = _timed(quantize_model, model, stats, plan, scheme=scheme)
                for k, v in (("load", t_load), ("quantize_model", t_q)):
                    best[variant][k] = min(best[variant].get(k, v), v)
                outs[variant] = (loaded.proto.SerializeToString(), q.proto.SerializeToString())
        same = outs["before"] == outs["now"]
        for k in ("load", "quantize_model"):
            b, n = best["before"][k], best["now"][k]
            print(f"{name} {k}: before {b:.3f} s, now {n:.3f} s, {b / n:.2f}x "
                  f"(fastest of {a.rounds}; the same bytes: {'yes' if same else 'NO'})",
                  flush=True)


if __name__ == "__main__":
    main()
