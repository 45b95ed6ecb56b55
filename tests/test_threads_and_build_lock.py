"""Two quantscope processes on one machine: ``$QUANTSCOPE_THREADS`` sizes every compute pool,
and a built-in model is built by one process while the others wait (zoo.cache.build_lock)."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from quantscope.emulate.session import make_session
from quantscope.threads import THREADS_ENV, default_threads
from quantscope.types import QuantscopeError

CALLS: list[float] = []


def _tiny() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_variable_sets_the_sessions_threads_and_a_bad_value_is_one_line(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert default_threads() == 0
    monkeypatch.setenv(THREADS_ENV, "3")
    assert default_threads() == 3
    sess = make_session(_tiny())
    assert sess.get_session_options().intra_op_num_threads == 3
    assert make_session(_tiny(), threads=2).get_session_options().intra_op_num_threads == 2
    out = sess.run(None, {"x": np.array([[-1, 0, 2, -3]], np.float32)})[0]
    assert out.tolist() == [[0, 0, 2, 0]]
    for bad in ("two", "-1", "1.5"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(QuantscopeError, match=f"{THREADS_ENV}=.*whole number"):
            default_threads()


def test_a_bad_thread_count_is_one_line_before_any_work(monkeypatch, tmp_path, capsys):
    from quantscope.cli import main

    model = tmp_path / "m.onnx"
    onnx.save(_tiny(), model)
    monkeypatch.setenv(THREADS_ENV, "many")
    out = tmp_path / "W"
    assert main(["run", str(model), "--data", "stdlib-docs", "--target", "ort-cpu",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"quantscope: error: {THREADS_ENV}='many' is not a thread count: set it to a whole "
        "number (0 or unset: one thread per core)"]
    assert not out.exists()


def slow_builder(folder: Path) -> Path:
    """A stand-in builder: takes its time, then writes the file (the test's registry entry)."""
    CALLS.append(time.perf_counter())
    time.sleep(0.5)
    dest = Path(folder) / "lockdemo.onnx"
    onnx.save(_tiny(), str(dest))
    return dest


def test_two_callers_build_a_builtin_model_once(monkeypatch, tmp_path, capsys):
    import quantscope.zoo as zoo

    monkeypatch.setenv("QUANTSCOPE_CACHE", str(tmp_path))
    spec = dataclasses.replace(zoo.BUILTIN_MODELS["minilm-l3"], builder=f"{__name__}:slow_builder",
                               filename="lockdemo.onnx", requires=())
    monkeypatch.setitem(zoo.BUILTIN_MODELS, "lockdemo", spec)
    CALLS.clear()
    got: list[Path] = []
    workers = [threading.Thread(target=lambda: got.append(zoo.resolve_model("lockdemo")))
               for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert len(CALLS) == 1, "the second caller built the model again"
    assert got == [tmp_path / "lockdemo.onnx"] * 2
    err = capsys.readouterr().err
    assert err.count("building built-in model 'lockdemo'") == 1
    assert "another process is building lockdemo.onnx; waiting for it" in err
    assert onnx.load(str(got[0])).graph.node[0].op_type == "Relu"
