"""A Softmax over many classes whose small classes collapse at 8 bit (PP-OCR's recognizer:
6,625 characters, most of them under 1e-6 on every step): a collapsed class that neither
FP32 nor the quantized model ever ranks first changes no decision, so it is counted apart
(``collapsed_never_top``) and does not make the output read ``NOT LIKE FP32``; a collapsed
class that wins on some sample still does. ``logits [N, C]`` -> MatMul (identity weights)
-> Softmax ``probs``: read as class scores. Real ORT sessions; the CLI through ``main``.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscope.cli import main
from quantscope.emulate.channels import ChannelFidelity, TopClasses

BIG, FILL, IDLE = 2, 270, 60  # two real classes, fillers of a flat row, small ones
W = BIG  # the small class that wins the flat rows
C = BIG + 1 + FILL + IDLE
N = 200


def softmax_model(steps: int = 0) -> onnx.ModelProto:
    """``[N, C]`` class scores, or ``[N, steps, C]`` per step (a CTC recognizer's)."""
    dims = ["N", steps, C] if steps else ["N", C]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["lg"]),
             helper.make_node("Softmax", ["lg"], ["probs"], axis=-1)]
    graph = helper.make_graph(
        nodes, "many_classes", [helper.make_tensor_value_info("x", 1, dims)],
        [helper.make_tensor_value_info("probs", 1, dims)],
        [numpy_helper.from_array(np.eye(C, dtype=np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def logits(flat_rows: int) -> np.ndarray:
    """Rows won by class 0 or 1 (every other class under 1e-3), and ``flat_rows`` rows
    where the fillers are even and class ``W`` wins by a little (its probability ~0.006:
    under two steps of the 8-bit grid of [0, 1])."""
    r = np.random.default_rng(0)
    x = np.empty((N, C), np.float32)
    x[:, :BIG] = 6.0
    x[np.arange(N), np.arange(N) % BIG] = 10.0
    x[:, BIG:] = r.uniform(-2.0, 2.0, (N, C - BIG))
    for k in range(flat_rows):
        row = x[N - 1 - k]
        row[:] = -8.0 + r.uniform(-1, 1, C)
        row[BIG + 1:BIG + 1 + FILL] = r.uniform(-0.05, 0.05, FILL)
        row[W] = 0.5
    return x


def _evaluate(tmp_path, flat_rows: int, capsys, steps: int = 0) -> tuple[dict, str]:
    onnx.save(softmax_model(steps), tmp_path / "m.onnx")
    x = logits(flat_rows)
    np.savez(tmp_path / "d.npz", x=x.reshape(-1, steps, C) if steps else x)
    args = [str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz")]
    assert main(["calibrate", *args, "--out", str(tmp_path / "stats.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "stats.npz"),
                 "--precision", "a8_w8", "--json", str(tmp_path / "ev.json"),
                 *(["--layout", "probs=ctc"] if steps else [])]) == 0
    return json.loads((tmp_path / "ev.json").read_text()), capsys.readouterr().out


def test_collapsed_classes_fp32_never_ranks_first_change_no_decision(tmp_path, capsys):
    """Before, every small class quantized to 0 counted as collapsed and the output read
    ``NOT LIKE FP32: output(s) 'probs' lose what FP32 computes`` while every top class
    agrees; they are counted apart now, with the line saying why."""
    doc, out = _evaluate(tmp_path, 0, capsys)
    probs = doc["outputs"]["probs"]
    assert doc["metrics"]["top1_agreement"] == 1.0
    assert probs["collapsed_channels"] == 0
    assert probs["collapsed_never_top"] == C - BIG
    assert doc["metrics"]["collapsed_never_top"] == probs["collapsed_never_top"]
    assert "NOT LIKE FP32" not in out
    (line,) = [n for n in doc["notes"] if "collapsed classes that FP32 never ranks first" in n]
    assert line.startswith(f"output 'probs': {probs['collapsed_never_top']} collapsed classes "
                           "that FP32 never ranks first on this data: they change no decision")


def test_a_collapsed_class_that_wins_somewhere_still_reads_not_like(tmp_path, capsys):
    """Class ``W`` is FP32's top on one row (at ~0.006) and under 1e-3 elsewhere: it
    collapses and it decides something, so the output still reads NOT LIKE FP32."""
    doc, out = _evaluate(tmp_path, 1, capsys)
    probs = doc["outputs"]["probs"]
    assert probs["collapsed_channels"] == 1
    assert "NOT LIKE FP32" in out
    (line,) = [n for n in doc["notes"] if "channels collapse" in n]
    assert line.startswith(f"output 'probs' channel {W} of axis 1:")
    assert ("FP32 ranks it first on 1 of its 200 values (samples, positions), the quantized "
            "model on 1 of them and 0 others") in line
    assert probs["collapsed_never_top"] >= 1  # the fillers and the small ones


def test_ctc_steps_collapsed_classes_no_step_ranks_first_change_no_decision(tmp_path, capsys):
    """The same scores as 20 lines of 10 CTC steps (``--layout probs=ctc``, class 0 the
    blank): the classes no step ranks first are counted apart on the class axis 2."""
    doc, out = _evaluate(tmp_path, 0, capsys, steps=10)
    probs = doc["outputs"]["probs"]
    assert doc["metrics"]["string_agreement"] == 1.0 and probs["channel_axis"] == 2
    assert probs["collapsed_channels"] == 0 and probs["collapsed_never_top"] == C - BIG
    assert "NOT LIKE FP32" not in out
    (entry,) = [n for n in doc["notes"] if "never ranks first" in n]
    assert "of 333 channels of axis 2" in entry


def _fidelity(ref: np.ndarray, test: np.ndarray, top: TopClasses | None):
    f = ChannelFidelity(1, top)
    f.add(ref, test)
    return f.table(), f.notes("probs")


def _ranked_rows(classes: int = 12) -> np.ndarray:
    """FP32 rows won by class 0 or 1; classes 2.. small and varied."""
    r = np.random.default_rng(3)
    ref = r.uniform(1e-5, 1e-3, (200, classes))
    ref[np.arange(200), np.arange(200) % 2] = 0.9
    return ref


def test_a_class_that_wins_only_when_quantized_still_reads_not_like():
    """Class 5 is never FP32's top, but the quantized model ranks it first on one row
    (where it collapsed to a high value): it decides something, so it is judged."""
    ref = _ranked_rows()
    test = np.where(ref > 0.5, ref, 0.0)
    (entry, bad), _ = _fidelity(ref, test, TopClasses(1))
    assert not bad and entry["collapsed_channels"] == 0 and entry["collapsed_never_top"] == 10
    test[:, 5] = 0.0
    test[7, 5] = 0.95  # the quantized model picks class 5 on row 7
    (entry, bad), notes = _fidelity(ref, test, TopClasses(1))
    assert bad and entry["collapsed_channels"] == 1 and entry["collapsed_never_top"] == 9
    assert "the quantized model ranks it first on 1 of its 200 values (samples, positions), FP32 never" in notes[0]


def test_without_a_top_class_task_every_collapse_is_judged():
    """A detector's class rows (no TopClasses) and data where FP32 ranks one class first
    on every row keep judging every collapsed class."""
    ref = _ranked_rows()
    test = np.where(ref > 0.5, ref, 0.0)
    (entry, bad), _ = _fidelity(ref, test, None)
    assert bad and entry["collapsed_channels"] == 10 and "collapsed_never_top" not in entry
    ref[:, 0], ref[:, 1] = 0.9, 0.05  # class 0 everywhere
    (entry, bad), _ = _fidelity(ref, np.where(ref > 0.5, ref, 0.0), TopClasses(1))
    assert bad and "collapsed_never_top" not in entry


def test_a_pitch_bin_within_reach_of_the_top_one_is_judged():
    """The host averages the bins within ``reach`` of the top one on a voiced frame: a
    collapsed bin next to a voiced frame's top bin decides the pitch, one far from every
    top bin, or near only unvoiced frames' top bins, does not."""
    ref = _ranked_rows()
    test = np.where(ref > 0.5, ref, 0.0)
    (entry, bad), notes = _fidelity(ref, test, TopClasses(-1, 0, 4))
    assert bad and entry["collapsed_channels"] == 4 and entry["collapsed_never_top"] == 6
    assert "it lies within 4 bins of a top one" in notes[0]
    (entry, bad), notes = _fidelity(ref, test, TopClasses(-1, 0, 4, 0.21))
    assert bad and "it lies within 4 bins of a top one whose value reaches 0.21" in notes[0]
    # frames whose top bin is under the voicing threshold have no pitch: only the top bin
    # (the voicing) is read there, so the bins near it decide nothing
    (entry, bad), notes = _fidelity(ref, test, TopClasses(-1, 0, 4, 0.95))
    assert not bad and entry["collapsed_channels"] == 0 and entry["collapsed_never_top"] == 10
    assert "(the bins the host averages where the top value reaches 0.95)" in notes[0]


def test_a_never_top_class_of_low_cosine_judges_nothing():
    """CREPE tiny at a8_w8: a bin FP32 never raises above 0.002 reads a cosine of 0.54 on
    the grid (two steps, not one value: no collapse) and made the output NOT LIKE FP32
    while every pitch agreed; a bin far from every top one decides nothing, said so."""
    ref = _ranked_rows()
    test = ref.copy()
    test[:, 9] = np.where(np.arange(200) % 3 == 0, 2e-3, 0.0)  # neither 1 value nor close
    (entry, bad), _ = _fidelity(ref, test, None)
    assert bad and entry["collapsed_channels"] == 0
    (entry, bad), notes = _fidelity(ref, test, TopClasses(-1, 0, 4))
    assert not bad and entry["collapsed_channels"] == 0 and entry["collapsed_never_top"] == 0
    assert notes == ["output 'probs': 1 classes of a cosine to FP32 under 0.9 that FP32 never "
                     "ranks first on this data: they change no decision (of 12 channels of "
                     "axis 1, FP32 |x| at most 0.0009957; neither FP32 nor the quantized model "
                     "ranks any of them first on a sample or position nor within 4 bins of one "
                     "that is (the bins the host averages), and FP32 ranks 2 classes first): "
                     "not judged; a class that wins on other data can lose there "
                     "(sqnr_db_channel_min and cosine_channel_min still include them)"]
