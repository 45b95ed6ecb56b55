"""What glibc's thresholds (``quantscope.emulate.release.tune_malloc``) save on a real run:
the same ``quantscope run`` in two child processes, one with glibc's own thresholds
(``QUANTSCOPE_MALLOC=default``) and one as every command sets them, alternating, each
twice; user and system CPU seconds, wall seconds, the peak resident set and the minor page
faults of each, the ratios of the best. The files they write must be the same (compared
but for the folder's name, the seconds each step took and run.json, the record of each
stage's measured memory and time).

    PYTHONPATH=src python bench/malloc.py [--pairs 16] [--threads 1]

One thread (``QUANTSCOPE_THREADS``), as the suite's workers run; the default run is the
suite's acceptance run (tests/test_run.py, minilm-l3 on stdlib-docs for hailo10h).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
VOLATILE = ("seconds", "started", "finished", "took")
CALL = "import sys; from quantscope.cli import main; sys.exit(main(sys.argv[1:]))"


def _run(mode: str, out: Path, pairs: int, threads: int) -> dict[str, float]:
    env = {**os.environ, "QUANTSCOPE_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": str(ROOT / "src")}
    if mode == "default":
        env["QUANTSCOPE_MALLOC"] = "default"
    args = ["run", "minilm-l3", "--data", "stdlib-docs", "--target", "hailo10h", "--pairs",
            str(pairs), "--seq-len", "64", "--repairs", "bias", "--repair-batches", "1",
            "--goal", "0.9", "--finetune", "off", "--out", str(out)]
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", CALL, *args], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, use = os.wait4(child.pid, 0)  # this child's own resource use
    wall = time.perf_counter() - t
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"the {mode} run failed (exit {child.returncode})")
    return {"user": use.ru_utime, "sys": use.ru_stime, "wall": wall,
            "peak_mb": use.ru_maxrss / 1024, "faults": use.ru_minflt}


def _files(folder: Path) -> dict[str, object]:
    """Each file's content, the folder's own path and the timings taken out."""
    got: dict[str, object] = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name == "run.json":  # the stages' measured memory and times
            continue
        data = p.read_bytes().replace(str(folder).encode(), b"<out>")
        if p.suffix == ".json":
            def drop(v: object) -> object:
                if isinstance(v, dict):
                    return {k: drop(x) for k, x in v.items() if k not in VOLATILE}
                return [drop(x) for x in v] if isinstance(v, list) else v
            got[str(p.relative_to(folder))] = drop(json.loads(data))
        elif p.suffix not in (".html", ".log"):  # the report prints the timings
            got[str(p.relative_to(folder))] = data
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    best: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        kept: dict[str, dict[str, object]] = {}
        for i, mode in enumerate(("default", "tuned") * 2):
            out = Path(d) / f"{mode}{i}"
            got = _run(mode, out, args.pairs, args.threads)
            print(f"{mode:8s} user {got['user']:6.1f} s  sys {got['sys']:5.1f} s  wall "
                  f"{got['wall']:6.1f} s  peak {got['peak_mb']:,.0f} MB  minor faults {got['faults']:,.0f}", flush=True)
            kept.setdefault(mode, _files(out))
            for k, v in got.items():
                best.setdefault(mode, {})[k] = min(best.get(mode, {}).get(k, v), v)
        a, b = kept["default"], kept["tuned"]
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        same = not differ
        if differ:
            print("files that differ:", ", ".join(differ[:8]))
    d0, t0 = best["default"], best["tuned"]
    print(f"tuned / default (best of 2): wall {t0['wall'] / d0['wall']:.2f}x, system "
          f"{t0['sys'] / d0['sys']:.2f}x, user {t0['user'] / d0['user']:.2f}x, faults "
          f"{t0['faults'] / d0['faults']:.2f}x, peak {t0['peak_mb']:,.0f} / {d0['peak_mb']:,.0f} MB; "
          f"files the same: {same}")


if __name__ == "__main__":
    main()
