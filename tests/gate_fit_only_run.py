"""The one ``run`` that test_h62_no_figure.py and test_h65_output_says.py both read: the
P-Net-like model of h60 (``_pnet_like``) on 12 samples ordered by their highest FP32 face
score (the fit half first), gated at a threshold between the held-out half's highest score
and the fit half's, so the fit half has faces and the held-out half none.

Each file had made this identical run itself (``--target hailo8 --goal 0.97 --layout
boxes=points:...,where=prob:1>T``) to read its own assertions off the folder and the
console. It is made once per session here; under pytest-xdist the workers share it as
conftest's ``searched_decoder`` is shared: the first to need it makes it in their common
folder under a lock, the others read what it wrote and printed. Nothing reads it but those
two files, and neither writes into its folder.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from test_h60_points_photo_gate import _pnet_like

from quantscope.cli import main

GATE = "boxes=points:scale=12,order=channels,where=prob:1>{}"


def ordered_pnet(folder: Path, data: str) -> tuple[np.ndarray, np.ndarray]:
    """``folder/pnet.onnx`` and ``folder/DATA`` (its 12 samples ordered by their highest FP32
    face score, the fit half first): (the fit half's scores, the held-out half's)."""
    onnx.save(_pnet_like(), folder / "pnet.onnx")
    x = np.random.default_rng(3).uniform(-1, 1, (12, 3, 16, 16)).astype(np.float32)
    prob = ort.InferenceSession(str(folder / "pnet.onnx")).run(["prob"], {"input": x})[0]
    top = prob[:, 1].reshape(len(x), -1).max(axis=1)
    order = np.argsort(-top, kind="stable")
    np.savez(folder / data, input=x[order])
    return top[order][:6], top[order][6:]


def _make(folder: Path) -> tuple[Path, str]:
    """The model, the ordered data and the run in ``folder``: (the run folder, what the
    run printed on stdout)."""
    fit, held = ordered_pnet(folder, "fit_only.npz")
    t = float((held.max() + fit.max()) / 2)
    out, printed = folder / "out_fit_only", io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(folder / "pnet.onnx"), "--data", str(folder / "fit_only.npz"),
                     "--target", "hailo8", "--out", str(out), "--goal", "0.97",
                     "--layout", GATE.format(f"{t:.6f}")]) == 0
    return out, printed.getvalue()


def fit_only_run(tmp_path_factory) -> tuple[Path, str]:
    """(the run folder, its stdout), made once per session (shared by xdist's workers)."""
    from quantscope.zoo.cache import build_lock  # the built-in models' lock, reused

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = shared / "gate_fit_only.json"
    with build_lock(shared, "gate_fit_only"):
        if not done.is_file():
            folder = shared / "gate_fit_only"
            folder.mkdir(exist_ok=True)
            out, printed = _make(folder)
            done.write_text(json.dumps({"out": str(out), "printed": printed}))
    kept = json.loads(done.read_text())
    return Path(kept["out"]), kept["printed"]
