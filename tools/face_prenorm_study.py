"""pre_norm / match rate by distance for a face model at several precisions (docs/benchmarks.md).

    PYTHONPATH=src python tools/face_prenorm_study.py mobilefacenet \\
        [--plan hailo8=plan8.json --plan hailo10h=plan10.json] [--pinned] > out.md

Calibrates on the built-in ``faces`` set (all chips, minmax), runs FP32, a8_w8, a16_w16 (and
plans from files; ``--pinned``: a16_w16 with the head 1x1 conv's range pinned 1e5x too wide)
in ONNX Runtime and prints markdown tables:

- per distance slice: pre_norm mean (p10), match rate (genuine pairs accepted) and FAR at
  the model's threshold, and the match rate at the *strict* threshold that gives FP32 a FAR of
  1 % (the same threshold for every precision, as a deployed gallery would keep it);
- cross-photo genuine pairs only (the scarce hard ones) per slice;
- match rate by pre_norm bin (edges at FP32 octiles) at both thresholds, and the gate
  (``tasks.face_quality.quality_gate``, target 90 %).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from quantscope import stages  # noqa: E402
from quantscope.emulate.evaluate import run_model  # noqa: E402
from quantscope.serde import read_plan  # noqa: E402
from quantscope.tasks import face_quality as fq  # noqa: E402
from quantscope.tasks import faces as ft  # noqa: E402
from quantscope.tasks import metrics as M  # noqa: E402
from quantscope.types import Plan, Precision  # noqa: E402

HEAD = "MobileFaceNet/Logits/Conv/BatchNorm/FusedBatchNorm"


def embeddings(model, stats, plan, batches) -> np.ndarray:  # noqa: ANN001
    proto = model.proto if plan is None else stages.qdq_for_plan(model, stats, plan)[0]
    out = run_model(proto, batches)
    return np.concatenate([b[0].reshape(len(b[0]), -1) for b in out.batches])


def pinned_stats(stats):  # noqa: ANN001, ANN201
    ts = stats.tensors[HEAD]
    r = max(abs(ts.min), abs(ts.max))
    wide = dataclasses.replace(ts, min=-1e5 * r, max=1e5 * r)
    return dataclasses.replace(stats, tensors={**stats.tensors, HEAD: wide})


def strict_threshold(dist: np.ndarray, genuine: np.ndarray, far: float = 0.01) -> float:
    imp = np.sort(dist[~genuine])
    return float(imp[int(np.floor(far * imp.size))])  # accepts < this: FAR <= far


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--plan", action="append", default=[], help="label=plan.json")
    ap.add_argument("--pinned", action="store_true")
    args = ap.parse_args()
    model = stages.open_model(args.model)
    data = stages.open_data("faces", model)
    task, batches = data.task, list(data.evaluation)
    stats = stages.calibrate_model(model, data)
    configs = {"fp32": (None, stats), "a8_w8": (Plan.uniform(Precision.A8_W8), stats),
               "a16_w16": (Plan.uniform(Precision.A16_W16), stats)}  # fmt: skip
    for spec in args.plan:
        label, path = spec.split("=", 1)
        configs[label] = (read_plan(path), stats)
    if args.pinned:
        configs["a16_w16 pinned"] = (Plan.uniform(Precision.A16_W16), pinned_stats(stats))
    emb = {k: embeddings(model, st, plan, batches) for k, (plan, st) in configs.items()}
    style = ft.style_for_input(tuple(model.value_shapes()[model.input_names()[0]]))
    report(args.model, task, emb, ft.load_faces("faces", style.name))


def report(name: str, task, emb: dict[str, np.ndarray], faces: ft.FaceSet) -> None:  # noqa: ANN001
    p, thr = task.pairs, task.threshold
    cross = p.genuine & (faces.photo[p.first] != faces.photo[p.second])
    dist = {k: ft.pair_distances(e, p, normalize=task.normalize) for k, e in emb.items()}
    strict = strict_threshold(dist["fp32"], p.genuine)
    norms = {k: ft.pre_norms(e) for k, e in emb.items()}
    slices = [s for s in ft.SLICES if (p.distance == s).any()]
    print(f"### {name}: threshold {thr:g}, strict threshold {strict:.3f} (FP32 FAR 1 %)\n")
    print("| config | " + " | ".join(slices) + " | TAR@FAR1% | FAR@thr | collapsed |")
    print("|---" * (len(slices) + 4) + "|")
    for k, d in dist.items():
        cells = []
        for s in slices:
            sel = p.distance == s
            chips = np.unique(p.second[sel])
            cells.append(f"{norms[k][chips].mean():.3g} ({np.percentile(norms[k][chips], 10):.3g}); "
                         f"{np.mean(d[sel & p.genuine] < thr):.0%} / "
                         f"{np.mean(d[sel & p.genuine] < strict):.0%}; "
                         f"x {np.mean(d[sel & cross] < thr):.0%} / {np.mean(d[sel & cross] < strict):.0%}")
        tar = M.tar_at_far(d, p.genuine.astype(np.int64), 0.01).tar
        col = M.collapse_report(emb[k], reference=emb["fp32"]).collapsed
        print(f"| {k} | " + " | ".join(cells) +
              f" | {tar:.3f} | {np.mean(d[~p.genuine] < thr):.3f} | {col} |")
    print("\ncell: pre_norm mean (p10); match rate at threshold / strict; "
          "x = cross-photo genuine pairs only\n")
    print("| config | embedding cosine to FP32 per slice (mean, min) | genuine distance per slice |")
    print("|---|---|---|")
    for k, e in emb.items():
        cos = M.row_cosines(emb["fp32"], e)
        per = [(s, np.unique(p.second[p.distance == s])) for s in slices]
        c1 = ", ".join(f"{s} {cos[c].mean():.4f} ({cos[c].min():.3f})" for s, c in per)
        c2 = ", ".join(f"{s} {dist[k][(p.distance == s) & p.genuine].mean():.3f}" for s in slices)
        print(f"| {k} | {c1} | {c2} |")
    print()
    gen = p.genuine
    edges = fq.prenorm_edges(norms["fp32"][p.second[gen]])
    print("| config | gate (thr) | gate (strict) | match rate by pre_norm bin, at thr / strict |")
    print("|---|---|---|---|")
    for k, d in dist.items():
        b1 = fq.match_rate_by_prenorm(norms[k][p.second[gen]], d[gen] < thr, edges)
        b2 = fq.match_rate_by_prenorm(norms[k][p.second[gen]], d[gen] < strict, edges)
        cells = ", ".join(f"{x.lo:.3g}..{x.hi:.3g}: {x.match_rate:.0%}/{y.match_rate:.0%} (n {x.n})"
                          for x, y in zip(b1, b2, strict=True))
        print(f"| {k} | {fq.quality_gate(b1):.3g} | {fq.quality_gate(b2):.3g} | {cells} |")
    print()


if __name__ == "__main__":
    main()
