"""What the fine-tuning benches record and print (shared by finetune.py and finetune_faces.py)."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np


def finetune_record(res: Any) -> dict[str, Any]:
    """The fine-tune's own figures: time, steps, rows, held-out metric before/best, history."""
    return {"seconds": round(res.seconds, 1), "steps": res.steps, "samples": res.samples,
            "train_rows": res.train_rows, "holdout_rows": res.holdout_rows,
            "metric": res.metric, "device": res.device, "holdout_before": res.holdout_before,
            "holdout_best": res.holdout_best, "best_step": res.best_step,
            "history": list(res.history)}


def finish(out: dict[str, Any], t0: float, json_path: str | None) -> int:
    """Add wall time and peak RSS, print the after / fine-tuned-FP32 lines, write JSON."""
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"after:  {out['after']}\nfine-tuned FP32 vs original: "
          f"{out['finetuned_fp32_vs_original']}\nwall {out['wall_s']} s, peak RSS "
          f"{out['peak_rss_mb']} MB", flush=True)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


def save_delta(weights: dict[str, np.ndarray], ranges: dict[str, tuple[float, float]],
               original: dict[str, np.ndarray], directory: str | Path,
               max_bytes: int = 15_000_000, dtype: type = np.float32) -> list[Path]:
    """A fine-tune's result in files small enough to copy back from a GPU machine: each
    trained weight as its difference from the original FP32 weight (rows of a matrix that
    did not move are left out, e.g. an embedding table's unseen tokens), in ``.npz`` files
    of at most ``max_bytes``, and the learned ranges in ``ranges.json``.
    :func:`load_delta` rebuilds ``original + delta``: in float32 that is the trained weight
    to the last bit or so; ``dtype=np.float16`` halves the size but moves a few weights
    across their 8-bit rounding boundary (minilm-l6: top-1 on 100 pairs 0.92 -> 0.91). The
    figures of a rebuilt model are measured again (``finetune_apply.py``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    part: dict[str, np.ndarray] = {}
    size = 0

    def flush() -> None:
        nonlocal part, size
        if part:
            files.append(out / f"delta_{len(files):03d}.npz")
            np.savez(files[-1], **part)
            part, size = {}, 0

    for i, (name, w) in enumerate(sorted(weights.items())):
        d = (np.asarray(w, np.float32) - original[name].astype(np.float32))
        entry = {f"{i}.name": np.array(name)}
        if d.ndim == 2:
            rows = np.flatnonzero(np.any(d != 0, axis=1))
            entry[f"{i}.rows"] = rows.astype(np.int32)
            d = d[rows]
        entry[f"{i}.delta"] = d.astype(dtype)
        n = sum(a.nbytes for a in entry.values())
        if size and size + n > max_bytes:
            flush()
        part.update(entry)
        size += n
    flush()
    (out / "ranges.json").write_text(json.dumps({k: list(v) for k, v in ranges.items()}))
    return files


def load_delta(directory: str | Path, original: dict[str, np.ndarray],
               ) -> tuple[dict[str, np.ndarray], dict[str, tuple[float, float]]]:
    """``(weights, ranges)`` from :func:`save_delta`'s files."""
    src = Path(directory)
    weights: dict[str, np.ndarray] = {}
    for f in sorted(src.glob("delta_*.npz")):
        with np.load(f) as z:
            for key in [k for k in z.files if k.endswith(".name")]:
                i = key.removesuffix(".name")
                name = str(z[key])
                w = original[name].astype(np.float32).copy()
                d = z[f"{i}.delta"].astype(np.float32)
                if f"{i}.rows" in z.files:
                    w[z[f"{i}.rows"]] += d
                else:
                    w += d
                weights[name] = w
    ranges = {k: (float(v[0]), float(v[1]))
              for k, v in json.loads((src / "ranges.json").read_text()).items()}
    return weights, ranges
