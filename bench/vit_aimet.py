"""AIMET-ONNX QuantizationSimModel with our QNN encodings vs our emulation, on a real graph.

Usage (with ``aimet-onnx`` installed, see ``tests/test_aimet_consumer.py``)::

    python bench/vit_aimet.py MODEL.onnx PLAN.json STATS.npz ENC_1.0.0 [ENC_0.6.1 …]

Runs 4 ``photos`` views (2 photos x 2) through our emulation of PLAN, through FP32 and
through AIMET's simulation of MODEL with each encodings file loaded (quantizers without
an encoding disabled), and prints the SQNR of each against the other.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from aimet_onnx.quantsim import QuantizationSimModel, load_encodings_to_sim

from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.load import load
from quantscope.numerics import sqnr_db
from quantscope.repair.verify import run_all
from quantscope.serde import read_plan, read_stats
from quantscope.tasks.images import make_views
from quantscope.zoo.vit import preprocess_image


def main(model_path: str, plan_path: str, stats_path: str, *encodings: str) -> None:
    model, plan = load(model_path), read_plan(plan_path)
    feeds = [{"image": preprocess_image(make_views(views=2, photos=2).views)}]
    ours = run_all(quantize_model(model, read_stats(stats_path), plan,
                                  scheme=scheme_for(plan)).proto, feeds)[0][0]
    ref = run_all(model.proto, feeds)[0][0]
    for path in encodings:
        sim = QuantizationSimModel(onnx.load(model_path), param_type="int8",
                                   activation_type="int16",
                                   providers=["CPUExecutionProvider"])
        load_encodings_to_sim(sim, path, strict=False)
        aimet = sim.session.run(None, feeds[0])[0]
        print(f"{path}: AIMET vs ours {sqnr_db(ours, aimet):.1f} dB (max |diff| "
              f"{np.abs(aimet - ours).max():.3g}); ours vs FP32 {sqnr_db(ref, ours):.1f} dB; "
              f"AIMET vs FP32 {sqnr_db(ref, aimet):.1f} dB")


if __name__ == "__main__":
    main(*sys.argv[1:])
