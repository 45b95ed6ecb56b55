"""``run`` on face data holds out people (h55).

``run EMBEDDER --data faces`` chose, calibrated and repaired the plan on the 243 chips and
then judged it on the very same chips: its verdict said "decision_agreement 99.7 % (n=243
fit samples, NOT held out, 6183 decisions)", an in-sample figure. Face data is now split
by person without ``--eval-data`` (no person in both halves, each half with its own
genuine and impostor pairs; ``tasks.face_split``); a folder too small to split (2 people)
is evaluated on the fit data and the run says why; ``--eval-data`` is unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from PIL import Image
from test_h40_tfjs_human import _nhwc_embedder

from quantscope.cli import main
from quantscope.model.load import load_proto
from quantscope.pipeline.data import open_fit_data, open_run_data
from quantscope.tasks.face_split import MIN_GENUINE, split_people, take_chips
from quantscope.tasks.faces import FACE_STYLES, load_builtin_faces, verification_pairs
from quantscope.tasks.registry import open_task_data


def _embedder(tmp_path: Path) -> Path:
    path = tmp_path / "emb.onnx"
    onnx.save(_nhwc_embedder(0.0), path)
    return path


def _people(folder: Path, who: tuple[int, ...]) -> Path:
    """The built-in ArcFace set's ``orig`` chips of the people ``who``, a folder per person
    (dlib aligns them again when read)."""
    faces = load_builtin_faces(FACE_STYLES["arcface"])
    for i in np.flatnonzero(faces.variant == "orig"):
        if int(faces.identity[i]) in who:
            d = folder / f"person{int(faces.identity[i]):02d}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(faces.chips[i]).save(d / f"{faces.photo_names[faces.photo[i]]}.png")
    return folder


def _run(model: Path, data: str, out: Path, *extra: str) -> None:
    assert main(["run", str(model), "--data", data, "--target", "hailo8l", "--out", str(out),
                 *extra]) == 0


def test_run_on_faces_evaluates_on_people_the_fit_half_does_not_contain(tmp_path, capsys):
    model = _embedder(tmp_path)
    out = tmp_path / "W"
    _run(model, "faces", out)
    first = capsys.readouterr().out.splitlines()[0]
    ev = json.loads((out / "evaluate.json").read_text())["data"]
    fit, held = ev["fit"], ev["held_out"]
    n = held["evaluation_samples"]
    assert f"(n={n} held-out samples," in first and "NOT held out" not in first, first
    assert fit["calibration_samples"] + n == 243 and 100 < n < 143
    assert ev["is_held_out"] is True
    assert ev["split"].startswith("split by person: 12 people"), ev["split"]
    assert not set(fit["faces"]["people"]) & set(held["faces"]["people"])
    assert len(fit["faces"]["people"]) + len(held["faces"]["people"]) == 24
    assert not set(fit["faces"]["photos"]) & set(held["faces"]["photos"])
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["headline"]["held_out"] is True and verdict["headline"]["n"] == n
    assert verdict["evaluation"] == ev["split"]
    page = (out / "report.html").read_text()
    people = len(held["faces"]["people"])
    assert (f"held-out evaluation: {people} people, {n} chips, {held['faces']['pairs']} "
            "pairs") in page
    assert held["faces"]["photos"][0] in page


def test_the_halves_are_by_person_each_with_its_own_pairs(tmp_path):
    model = load_proto(_nhwc_embedder(0.0))
    rd = open_run_data(model, "faces", eval_data=None, pairs=None, tokenizer=None,
                       folder=tmp_path)
    whole = open_task_data("faces", model).task
    a, b = rd.fit.task, rd.held_out.task
    assert rd.is_held_out
    assert not set(a.identity.tolist()) & set(b.identity.tolist())
    assert len(a.identity) + len(b.identity) == 243
    # obama, obama2, obama3 (one person): all in one half, their cross-photo pairs kept
    obama = [i for i, n in enumerate(whole.photo_names) if n.startswith("obama")]
    sides = {("fit" if p in a.faces else "held") for p in obama}
    assert len(sides) == 1 and not set(obama) & set(a.faces) & set(b.faces)
    kept = a if sides == {"fit"} else b
    cross = kept.pairs.genuine & (kept.faces[kept.pairs.first] != kept.faces[kept.pairs.second])
    assert cross.sum() > 0
    # each half's pairs: those of the whole whose two chips are in it, genuine and impostor
    for t in (a, b):
        assert t.pairs.genuine.sum() >= MIN_GENUINE and (~t.pairs.genuine).sum() > 0
        assert t.pairs.first.max() < len(t.identity) and t.pairs.second.max() < len(t.identity)
        same = t.identity[t.pairs.first] == t.identity[t.pairs.second]
        assert np.array_equal(same, t.pairs.genuine)
    # the batches hold the chips of each half, in data order, as the whole set feeds them
    every = np.concatenate([x["x"] for x in open_task_data("faces", model).evaluation])
    split = split_people(whole)
    got = np.concatenate([x["x"] for x in rd.held_out.evaluation])
    assert np.array_equal(got, every[split.held])
    assert rd.fit.calibration is rd.fit.evaluation or all(
        x is y for x, y in zip(rd.fit.calibration, rd.fit.evaluation, strict=True))
    # a half's pairs are those verification_pairs builds on the half's chips alone
    faces = load_builtin_faces(FACE_STYLES["arcface"])
    sub = verification_pairs(type(faces)(faces.chips[split.fit], faces.identity[split.fit],
                                         faces.photo[split.fit], faces.variant[split.fit],
                                         faces.photo_names, ""))
    mine = take_chips(whole, split.fit).pairs
    assert len(sub) == len(mine) and np.array_equal(sub.first, mine.first)
    assert np.array_equal(sub.genuine, mine.genuine)
    # run --rewrites auto measures on the same fit half
    fit = open_fit_data(model, "faces", eval_data=None, pairs=None, tokenizer=None)
    assert np.array_equal(fit.task.identity, a.identity)


def test_a_folder_of_two_people_is_not_split_and_the_run_says_why(tmp_path, capsys):
    model = _embedder(tmp_path)
    people = _people(tmp_path / "people", (1, 17))  # 2 + 3 photos
    out = tmp_path / "W"
    _run(model, str(people), out)
    first = capsys.readouterr().out.splitlines()[0]
    assert "fit samples, NOT held out" in first, first
    split = json.loads((out / "verdict.json").read_text())["evaluation"]
    assert split.startswith(f"NOT held out: {people} is not split by person: a half would "
                            "hold 1 person and "), split
    assert "each half needs 2 people and 8 genuine pairs" in split
    assert "give --eval-data (photos of other people)" in split


def test_eval_data_still_fits_on_all_of_data(tmp_path):
    model = load_proto(_nhwc_embedder(0.0))
    people = _people(tmp_path / "people", (1, 17, 18, 19))
    rd = open_run_data(model, "faces", eval_data=str(people), pairs=None, tokenizer=None,
                       folder=tmp_path)
    assert rd.split.startswith(f"evaluation on --eval-data {people}, held out from")
    assert len(rd.fit.task.identity) == 243 and len(rd.held_out.task.identity) == 7 * 5
    assert len(rd.fit.task.pairs) == 6183


def test_a_face_run_folder_written_before_the_split_reruns_its_stages(tmp_path, capsys,
                                                                      monkeypatch):
    """A run folder whose stages were fitted on every chip (written before the split): its
    data stages are not reused, or the held-out half would have calibrated the plan."""
    from quantscope.pipeline import data as pdata
    from quantscope.pipeline.context import Context

    model = _embedder(tmp_path)
    out = tmp_path / "W"
    old_split, old_options = pdata._split_own, Context.data_options
    monkeypatch.setattr(pdata, "_split_own", lambda fit, data: pdata.RunData(
        fit, fit, f"NOT held out: {data} is not split (its task needs every sample)"))
    monkeypatch.setattr(Context, "data_options", lambda self: {
        k: v for k, v in old_options(self).items() if k != "held_out"})
    _run(model, "faces", out)
    assert "NOT held out" in capsys.readouterr().out
    monkeypatch.setattr(pdata, "_split_own", old_split)
    monkeypatch.setattr(Context, "data_options", old_options)
    _run(model, "faces", out)
    text = capsys.readouterr().out
    assert "stages run: calibrate, analyze, plan" in text, text
    assert "held-out samples" in text.splitlines()[0]
