"""Wall time of emulated a8_w8 and a16_w16 models as ratios to the FP32 model.

Same process, same inputs; the sessions are timed interleaved (one pass over the batches
each, in turn, per repeat) and each keeps its best repeat, so load that comes and goes
hits every session alike. The FP32 baseline runs with ORT's graph optimizations off, as
emulation does ("same ORT settings"); the FP32 model with ORT's basic optimizations is
shown for reference. Each precision is timed twice: as emulation runs it
(:func:`~quantscope.emulate.session.make_session`: the emulation form, weights
dequantized once) and as the exported QDQ graph runs when handed to ORT as written
(optimizations off: every weight dequantized on every run), after checking that both give
bit-identical outputs.

    python bench/emulation.py [MODEL ...] [--batches N] [--repeats R]

MODEL defaults to every built-in model (needs the `models` extra); any ONNX path works
with random inputs. A decoder (smollm2-135m) is timed per phase graph: ``prefill`` on one
prompt of ``PREFILL`` tokens per batch, ``decode`` on one token with a cache of
``PREFILL`` positions (random token ids and cache values: time does not depend on them).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from quantscope.calibrate.collect import calibrate  # noqa: E402
from quantscope.emulate.encode import encode  # noqa: E402
from quantscope.emulate.qdq import build_qdq  # noqa: E402
from quantscope.emulate.session import make_session  # noqa: E402
from quantscope.model.groups import find_groups  # noqa: E402
from quantscope.stages import open_model  # noqa: E402
from quantscope.types import Plan, Precision, QuantScheme  # noqa: E402
from quantscope.zoo import BUILTIN_MODELS  # noqa: E402

PREFILL = 128  # prompt tokens of a decoder's prefill, cache positions of its decode


def _models(name):
    """(label, model, sizes of symbolic dims) to time: a decoder's phase graphs apart."""
    spec = BUILTIN_MODELS.get(name)
    if (spec is not None and spec.task == "lm") or ".prefill." in name:
        from quantscope.stages_llm import open_phase

        return [(f"{name} prefill", open_phase(name, "prefill"), {"sequence": PREFILL}),
                (f"{name} decode", open_phase(name, "decode"),
                 {"sequence": 1, "past_sequence": PREFILL})]
    return [(name, open_model(name), {})]


def _feeds(model, n, seed=0, sizes=None):
    rng = np.random.default_rng(seed)
    types = model.value_types()
    shapes = model.value_shapes()
    sizes = sizes or {}
    out = []
    for _ in range(n):
        feed = {}
        for name in model.input_names():
            dims = [d if isinstance(d, int) else sizes.get(d, 8 if i == 0 else 64)
                    for i, d in enumerate(shapes.get(name, ()))]
            if types.get(name) == 7:  # int64 token ids / masks / token types
                feed[name] = (rng.integers(1000, 20000, dims) if name == "input_ids"
                              else np.ones(dims, np.int64) if "mask" in name
                              else np.zeros(dims, np.int64)).astype(np.int64)
            else:
                feed[name] = rng.normal(0, 1, dims).astype(np.float32)
        out.append(feed)
    return out


def as_written(proto, threads=0):
    """The QDQ graph handed to ORT as it is, optimizations off (how emulation ran before),
    threads as evaluate's sessions (no spinning after a run)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _pass(session, feeds):
    t = time.perf_counter()
    for f in feeds:
        session.run(None, f)
    return time.perf_counter() - t


def time_interleaved(sessions, feeds, repeats):
    """Best-of-``repeats`` seconds per session, the sessions timed in turn each repeat."""
    for s in sessions.values():
        s.run(None, feeds[0])  # warm-up
    best = dict.fromkeys(sessions, float("inf"))
    for _ in range(repeats):
        for name, s in sessions.items():
            best[name] = min(best[name], _pass(s, feeds))
    return best


def _sessions(model, feeds, threads=0):
    """Every session as evaluate opens its FP32 and emulated ones (``shared_arena``: one
    process-wide arena, threads do not spin after a run)."""
    groups = find_groups(model)
    stats = calibrate(model, groups, iter(feeds))
    kw = {"threads": threads, "shared_arena": True}
    out = {"fp32 (optimizations off)": make_session(model.proto, **kw),
           "fp32 (ORT basic opts)": make_session(model.proto, optimize=True, **kw)}
    for p in (Precision.A8_W8, Precision.A16_W16):
        qdq = build_qdq(model, encode(model, groups, stats, Plan.uniform(p), scheme=QuantScheme()))
        emu, raw = make_session(qdq, **kw), as_written(qdq, threads)
        for f in feeds:
            for a, b in zip(emu.run(None, f), raw.run(None, f), strict=True):
                assert np.array_equal(a, b), f"{p.value}: emulation form differs from the graph"
        out[f"{p.value} emulated"] = emu
        out[f"{p.value} as written"] = raw
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=list(BUILTIN_MODELS))
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0,
                    help="intra-op threads of every session (0: ORT's default, one per core)")
    args = ap.parse_args()
    print(f"machine: {platform.machine()} {platform.processor() or ''}, onnxruntime "
          f"{ort.__version__}; {args.batches} batches x {args.repeats} repeats, interleaved, "
          f"intra-op threads {args.threads or 'default'}, "
          "best of each; load average before: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    for label, model, sizes in (m for name in args.models for m in _models(name)):
        feeds = _feeds(model, args.batches, sizes=sizes)
        best = time_interleaved(_sessions(model, feeds, args.threads), feeds, args.repeats)
        base = best["fp32 (optimizations off)"]
        print(f"\n{label} (load average after: {os.getloadavg()[0]:.2f})")
        for kind, t in best.items():
            print(f"  {kind:<26} {t * 1e3:8.1f} ms  {t / base:.2f}x")


if __name__ == "__main__":
    main()
