"""Vision exports outside the zoo (issue: a deployment engineer's own conv models).

An NHWC export reads its input through a Transpose: the NPU still converts that input to
its 8/16-bit grid, so the emulation must quantize it and the device I/O must say how to
feed it, exactly as for an NCHW input read by the Conv directly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from outside_models import prepared, scalar_probability
from vision_models import feeds, nhwc_classifier, softmax_classifier

from quantscope import stages
from quantscope.cli import main
from quantscope.emulate.encode import encode
from quantscope.export.plan_export import device_io_rows
from quantscope.model.groups import find_groups
from quantscope.model.load import load_proto
from quantscope.serde import read_json
from quantscope.tasks.classes import ClassTask
from quantscope.tasks.layout import LayoutError, layout_tasks, parse_layout
from quantscope.types import Plan, Precision, QuantScheme


def _setup(fixture, name, n=32, batch=8):
    return prepared(fixture, name, n, batch, feeds_of=feeds)


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
    assert given == ["fix the symbolic dims (H, N, W) for the compiler: input=1x3x32x48 "
                     "(input as --input-shape, the shape checked)"]
    # text keeps its one length S
    ids = [{"name": "input_ids", "dtype": 7, "dims": ["batch", "sequence"]}]
    said = host_steps(ids, outputs, text=True, seq_len=None, longest=40)
    assert said[-1].endswith("input_ids=1xS (S: the length you compile for; the longest "
                             "text here has 40 tokens)")


def _outputs(name, *batches):
    from quantscope.types import Outputs

    return Outputs(names=(name,), batches=tuple((np.asarray(b, np.float32),) for b in batches))


def test_class_task_counts_changed_classes_ties_and_top5():
    task = ClassTask(name="class:p", output="p")
    ref = np.eye(8)[[0, 1, 2, 3, 4, 5, 6, 7]] * 0.9 + 0.01  # top class i for sample i
    test = ref.copy()
    test[1] = 0.0
    test[1, [1, 6]] = 0.5  # a tie: the argmax takes class 1, FP32's
    test[2, 3] = 0.95  # class 3 overtakes class 2; class 2 still in the top 5
    m = task.metrics(_outputs("p", ref[:4], ref[4:]), _outputs("p", test[:4], test[4:]))
    assert m.values["top1_agreement"] == 7 / 8
    assert m.values["top5_agreement"] == 1.0 and m.values["top1_ties"] == 1 / 8
    assert any("on 1 of 8 samples the quantized top score is shared" in n for n in m.notes)
    assert any(n.startswith("NOT LIKE FP32: output 'p': the top class changes on 1 of 8")
               for n in m.notes)
    # per position: [N, C, H, W] class logits (a segmentation), class axis 1
    seg = np.zeros((2, 3, 2, 2), np.float32)
    seg[:, 1] = 1.0
    moved = seg.copy()
    moved[0, 2, 0, 0] = 2.0
    s = task.metrics(_outputs("p", seg), _outputs("p", moved))
    assert s.values["top1_agreement"] == 7 / 8 and "top5_agreement" not in s.values
    assert any("FP32 picks class 1 on every position" in n and "says little" in n
               for n in s.notes)


def test_softmax_output_is_read_as_classes_logits_when_declared():
    model, data, stats = _setup(softmax_classifier, "softmax_classifier", n=64)
    task, notes = layout_tasks(model, (), "x.npz")
    assert task.headline == "top1_agreement"
    assert notes == ("output 'probs' read as class scores (top-1 over 12 classes on axis 1) "
                     "(a Softmax over the classes); --layout probs=tensor for plain fidelity",)
    assert layout_tasks(model, (parse_layout("probs=tensor"),), "x.npz") == (None, ())
    res = stages.evaluate_plan(model, dataclasses.replace(data, task=task), stats,
                               Plan.uniform(Precision.A8_W8))
    top1 = res["metrics"]["top1_agreement"]
    assert 0.9 < top1 < 1.0  # random data: 2 of 64 samples change class at a8_w8
    assert res["metrics"]["top5_agreement"] == 1.0
    # logits have no Softmax to find: plain fidelity unless declared
    logits = load_proto(softmax_classifier(logits=True), "logits")
    assert layout_tasks(logits, (), "x.npz") == (None, ())
    task, notes = layout_tasks(logits, (parse_layout("logits=class"),), "x.npz")
    assert task.output == "logits" and notes[0].endswith("(--layout)")
    # one value per sample has no classes
    vad = load_proto(scalar_probability(), "vad")
    try:
        layout_tasks(vad, (parse_layout("speech=class"),), "x.npz")
    except LayoutError as e:
        assert "no class axis of 2 or more classes" in str(e) and "use kind score" in str(e)
    else:
        raise AssertionError("a [N] output was read as classes")


def test_run_judges_a_classifier_by_top1_and_warns_when_fp32_picks_one_class(tmp_path, capsys):
    import onnx

    onnx.save(softmax_classifier(), tmp_path / "cls.onnx")
    x = feeds("softmax_classifier", 32)["image"]
    np.savez(tmp_path / "one.npz", image=0.01 * x + 3.0)  # every image alike: one class
    assert main(["run", str(tmp_path / "cls.onnx"), "--data", str(tmp_path / "one.npz"),
                 "--target", "hailo8", "--repairs", "none", "--goal", "0.9",
                 "--out", str(tmp_path / "W")]) == 0
    out = capsys.readouterr().out
    v = read_json(tmp_path / "W" / "verdict.json", "verdict")
    assert v["metric"] == "top1_agreement" and v["reached"] is True
    assert v["says_little"] and "FP32 picks class" in v["says_little"][0]
    assert "  warning: output 'probs': FP32 picks class" in out
    assert "the top-1 agreement says little" in out


def test_a_data_file_that_is_not_numpy_is_said_to_be_so(tmp_path, capsys):
    """A text file named .npz was reported as 'pickled (object) data' (np.load's pickle
    fallback): the line must say it is no NumPy file, write nothing, exit 2."""
    import onnx

    onnx.save(softmax_classifier(), tmp_path / "cls.onnx")
    (tmp_path / "x.npz").write_text("image,label\n0.1,3\n")
    assert main(["run", str(tmp_path / "cls.onnx"), "--data", str(tmp_path / "x.npz"),
                 "--target", "hailo8", "--out", str(tmp_path / "W")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"quantscope: error: data file '{tmp_path / 'x.npz'}' is not a NumPy file "
                   "(it starts with b'image,', not an .npz or .npy header): save the arrays "
                   "with numpy (np.savez / np.save)")
    assert not (tmp_path / "W").exists() and "pickle" not in err
