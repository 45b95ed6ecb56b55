"""h65's leftovers (h70). (1) A gated share whose judged samples hold one point each (a
``[N, 2]`` point output, a gate on another output's score) had no ``KEY_clusters``: the
headline said ``n=6 held-out samples`` though 3 were judged. (2) A worst-channel headline
whose worst output is a one-value output was named by no ``channels`` line. (3) A DFL
head's rows were said ``box values, scores``."""

from __future__ import annotations

import numpy as np

from quantscope.report.summary import headline, sample_size
from quantscope.tasks.headline import share_items
from quantscope.tasks.shares import judged_samples, share_counts
from quantscope.units import counted


def test_a_gated_share_of_one_point_per_sample_says_the_samples_judged():
    """6 held-out samples, one point each, the gate passes on 3 (2 agree)."""
    got = share_counts("point_agreement", np.array([1, 0, 1, 0, 0, 0.0]),
                       np.array([1, 0, 1, 0, 1, 0]))
    assert got == {"point_agreement_items": 3.0, "point_agreement_clusters": 3.0}
    values = {"point_agreement": 2 / 3, **got}
    assert judged_samples("point_agreement", values, 6) == 3
    v = {"metric": "point_agreement", "held_out": {"samples": 6, "unit": "samples"},
         "quality": {"plan": values}, "legal": True}
    assert sample_size(v) == "n=3 of 6 held-out samples judged, 3 points"
    assert headline(v)["judged"] == 3
    assert counted("point_agreement", values) == "66.7 % (n=3, 3 samples judged)"
    assert share_items(None, "point_agreement", values) == (3, "points")


def test_one_point_in_every_sample_is_still_a_plain_count():
    got = share_counts("point_agreement", np.ones(4), np.ones(4))
    assert got == {"point_agreement_items": 4.0}
    v = {"metric": "point_agreement", "held_out": {"samples": 4, "unit": "samples"},
         "quality": {"plan": {"point_agreement": 1.0, **got}}, "legal": True}
    assert sample_size(v) == "n=4 held-out samples"
    assert "judged" not in headline(v)
