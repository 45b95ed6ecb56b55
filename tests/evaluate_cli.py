"""``quantscope evaluate`` on a test's folder (``MODEL``, ``DATA``, ``stats.npz``) as many
test files run it: its JSON result, or its one-line refusal of a bad ``--layout`` (no
traceback, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

from quantscope.cli import main


def assert_layout_refused(capsys, folder: Path, model: str, data: str, layout: str,
                          needle: str) -> None:
    """``evaluate FOLDER/MODEL --data FOLDER/DATA --stats FOLDER/stats.npz --layout LAYOUT``
    exits non-zero with one stderr line (``quantscope: …``) holding ``--layout`` and
    ``needle``, and leaves ``folder`` as it was (its ``--json`` not written)."""
    before = sorted(p.name for p in folder.iterdir())
    code = main(["evaluate", str(folder / model), "--data", str(folder / data),
                 "--stats", str(folder / "stats.npz"), "--precision", "a8_w8",
                 "--layout", layout, "--json", str(folder / "bad.json")])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("quantscope: ") and "--layout" in lines[0], lines[0]
    assert needle in lines[0], lines[0]
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written


def evaluated(capsys, folder: Path, model: str, data: str, *extra: str) -> dict:
    """``evaluate FOLDER/MODEL`` at a8_w8 with ``extra`` options: its ``--json`` result."""
    code = main(["evaluate", str(folder / model), "--data", str(folder / data),
                 "--stats", str(folder / "stats.npz"), "--precision", "a8_w8",
                 "--json", str(folder / "r.json"), *extra])
    capsys.readouterr()
    assert code == 0
    return json.loads((folder / "r.json").read_text())


def saved_folder(folder: Path, name: str, proto, x) -> Path:
    """``folder`` holding ``NAME.onnx`` (``proto``) and ``NAME.npz`` (``input=x``)."""
    import numpy as np
    import onnx

    onnx.save(proto, folder / f"{name}.onnx")
    np.savez(folder / f"{name}.npz", input=x)
    return folder


def calibrated_folder(folder: Path, name: str, proto, x) -> Path:
    """:func:`saved_folder`, and ``stats.npz`` calibrated on it: the layout the helpers
    above read."""
    saved_folder(folder, name, proto, x)
    assert main(["calibrate", str(folder / f"{name}.onnx"), "--data",
                 str(folder / f"{name}.npz"), "--out", str(folder / "stats.npz")]) == 0
    return folder
