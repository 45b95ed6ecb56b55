"""FP32's greedy continuations of a decoder, made and then found again in one process.

    python bench/fp32_greedy.py [MODEL] [--prompts 32] [--new-tokens 64]

MODEL defaults to the built-in smollm2-135m. The prompts are the evaluate stage's
(:func:`quantscope.stages_llm.lm_text` at :meth:`~quantscope.stages_llm.LmSetup.at`'s
amounts). :func:`quantscope.tasks.lm_phases.fp32_greedy` is called twice. The first call
generates. The second finds the same graphs, prompts and length by their content (both
graphs loaded and hashed) and generates nothing. Each stage of a decoder run that
measures against FP32's greedy tokens pays the second figure, not the first.
"""

from __future__ import annotations

import argparse
import time

from quantscope.stages_llm import LmSetup, lm_text, open_phase
from quantscope.tasks.lm_phases import fp32_greedy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    a = ap.parse_args()
    setup = LmSetup.at(None, prompts=a.prompts, new_tokens=a.new_tokens)
    _, prompts = lm_text(a.model, setup)
    for label in ("made", "found again"):
        start = time.perf_counter()
        fp32_greedy(lambda p: open_phase(a.model, p), prompts, setup.new_tokens)
        print(f"{label}: {time.perf_counter() - start:.1f} s "
              f"({len(prompts)} prompts x {setup.new_tokens} tokens)", flush=True)


if __name__ == "__main__":
    main()
