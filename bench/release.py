"""What a memory release costs where a process holds many objects, and what releasing only
on growth saves: the tiny decoder's rewrite search (``tests/decoder_tiny.searched_run``,
342 releases) run in one process with every release made (``RELEASE_GROWTH = 0``, the
behaviour before stop 55) and with the default rule, each after the same heap ballast (the
objects a test worker or a long session holds: ``--ballast`` million small dicts). Each
variant runs twice, alternating; the ratio is of the best times.

    PYTHONPATH=src python bench/release.py [--ballast 2]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

from quantscope.emulate import release


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ballast", type=float, default=2.0, help="million objects held")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from decoder_tiny import searched_run  # the search the suite shares

    ballast = [{"i": i} for i in range(int(args.ballast * 1e6))]
    t = time.perf_counter()
    gc.collect()
    print(f"one full collection with {len(ballast):,} objects held: "
          f"{(time.perf_counter() - t) * 1e3:.0f} ms")
    best: dict[str, float] = {}
    default, real = release.RELEASE_GROWTH, gc.collect
    for variant in ("every release", "on growth") * 2:
        release.RELEASE_GROWTH = 0 if variant == "every release" else default
        calls: list[int] = []

        def counted(*a: int, calls: list[int] = calls) -> int:
            calls.append(1)
            return real(*a)

        gc.collect = counted  # type: ignore[assignment]
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            searched_run(Path(d))
        took = time.perf_counter() - t
        gc.collect = real  # type: ignore[assignment]
        best[variant] = min(best.get(variant, took), took)
        print(f"{variant:14s} {took:6.1f} s, {len(calls)} full collections")
    release.RELEASE_GROWTH = default
    print(f"on growth / every release: {best['on growth'] / best['every release']:.2f}x time")


if __name__ == "__main__":
    main()
