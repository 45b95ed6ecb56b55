"""Number argument types of the command line (moved out of :mod:`.types`, which
re-exports them): positive int, count (0 = all), fraction in (0, 1], confidence in
[0.5, 1), finite (positive / non-negative / at least 1) float; each fails while parsing
with one line naming the value and what to give.
"""

from __future__ import annotations

import argparse
import math

from quantscope.types import MAX_SEQ_LEN


def _number(text: str, kind: type, what: str) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number: give {what}") from None


def positive_int(text: str) -> int:
    value = _number(text, int, "a whole number of 1 or more")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: give a whole number of 1 "
                                         "or more")
    return int(value)


def count(text: str) -> int:
    """A whole number >= 0 where 0 means 'all' (``--pairs``)."""
    value = _number(text, int, "a whole number (0 = all)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: give a whole number >= 0 "
                                         "(0 = all)")
    return int(value)


def pair_count(text: str) -> int:
    """``--pairs``: 0 (all) or 2 or more (top-1 retrieval among one document is always
    right: a 100 % that says nothing)."""
    value = count(text)
    if value == 1:
        raise argparse.ArgumentTypeError("1 pair: top-1 retrieval among one document is "
                                         "always right: give 2 or more (0 = all)")
    return value


MIN_SEQ_LEN = 2  # a text's two special tokens ([CLS] ... [SEP], <s> ... </s>)


def seq_len(text: str) -> int:
    """``--seq-len``: a whole number that holds at least the special tokens and at most
    :data:`MAX_SEQ_LEN`."""
    value = positive_int(text)
    if value < MIN_SEQ_LEN:
        raise argparse.ArgumentTypeError(
            f"{value} token cannot hold a text's {MIN_SEQ_LEN} special tokens ([CLS] and "
            f"[SEP]): give {MIN_SEQ_LEN} or more (the deployment's sequence length)")
    return at_most_max_seq_len(value)


def at_most_max_seq_len(value: int) -> int:
    """A sequence length (``--seq-len``, ``--lengths``) no longer than :data:`MAX_SEQ_LEN`."""
    if value > MAX_SEQ_LEN:
        raise argparse.ArgumentTypeError(
            f"{value} tokens is longer than quantscope runs a model at ({MAX_SEQ_LEN}: every "
            "check and measurement runs the model at that length, in memory): give the "
            "deployment's sequence length")
    return value


def new_tokens(text: str) -> int:
    """``--new-tokens``: greedy tokens per prompt, each one a decode step on a KV cache one
    token longer, so at most :data:`MAX_SEQ_LEN` like a sequence length (a huge count ran
    until stopped)."""
    value = positive_int(text)
    if value > MAX_SEQ_LEN:
        raise argparse.ArgumentTypeError(
            f"{value} greedy tokens grow each prompt's KV cache past the longest sequence "
            f"quantscope runs a model at ({MAX_SEQ_LEN}): give fewer (the default is 64)")
    return value


def finite_float(text: str) -> float:
    value = float(_number(text, float, "a finite number"))
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite number: give one")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value:g} is not allowed: give a number above 0")
    return value


def at_least_one(text: str) -> float:
    value = finite_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value:g} is below 1: give a number >= 1")
    return value


def non_negative_float(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value:g} is negative: give a number >= 0")
    return value


def fraction(text: str) -> float:
    """A fraction in (0, 1]."""
    value = finite_float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{value:g} is outside (0, 1]: give a fraction "
                                         "above 0 and at most 1")
    return value


def confidence(text: str) -> float:
    """A confidence level in [0.5, 1) (``--race``)."""
    value = finite_float(text)
    if not 0.5 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value:g} is outside [0.5, 1): give a confidence "
                                         "such as 0.95")
    return value
