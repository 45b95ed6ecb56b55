"""Vision exports outside the zoo (issue: a deployment engineer's own conv models).

An NHWC export reads its input through a Transpose: the NPU still converts that input to
its 8/16-bit grid, so the emulation must quantize it and the device I/O must say how to
feed it, exactly as for an NCHW input read by the Conv directly.
"""

from __future__ import annotations

import numpy as np
from vision_models import feeds, nhwc_classifier

from quantscope import stages
from quantscope.emulate.encode import encode
from quantscope.export.plan_export import device_io_rows
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.types import Dataset, Plan, Precision, QuantScheme


def _setup(fixture, name, n=32, batch=8):
    f = feeds(name, n)
    b = tuple({k: v[i:i + batch] for k, v in f.items()} for i in range(0, n, batch))
    model = load_proto(fixture(), name)
    data = Dataset(name=name, calibration=b, evaluation=b)
    return model, data, stages.calibrate_model(model, data)


def test_nhwc_input_behind_a_transpose_is_quantized_and_fed_as_integers():
    model, data, stats = _setup(nhwc_classifier, "nhwc_classifier")
    groups = find_groups(model)
    assert groups.model_inputs == ("image",)
    for p, bits in ((Precision.A8_W8, 8), (Precision.A16_W8, 16)):
        enc = encode(model, groups, stats, Plan.uniform(p), scheme=QuantScheme())
        assert enc.activations["image"].bits == bits
        lo, hi = enc.activations["image"].range()
        assert lo <= 0.0 and 250 < hi <= 256
    rows = device_io_rows(model, stats, Plan.uniform(Precision.A8_W8))
    assert [(r["role"], r["tensor"], r["stored_type"]) for r in rows][0] == (
        "input", "image", "uint8")
    # the emulation runs the input's grid besides the Conv(+Relu), pool and Gemm outputs
    res = stages.evaluate_plan(model, data, stats, Plan.uniform(Precision.A8_W8))
    assert res["coverage"]["activations_quantized"] == 4
    assert np.isfinite(res["metrics"]["sqnr_db"])


def test_image_dims_are_named_apart_and_a_given_input_shape_is_said_as_given():
    """An image input [N, 3, H, W] is not a text of length S: H and W are two sizes, and
    the shape the run was checked at (--input-shape) is the one to compile."""
    from quantscope.report.summary import host_steps

    inputs = [{"name": "input", "dtype": 1, "dims": ["N", 3, "H", "W"]}]
    outputs = [{"name": "logits", "dtype": 1, "dims": ["N", 10]}]
    free = host_steps(inputs, outputs, text=False, seq_len=None)
    assert free == ["fix the symbolic dims (H, N, W) for the compiler: input=1x3xHxW (H, W: "
                    "the size you compile for; the size rules were not checked at it: give "
                    "--input-shape)"]
    given = host_steps(inputs, outputs, text=False, seq_len=None,
                       shapes={"input": [1, 3, 32, 48]})
    assert given == ["fix the symbolic dims (H, N, W) for the compiler: input=1x3x32x48"]
    # text keeps its one length S
    ids = [{"name": "input_ids", "dtype": 7, "dims": ["batch", "sequence"]}]
    said = host_steps(ids, outputs, text=True, seq_len=None, longest=40)
    assert said[-1].endswith("input_ids=1xS (S: the length you compile for; the longest "
                             "text here has 40 tokens)")
