"""A CTC output's decision is the decoded string, not each step's top class: a collapsed
class that wins steps, but whose step changes (the steps where it is FP32's top or the
plan's, and the two differ) change no decoded string, decides nothing on this data. It is
counted apart (``collapsed_strings_kept``) and said, not read ``NOT LIKE FP32``; one whose
step changes change a string is still judged. "Changes no string" is measured both ways
on every sample where the class's step changes: FP32's steps with only that class's
changes applied decode FP32's string, and the plan's steps with only them undone decode
the plan's (PP-OCRv4's class 4545 wins one more step in the plan, next to its own: a
repeat, merged; that line's string changes by a space elsewhere).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from test_never_top_classes import C, W, logits, softmax_model

from quantscope.cli import main
from quantscope.emulate.channels import ChannelFidelity, TopClasses
from quantscope.tasks.ctc import CtcTask

STEPS = 10
F = 100  # a filler that FP32 ranks first on one flat step


def _evaluate(tmp_path, x: np.ndarray, capsys) -> tuple[dict, str]:
    onnx.save(softmax_model(STEPS), tmp_path / "m.onnx")
    np.savez(tmp_path / "d.npz", x=x.reshape(-1, STEPS, C))
    args = [str(tmp_path / "m.onnx"), "--data", str(tmp_path / "d.npz")]
    assert main(["calibrate", *args, "--out", str(tmp_path / "stats.npz")]) == 0
    assert main(["evaluate", *args, "--stats", str(tmp_path / "stats.npz"),
                 "--precision", "a8_w8", "--json", str(tmp_path / "ev.json"),
                 "--layout", "probs=ctc"]) == 0
    return json.loads((tmp_path / "ev.json").read_text()), capsys.readouterr().out


def test_a_collapsed_class_whose_steps_keep_every_string_is_counted_apart(tmp_path, capsys):
    """Class ``W`` wins one flat step (at ~0.006, under two steps of the grid) in FP32 and
    in the plan alike, and collapses to 0 everywhere else: it wins a step, so the per-step
    rule judged it and the output read NOT LIKE FP32 while every string agrees."""
    doc, out = _evaluate(tmp_path, logits(1), capsys)
    probs = doc["outputs"]["probs"]
    assert doc["metrics"]["string_agreement"] == 1.0
    assert probs["collapsed_channels"] == 0 and probs["collapsed_strings_kept"] == 1
    assert doc["metrics"]["collapsed_strings_kept"] == 1
    assert probs["collapsed_never_top"] == C - 3  # the two big classes and W win steps
    assert "NOT LIKE FP32" not in out
    (line,) = [n for n in doc["notes"] if "change no decoded string" in n]
    assert line.startswith("output 'probs': 1 collapsed classes win steps but change no "
                           "decoded string on this data")
    assert "counted apart (collapsed_strings_kept)" in line


def test_a_collapsed_class_whose_step_changes_a_string_still_reads_not_like(tmp_path, capsys):
    """On the flat step a filler ``F`` edges ``W`` out in FP32 (0.0063 against 0.0060);
    on the grid they are equal and the argmax takes ``W``: one string of 20 changes (95 %,
    which the string agreement alone lets pass), and ``W``, whose step change alone makes
    it, is judged."""
    x = logits(1)
    x[-1, F] = 0.55
    doc, out = _evaluate(tmp_path, x, capsys)
    probs = doc["outputs"]["probs"]
    assert doc["metrics"]["string_agreement"] == 0.95
    assert probs["collapsed_channels"] >= 1 and "NOT LIKE FP32" in out
    (line,) = [n for n in doc["notes"] if "channels collapse" in n]
    assert line.startswith(f"output 'probs' channel {W} of axis 2:")
    assert ("the quantized model ranks it first on 1 of its 200 values (samples, positions), "
            "FP32 never; its step changes change the decoded string of 1 of 20 samples") in line


BLANK, A, B, K = 0, 1, 2, 5  # K: the small class that collapses


def _steps(n: int = 40, t: int = 10, classes: int = 12) -> np.ndarray:
    """``[n, t, classes]`` steps: blank, A and B win, every other class small and varied."""
    r = np.random.default_rng(5)
    ref = r.uniform(1e-5, 1e-3, (n, t, classes))
    tops = np.tile([A, BLANK, B, BLANK, BLANK, A, A, BLANK, B, BLANK], (n, 1))[:, :t]
    np.put_along_axis(ref, tops[..., None], 0.9, axis=-1)
    return ref


def _judge(ref: np.ndarray, test: np.ndarray, top: TopClasses) -> tuple[dict, bool, list[str]]:
    f = ChannelFidelity(2, top)
    f.add(ref, test)
    entry, bad = f.table()
    return entry, bad, f.notes("probs")


def _ctc(blank: int = 0) -> TopClasses:
    return CtcTask(name="ctc", output="probs", blank=blank).top_classes()["probs"]


def _collapsed_k(ref: np.ndarray) -> np.ndarray:
    """The plan: every small class erased to 0, the tops kept."""
    return np.where(ref > 0.5, ref, 0.0)


def test_a_class_losing_a_step_next_to_its_own_changes_no_string():
    """FP32 reads sample 0 as ``A _ B _ _ A K K B _`` (K wins steps 6 and 7); the plan
    keeps K on step 6 (0.95 -> 0.3) and gives step 7 to the blank: ``K K`` -> ``K _``, one
    K either way, every string FP32's: counted apart, where the per-step rule judged it."""
    ref = _steps()
    ref[0, 6, K] = ref[0, 7, K] = 0.95
    test = _collapsed_k(ref)
    test[0, 6, K], test[0, 6, A], test[0, 7, K] = 0.3, 0.2, 0.0
    entry, bad, notes = _judge(ref, test, _ctc())
    assert not bad and entry["collapsed_channels"] == 0 and entry["collapsed_strings_kept"] == 1
    assert notes[0].startswith("output 'probs': 1 collapsed classes win steps but change no "
                               "decoded string on this data")
    # per step (no strings given), the same class is judged
    entry, bad, _ = _judge(ref, test, TopClasses(-1))
    assert bad and entry["collapsed_channels"] == 1 and entry.get("collapsed_strings_kept", 0) == 0
    # the plan loses both steps: A K K -> A A _ reads "A" for FP32's "A K": judged
    test[0, 6, K] = 0.0
    entry, bad, notes = _judge(ref, test, _ctc())
    assert bad and entry["collapsed_channels"] == 1 and entry.get("collapsed_strings_kept", 0) == 0
    assert "its step changes change the decoded string of 1 of 40 samples" in notes[0]


def test_a_class_filling_a_blank_between_its_own_steps_is_judged():
    """FP32 reads ``K _ K`` as two K's: a plan that fills the blank with K (``K K K``, one
    K) changes the string, though it keeps K's own two picks: judged. Filling the blank
    after a single K (``K _ _`` -> ``K K _``) changes nothing: counted apart."""
    ref = _steps()
    ref[0, 2:5] = 1e-4
    ref[0, 2, K], ref[0, 3, BLANK], ref[0, 3, K], ref[0, 4, K] = 0.95, 0.9, 0.3, 0.95
    test = _collapsed_k(ref)
    test[0, 2, K], test[0, 4, K], test[0, 3, K] = 0.4, 0.4, 0.95
    entry, bad, notes = _judge(ref, test, _ctc())
    assert bad and entry["collapsed_channels"] == 1
    assert "its step changes change the decoded string of 1 of 40 samples" in notes[0]
    ref[0, 4, K], ref[0, 4, BLANK] = 1e-4, 0.9  # FP32: K _ _ ; the plan K K _
    test = _collapsed_k(ref)
    test[0, 2, K], test[0, 3, K] = 0.4, 0.95
    entry, bad, _ = _judge(ref, test, _ctc())
    assert not bad and entry["collapsed_channels"] == 0 and entry["collapsed_strings_kept"] == 1


def test_strings_are_measured_both_ways():
    """FP32 ``_ _ K`` reads K; the plan ``K A _`` reads K A. K's changes (step 0 won, step 2
    lost) applied alone to FP32 read K still, but undone alone from the plan read A K, not
    the plan's K A: its move is part of the change, so K is judged (A too)."""
    ref = _steps()
    ref[0, 0:3] = 1e-4
    ref[0, 0, BLANK], ref[0, 1, BLANK], ref[0, 2, K] = 0.9, 0.9, 0.95
    test = _collapsed_k(ref)
    test[0, 0, K], test[0, 1, A], test[0, 2, K], test[0, 2, BLANK] = 0.95, 0.95, 0.0, 0.9
    entry, bad, notes = _judge(ref, test, _ctc())
    assert bad and entry["collapsed_channels"] == 1 and entry.get("collapsed_strings_kept", 0) == 0
    assert "its step changes change the decoded string of 1 of 40 samples" in notes[0]


def test_with_a_lengths_output_each_step_is_judged_alone():
    """A ``lengths`` output cuts each string where FP32 says (another output, which the
    per-class figures do not see): a string read past the cut can agree where the cut one
    does not, so the per-step rule stays (the repeat case above is judged)."""
    ref = _steps()
    ref[0, 6, K] = ref[0, 7, K] = 0.95
    test = _collapsed_k(ref)
    test[0, 6, K], test[0, 6, A], test[0, 7, K] = 0.3, 0.2, 0.0
    cut = CtcTask(name="ctc", output="probs", lengths="n").top_classes()["probs"]
    entry, bad, _ = _judge(ref, test, cut)
    assert bad and entry["collapsed_channels"] == 1 and "collapsed_strings_kept" not in entry
