"""glibc's thresholds as the commands set them (quantscope.emulate.release.tune_malloc):
a large block made and freed again is served from the heap, not page-faulted in afresh."""

import os
import subprocess
import sys

import pytest

CHILD = """
import json, resource, sys
import numpy as np
from onnx import numpy_helper
from quantscope.emulate.release import tune_malloc
tuned = tune_malloc()
t = numpy_helper.from_array(np.ones((10, 1024, 1024), np.float32), "w")  # 40 MiB
t.SerializeToString()  # a model's bytes for a session, as make_session asks them
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    b = t.SerializeToString()
    del b
print(json.dumps([tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0]))
"""


def _child(**env: str) -> tuple[bool, int]:
    import json

    clean = {k: v for k, v in os.environ.items()
             if k not in ("QUANTSCOPE_MALLOC", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    got = subprocess.run([sys.executable, "-c", CHILD], env={**clean, **env}, check=True,
                         capture_output=True, text=True).stdout
    tuned, faults = json.loads(got.strip().splitlines()[-1])
    return tuned, faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_freed_large_block_is_reused_not_faulted_in_again():
    tuned, faults = _child()
    plain, plain_faults = _child(QUANTSCOPE_MALLOC="default")
    assert tuned and not plain
    # glibc's own: each 40 MiB copy mmapped and unmapped (10,240 pages a copy)
    assert plain_faults > 5 * 10_000
    assert faults < plain_faults / 20


def test_glibcs_own_setting_is_left_as_given():
    tuned, _ = _child(MALLOC_MMAP_THRESHOLD_="131072")
    assert not tuned
