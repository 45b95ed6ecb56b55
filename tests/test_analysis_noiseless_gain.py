"""An offender whose promotion makes the output noiseless (gain ``inf`` dB).

The analysis file writes a non-finite number as its string ('inf'), but the planner's
reader (``serde.sensitivity_from_dict``) demanded a number: ``run`` on a model whose one
lossy layer is a MaxPool (a uint8 image /255, then pooled) stopped with
``'score_db' in offender 'pool' of analysis '.../analysis.json' must be a number (got
'inf')``, refusing the file it had just written. The string now reads as the number.
"""

from __future__ import annotations

import math

import numpy as np

from quantscope.analyze.report import Analysis, Offender, analysis_to_dict
from quantscope.serde import sensitivity_from_dict
from quantscope.types import Precision


def test_an_inf_offender_score_written_by_analyze_reads_back():
    a = Analysis(model="m.onnx", low="a8_w8", high="a16_w16", target=None,
                 primary="output_sqnr_db", higher_is_better=True, method={},
                 baselines={"a8_w8": {"sqnr_db": 143.3}}, noise=(), sensitivity=(),
                 offenders=(Offender("pool", math.inf, ("promoting it alone: 143.3 -> inf dB",)),
                            Offender("cast", 0.0, ())),
                 outliers=(), weights=(), collapse={}, recovery=())
    written = analysis_to_dict(a)
    assert written["offenders"][0]["score_db"] == "inf"
    sens = sensitivity_from_dict(written, "analysis.json")
    assert sens.gain("pool", Precision.A16_W16) == math.inf
    assert sens.gain("cast", Precision.A16_W16) == 0.0


def test_run_on_a_model_made_noiseless_by_one_promotion(tmp_path):
    import onnx
    from test_uint8_image_input import cast_pool_model

    from quantscope.cli import main

    m, x = tmp_path / "m.onnx", tmp_path / "x.npz"
    onnx.save(cast_pool_model(), m)
    np.savez(x, img=np.random.default_rng(0).integers(0, 256, (8, 3, 8, 8)).astype(np.uint8))
    assert main(["run", str(m), "--data", str(x), "--target", "hailo8",
                 "--out", str(tmp_path / "W")]) == 0
    assert (tmp_path / "W" / "verdict.json").is_file()
