"""Each stage's memory estimate against the RSS it reached, for one ``quantscope run``.

Runs ``python -m quantscope run ARGS`` (``--out`` among them), samples the child's
resident set (``VmRSS`` of ``/proc/PID/status``) every ``--every`` seconds while it
prints its ``[stage] …`` lines, and prints, per stage: the estimate said before its work
(``run.json``'s ``memory_estimate_mb``), the largest RSS sampled while the stage ran before
its estimate was said (the model and the data loaded) and after it (the work the estimate
is of), the stage's own peak as ``run`` records it (``peak_rss_mb``: ``VmHWM`` reset before each
stage) and the ratio of the estimate to that peak.

    python bench/stage_memory.py -- minilm-l3 --data stdlib-docs --target hailo10h \\
        --pairs 100 --out /tmp/w
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

STAGE = re.compile(r"^\[(\w+)\] …")
SAID = re.compile(r"^\[(\w+)\] memory: ~")


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then run's arguments")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    out = Path(args[args.index("--out") + 1])
    start = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "quantscope", "run", *args],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    stage = ["(before the first stage)"]
    sampled: dict[str, float] = {}

    def sample() -> None:
        while p.poll() is None:
            rss = _rss_mb(p.pid)
            if rss is not None:
                sampled[stage[0]] = max(sampled.get(stage[0], 0.0), rss)
            time.sleep(a.every)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    assert p.stderr is not None
    for line in p.stderr:
        m = STAGE.match(line)
        if m:
            stage[0] = m.group(1)
        m = SAID.match(line)
        if m:  # what the estimate is of: the work after it (the model and data are loaded)
            stage[0] = f"{m.group(1)} after"
        if "memory" in line and line.startswith("["):
            print(line.rstrip(), file=sys.stderr)
    p.wait()
    t.join()
    wall = time.perf_counter() - start
    stages = json.loads((out / "run.json").read_text())["stages"]
    print(f"exit {p.returncode}, {wall:.0f} s")
    print("| stage | estimate (MB) | sampled RSS peak: before the estimate / after it (MB) | "
          "run.json peak_rss_mb | estimate / sampled peak after it | estimate / peak_rss_mb |")
    print("|---|---|---|---|---|---|")
    for name, entry in stages.items():
        est, peak = entry.get("memory_estimate_mb"), entry.get("peak_rss_mb")
        got, after = sampled.get(name), sampled.get(f"{name} after")
        print(f"| {name} | {est or '–'} | {f'{got:.0f}' if got else '–'} / "
              f"{f'{after:.0f}' if after else '–'} | {peak or '–'} | "
              f"{f'{est / after:.2f}' if est and after else '–'} | "
              f"{f'{est / peak:.2f}' if est and peak else '–'} |")


if __name__ == "__main__":
    main()
