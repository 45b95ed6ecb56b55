"""Harsher distance probe for mobilefacenet: small faces *plus sensor noise* (docs/benchmarks.md).

    PYTHONPATH=src python tools/face_noise_probe.py STATS.npz [PLAN.json]

Each of the 27 ``orig`` ArcFace chips is shrunk to a face about N px wide (N = 40, 28, 20, 14;
chip side 1.4 N, area down-scale), Gaussian noise of sigma 0 / 8 / 16 grey levels is added
*at that size* (seeded), and the chip is scaled back to 112 px. Genuine pair = the clean
``orig`` chip vs its degraded copy; impostors = every other face's degraded copy. Prints
pre_norm, match rate and FAR at 1.1 for FP32, a8_w8 (and the plan), all run in ONNX Runtime.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from quantscope import stages  # noqa: E402
from quantscope.emulate.evaluate import run_model  # noqa: E402
from quantscope.serde import read_plan, read_stats  # noqa: E402
from quantscope.tasks import face_quality as fq  # noqa: E402
from quantscope.tasks import faces as ft  # noqa: E402
from quantscope.types import Plan, Precision  # noqa: E402

CONDITIONS = [(px, sigma) for px in (40, 28, 20, 14) for sigma in (0, 8, 16)]


def degrade(chip: np.ndarray, px: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    side = round(1.4 * px)
    small = Image.fromarray(chip).resize((side, side), Image.Resampling.BOX)
    noisy = np.asarray(small, np.float32) + rng.normal(0, sigma, (side, side, 3))
    back = Image.fromarray(np.clip(noisy, 0, 255).round().astype(np.uint8))
    return np.asarray(back.resize(chip.shape[:2][::-1], Image.Resampling.BILINEAR))


def main() -> None:
    model = stages.open_model("mobilefacenet")
    stats = read_stats(sys.argv[1])
    plans = {"a8_w8": Plan.uniform(Precision.A8_W8)}
    if len(sys.argv) > 2:
        plans["plan"] = read_plan(sys.argv[2])
    faces = ft.load_faces("faces", "arcface")
    keep = faces.variant == "orig"
    orig, ids = faces.chips[keep], faces.identity[keep]
    rng = np.random.default_rng(0)
    probes = [degrade(c, px, s, rng) for px, s in CONDITIONS for c in orig]
    x = ft.FACE_STYLES["arcface"].preprocess(np.stack([*orig, *probes]))
    batches = [{"image": x[i : i + 64]} for i in range(0, len(x), 64)]
    protos = {"fp32": model.proto}
    protos |= {k: stages.qdq_for_plan(model, stats, p)[0] for k, p in plans.items()}
    embs = {k: np.concatenate([b[0] for b in run_model(p, batches).batches])
            for k, p in protos.items()}  # fmt: skip
    print("| config | face | noise | pre_norm mean (min) | match@1.1 | genuine distance | FAR@1.1 |")
    print("|---|---|---|---|---|---|---|")
    for name, emb in embs.items():
        report(name, emb, len(orig), ids)
    print()
    gate_table(embs, len(orig))


def gate_table(embs: dict[str, np.ndarray], n: int) -> None:
    """Every degraded probe, binned by pre_norm (FP32 octiles): match rate and the gate."""
    def probe_stats(emb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
        gen = np.linalg.norm(np.tile(unit[:n], (len(CONDITIONS), 1)) - unit[n:], axis=1)
        return np.linalg.norm(emb[n:], axis=1), gen < 1.1

    edges = fq.prenorm_edges(probe_stats(embs["fp32"])[0])
    print("| config | gate | match rate by pre_norm bin (n) |")
    print("|---|---|---|")
    for name, emb in embs.items():
        bins = fq.match_rate_by_prenorm(*probe_stats(emb), edges)
        cells = ", ".join(f"{b.lo:.3g}..{b.hi:.3g}: {b.match_rate:.0%} ({b.n})" for b in bins)
        print(f"| {name} | {fq.quality_gate(bins):.3g} | {cells} |")


def report(name: str, emb: np.ndarray, n: int, ids: np.ndarray) -> None:
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    gallery = unit[:n]
    for j, (px, sigma) in enumerate(CONDITIONS):
        rows = slice(n + j * n, n + (j + 1) * n)
        norms = np.linalg.norm(emb[rows], axis=1)
        dist = np.linalg.norm(gallery[:, None] - unit[rows][None], axis=2)
        gen, imp = np.diag(dist), dist[ids[:, None] != ids[None]]
        print(f"| {name} | {px} px | {sigma} | {norms.mean():.1f} ({norms.min():.1f}) | "
              f"{np.mean(gen < 1.1):.0%} | {gen.mean():.2f} | {np.mean(imp < 1.1):.3f} |")


if __name__ == "__main__":
    main()
