"""Text retrieval's top-1 agreement is a share over its queries: the count goes beside it
(``top1_agreement_items``), so a no-goal plan choice decides by its binomial noise as a
class output's does (docs/planner.md)."""

from __future__ import annotations

import numpy as np

from quantscope.plan.pareto import FrontPoint, noise
from quantscope.tasks.headline import share_items
from quantscope.tasks.registry import retrieval_figures
from quantscope.types import Precision


def test_retrieval_figures_count_their_queries():
    rng = np.random.default_rng(0)
    n = 40
    ref = rng.normal(size=(2 * n, 16)).astype(np.float32)
    test = ref + 0.3 * rng.normal(size=ref.shape).astype(np.float32)
    fig = retrieval_figures(ref, test)
    assert fig["top1_agreement_items"] == n
    assert share_items(None, "top1_agreement", fig) == (n, "top-1 picks")


def test_two_retrieval_figures_a_query_apart_are_within_noise():
    """300 queries: 97.0 % against 96.67 % (one query) is within the one-sided 95 % noise
    (about 2.3 points); before, with no count, there was no estimate at all."""
    a16 = Precision("a16_w16")
    best = FrontPoint(1.4, 0.97, 0.97, (("g", a16),), items=300)
    cheap = FrontPoint(1.0, 0.9667, 0.9667, (), items=300)
    half = noise(best, cheap)
    assert half is not None and 0.02 < half[0] < 0.03
