"""A real consumer loads our QNN encodings: AIMET-ONNX's QuantizationSimModel.

Slow and optional: ``aimet-onnx`` is not in the extras (it pulls ``onnx2torch``, whose
``torchvision`` does not install with torch 2.13; install it with ``pip install
--no-deps aimet-onnx onnx2torch`` plus its other requirements). The tiny ViT block,
rewritten by ``rank4`` (the graph a QNN user compiles), is calibrated and exported at
a16_w8 by quantscope; AIMET builds its own simulation of the same graph, loads the
encodings (quantizers without one are disabled) and its outputs are compared with our
emulation (measured: within 2 % of the quantization error, both file versions).
"""

import numpy as np
import onnx
import pytest
import tiny_vit

from quantscope.calibrate.collect import calibrate
from quantscope.emulate.qdq import quantize_model, scheme_for
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.repair.rank4 import rank4_linears
from quantscope.repair.verify import run_all
from quantscope.stages import export_plan
from quantscope.types import Plan, Precision

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("version", ["1.0.0", "0.6.1"])
def test_aimet_quantsim_with_our_encodings_matches_our_emulation(tmp_path, version):
    quantsim = pytest.importorskip("aimet_onnx.quantsim")
    model = load_proto(rank4_linears(load_proto(tiny_vit.vit_block())).proto)
    feeds = [tiny_vit.tokens(8, seed=i) for i in range(2)]
    stats = calibrate(model, find_groups(model), iter(feeds))
    plan = Plan(default=Precision.A16_W8, target="qnn_htp_v73")
    path = export_plan(model, stats, plan, fmt="qnn", out=tmp_path / "enc.json",
                       qnn_version=version)
    ours = run_all(quantize_model(model, stats, plan, scheme=scheme_for(plan)).proto, feeds)
    ref = run_all(model.proto, feeds)
    sim = quantsim.QuantizationSimModel(onnx.load_from_string(model.proto.SerializeToString()),
                                        param_type="int8", activation_type="int16",
                                        providers=["CPUExecutionProvider"])
    quantsim.load_encodings_to_sim(sim, str(path), strict=False)
    for f, o, r in zip(feeds, ours, ref, strict=True):
        aimet = sim.session.run(None, f)[0]
        quant_err = np.abs(o[0] - r[0]).max()
        assert quant_err > 0 and np.abs(aimet - r[0]).max() > 0  # both quantize
        assert np.abs(aimet - o[0]).max() <= 0.05 * quant_err
