"""What the fine-tuning benches record and print (shared by finetune.py and finetune_faces.py)."""

from __future__ import annotations

import json
import resource
import time
from typing import Any


def finetune_record(res: Any) -> dict[str, Any]:
    """The fine-tune's own figures: time, steps, rows, held-out metric before/best, history."""
    return {"seconds": round(res.seconds, 1), "steps": res.steps, "samples": res.samples,
            "train_rows": res.train_rows, "holdout_rows": res.holdout_rows,
            "metric": res.metric, "holdout_before": res.holdout_before,
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
