"""The text amounts both LLM benches take (``--seq-len`` … ``--new-tokens``) and their setup."""

from __future__ import annotations

import argparse

from quantscope.stages_llm import LmSetup

AMOUNTS = (("seq-len", 64), ("calibration", 16), ("evaluation", 8), ("steps", 8),
           ("prompts", 4), ("new-tokens", 32))


def lm_parser(description: str) -> argparse.ArgumentParser:
    """MODEL (default smollm2-135m) and the text amounts."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    for name, default in AMOUNTS:
        ap.add_argument(f"--{name}", type=int, default=default)
    return ap


def lm_setup(a: argparse.Namespace) -> LmSetup:
    return LmSetup(seq_len=a.seq_len, calibration=a.calibration, evaluation=a.evaluation,
                   steps=a.steps, prompts=a.prompts, new_tokens=a.new_tokens)
