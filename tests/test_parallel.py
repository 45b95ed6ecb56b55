"""The sweep fanned out: chunks of candidates merged in candidate order give the serial
result, in process (any number of chunks) and on a local 2-CPU Ray cluster (`--ray`)."""

import json

import numpy as np
import onnx
import pytest
import tiny_models as tm

from quantscope import stages
from quantscope.analyze import sweep_fast
from quantscope.analyze.scoring import Scorer
from quantscope.cli import main
from quantscope.model.groups import find_groups
from quantscope.parallel import InProcess, chunks
from quantscope.types import Precision


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    d = tmp_path_factory.mktemp("parallel")
    onnx.save(tm.layernorm_block(), d / "m.onnx")
    np.save(d / "x.npy", np.random.default_rng(0).normal(0, 1, (64, 5, 24)).astype(np.float32))
    assert main(["calibrate", str(d / "m.onnx"), "--data", str(d / "x.npy"),
                 "--out", str(d / "s.npz")]) == 0
    return d


@pytest.fixture(scope="module")
def cluster():
    """One local 2-CPU Ray cluster for the module's Ray tests (each started and stopped its
    own: ~5 s each), stopped after the last."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'quantscope[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def analysis(ws, tmp_path_factory):
    """The serial analysis the plan tests read (made once)."""
    a = tmp_path_factory.mktemp("analysis") / "a.json"
    assert main(["analyze", str(ws / "m.onnx"), "--data", str(ws / "x.npy"), "--stats",
                 str(ws / "s.npz"), "--out", str(a)]) == 0
    return a


def test_chunks_cover_in_order():
    assert chunks(7, 3) == [range(0, 2), range(2, 5), range(5, 7)]
    assert chunks(2, 5) == [range(0, 1), range(1, 2)]
    assert chunks(5, 1) == [range(0, 5)]


@pytest.mark.parametrize("workers", [2, 3, 50])
def test_chunked_sweep_equals_serial(ws, workers):
    model = stages.open_model(ws / "m.onnx")
    data = stages.open_data(ws / "x.npy", model)
    from quantscope.serde import read_stats

    stats = read_stats(ws / "s.npz")
    groups, batches = find_groups(model), list(data.evaluation)
    kw = {"scorer": Scorer(), "low": Precision.A8_W8, "high": Precision.A16_W16,
          "fraction": 0.5}
    serial = sweep_fast(model, groups, stats, batches, **kw)
    split = sweep_fast(model, groups, stats, batches, executor=InProcess(workers), **kw)
    assert [(c.sweep, c.group) for c in split.candidates] == [
        (c.sweep, c.group) for c in serial.candidates]
    assert len(serial.candidates) >= 4
    for a, b in zip(serial.rows, split.rows, strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(serial.ref_rows, split.ref_rows)
    assert np.array_equal(serial.low_rows, split.low_rows)
    assert serial.noise_cumulative == split.noise_cumulative
    assert list(serial.noise_isolated.items()) == list(split.noise_isolated.items())


def _ranking(path):
    a = json.loads(path.read_text())
    a.pop("method")  # wall times differ
    return a


def test_analyze_on_a_local_ray_cluster_ranks_as_without(ws, analysis, cluster, tmp_path):
    base = ["analyze", str(ws / "m.onnx"), "--data", str(ws / "x.npy"),
            "--stats", str(ws / "s.npz")]
    assert main([*base, "--ray", "--out", str(tmp_path / "ray.json")]) == 0
    assert cluster.is_initialized()  # --ray joined the cluster the test started, left it up
    serial, on_ray = _ranking(analysis), _ranking(tmp_path / "ray.json")
    assert [o["group"] for o in on_ray["offenders"]] == [o["group"] for o in serial["offenders"]]
    assert on_ray == serial  # every figure, not only the order


def test_plan_measures_on_a_local_ray_cluster_as_without(ws, analysis, cluster, tmp_path,
                                                         capsys):
    """plan --ray: the best-predicted plans are measured as parallel tasks; the front, the
    measured values and the chosen plan are the serial run's."""
    m, x, s = ws / "m.onnx", ws / "x.npy", ws / "s.npz"
    base = ["plan", str(m), "--analysis", str(analysis), "--target", "ort-cpu", "--max-cost",
            "1.3", "--data", str(x), "--stats", str(s)]
    assert main([*base, "--out", str(tmp_path / "serial.json")]) == 0
    assert "parallel tasks" not in capsys.readouterr().err
    assert main([*base, "--ray", "--out", str(tmp_path / "ray.json")]) == 0
    said = capsys.readouterr()
    assert "as 2-way parallel tasks" in said.err + said.out
    serial = json.loads((tmp_path / "serial.json").read_text())
    on_ray = json.loads((tmp_path / "ray.json").read_text())
    measured = [t["measured"] for t in serial["pareto"]["trials"]]
    assert len(measured) >= 2 and all(v is not None for v in measured)
    assert on_ray == serial


def test_plan_on_ray_with_a_profile_file_measures_as_without(ws, analysis, cluster, tmp_path,
                                                             capsys):
    """plan --ray --target ./my.toml: a task on a worker looked the plan's target up by name
    among the built-ins (the worker never loaded the file) and the plan stopped at its
    first measurement with "unknown target 'my_cpu'"; the workers now get the profiles the
    command loaded, and measure what the serial run measures."""
    from pathlib import Path

    builtin = Path(__file__).parents[1] / "src/quantscope/targets/ort_cpu.toml"
    mine = tmp_path / "my.toml"
    mine.write_text(builtin.read_text().replace('name = "ort_cpu"', 'name = "my_cpu"', 1))
    m, x, s = ws / "m.onnx", ws / "x.npy", ws / "s.npz"
    base = ["plan", str(m), "--analysis", str(analysis), "--target", str(mine), "--max-cost",
            "1.3", "--data", str(x), "--stats", str(s)]
    assert main([*base, "--out", str(tmp_path / "serial.json")]) == 0
    code = main([*base, "--ray", "--out", str(tmp_path / "ray.json")])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "as 2-way parallel tasks" in said.err + said.out
    serial = json.loads((tmp_path / "serial.json").read_text())
    on_ray = json.loads((tmp_path / "ray.json").read_text())
    assert serial["target"] == "my_cpu"
    assert on_ray == serial
