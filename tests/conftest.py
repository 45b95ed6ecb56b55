import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers (pytest-xdist): one compute thread each, so that the two
    # do not oversubscribe CI's two cores (quantscope.threads; OMP for PyTorch's pool).
    os.environ.setdefault("QUANTSCOPE_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config) -> None:
    """glibc's thresholds as every command sets them (quantscope.emulate.release), also for
    the tests that call the stages without the command line."""
    from quantscope.emulate.release import tune_malloc

    tune_malloc()
    _freeze_imports()


# the libraries a test worker ends up importing (PyTorch alone ~140k objects, with sympy and
# transformers ~270k of a worker's ~330k): a full garbage collection walks them all, 250-340
# ms each, and the stages collect between steps (emulate/release.py), 100 s of the suite's
# CPU time. Imported first and frozen (gc.freeze: out of every later collection; they live
# as long as the worker does), a collection walks what the tests made. Also ONNX Runtime's
# symbolic shape inference (loaded on first use by quantscope.model.symbolic: sympy and
# mpmath, ~15k functions) and hypothesis (imported by test modules): left unfrozen they
# were 33k of the 52k objects a worker's collections walked after twelve test files.
HEAVY_IMPORTS = ("torch", "transformers", "matplotlib.pyplot", "hypothesis",
                 "hypothesis.strategies")


def _freeze_imports() -> None:
    import gc
    import importlib
    import pkgutil

    import quantscope

    names = [m.name for m in pkgutil.walk_packages(quantscope.__path__, "quantscope.")
             if not m.name.endswith("__main__")]
    for name in [*names, *HEAVY_IMPORTS]:
        try:
            importlib.import_module(name)
        except Exception:  # an optional extra not installed: its tests skip
            pass
    from quantscope.model.symbolic import _symbolic_shape_infer

    _symbolic_shape_infer()
    gc.collect()
    gc.freeze()


def pytest_report_header(config) -> str:
    """Free disk at the start: the real-model tests write about 2 GB (mpnet-base alone 840 MB)."""
    import shutil
    import tempfile

    free = shutil.disk_usage(tempfile.gettempdir()).free / 2**30
    line = f"free disk under {tempfile.gettempdir()}: {free:.1f} GiB"
    if free < 3:
        line += " (under 3 GiB: the real-model tests may fail with 'No space left on device')"
    return line


@pytest.fixture(autouse=True)
def _fresh_user_targets(monkeypatch):
    """Each test starts in a process that knows no profile file by name, as each command
    does (``quantscope.targets`` records the files it loaded, for the run's later stages)."""
    from quantscope import targets

    monkeypatch.setattr(targets, "_USER_TARGETS", {}, raising=False)


@pytest.fixture(scope="session")
def searched_decoder(tmp_path_factory):
    """``run <tiny decoder> --rewrites search`` once for the session (decoder_tiny.searched_run):
    read by the search's tests and the report's browser test. Under pytest-xdist the workers
    share one run: the first to need it makes it in their common folder under a lock, the
    others wait for it and read what it printed."""
    from decoder_tiny import searched_run

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return searched_run(tmp_path_factory.mktemp("decsearch"))
    from quantscope.zoo.cache import build_lock  # the built-in models' lock, reused

    shared = tmp_path_factory.getbasetemp().parent  # the workers' common folder
    done = shared / "decsearch.json"
    with build_lock(shared, "decsearch"):
        if not done.is_file():
            folder = shared / "decsearch"
            folder.mkdir(exist_ok=True)
            out, printed, args = searched_run(folder)
            done.write_text(json.dumps({"out": str(out), "printed": printed, "args": args}))
    kept = json.loads(done.read_text())
    return Path(kept["out"]), kept["printed"], kept["args"]


def pytest_collection_modifyitems(config, items) -> None:
    """The test files with real-model tests (marked ``slow``) first, in their usual order,
    then the others: `make test`'s two workers take whole files in this order, so the long
    files start early and the short ones fill the end (neither worker is left alone with a
    long file at the end)."""
    heavy = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in heavy)  # stable: a file's tests stay together
