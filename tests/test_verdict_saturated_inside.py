"""A plan that measures worse than uniform a8_w8 held out because the held-out values
leave calibrated ranges inside the model (issue: models as real toolchains export them:
two inputs ``a [batch_a, 16]``, ``b [batch_b, 16]``, 16 fit samples).

``run`` said ``cost 7.182x …; held out, the plan is -0.034 dB against uniform a8_w8``
and nothing else: ``ha`` clipped 2.34 % of its held-out values (``evaluate.json`` knew,
its saturation note), which no 16-bit promotion helps, and neither the console, the
report nor ``verdict.json`` said so.
"""

from __future__ import annotations

from quantscope.pipeline.verdict import _saturated_inside
from quantscope.report.summary import _worse_than_uniform


def _row(tensor: str, share: float) -> dict:
    return {"tensor": tensor, "below": 0.0, "above": share, "data_min": -1.0,
            "data_max": 3.8, "range_min": -1.0, "range_max": 2.6}


def test_the_tensors_inside_that_clip_are_listed_without_the_outputs():
    plan = {"saturation": {"rows": 16, "tensors": [
        _row("b", 0.0117), _row("ha", 0.0234), _row("yh", 0.01)]}}
    outputs = [{"tensor": "y", "encoded_as": "yh"}]
    assert _saturated_inside(plan, outputs) == [{"tensor": "ha", "share": 0.0234},
                                                {"tensor": "b", "share": 0.0117}]


def test_a_plan_worse_than_uniform_says_the_clipping_inside():
    v = {"metric": "sqnr_db_channel_min", "higher_is_better": True,
         "quality": {"plan": {"sqnr_db_channel_min": 12.64},
                     "a8_w8": {"sqnr_db_channel_min": 12.674}},
         "saturated_inside": [{"tensor": "ha", "share": 0.0234}, {"tensor": "b", "share": 0.0117}]}
    line = _worse_than_uniform(v)
    assert line.startswith("held out, the plan is -0.034 dB against uniform a8_w8 (chosen on "
                           "the fit data); 2 tensor(s) clip held-out values at their "
                           "calibrated ranges (worst: ha 2.34%, b 1.17%; verdict.json "
                           "saturated_inside)")
    assert _worse_than_uniform({**v, "saturated_inside": []}).endswith("(chosen on the fit data)")
