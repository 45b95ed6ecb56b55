"""The run manifest's digests: computed once per process for a settled file, never stale."""

import os
import time

from quantscope.pipeline import manifest
from quantscope.pipeline.manifest import file_digest


def test_a_settled_file_is_hashed_once_and_a_change_in_place_is_seen(tmp_path, monkeypatch):
    f = tmp_path / "a.json"
    f.write_bytes(b"0123")
    calls = []
    real = manifest._contents_digest
    monkeypatch.setattr(manifest, "_contents_digest",
                        lambda p, h: calls.append(p) or real(p, h))
    first = file_digest(f)
    # fresh (modified within SETTLED_NS): hashed every time, so a same-size edit within
    # the clock's granularity is still seen
    f.write_bytes(b"0124")
    assert file_digest(f) != first and len(calls) == 2
    old = time.time_ns() - 10 * manifest.SETTLED_NS
    os.utime(f, ns=(old, old))
    d = file_digest(f)
    assert file_digest(f) == d and len(calls) == 3  # settled: hashed once
    f.write_bytes(b"0125")  # a change in place moves the mtime: hashed again
    assert file_digest(f) != d and len(calls) == 4
