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


def test_a_resumed_process_reads_the_digests_the_manifest_kept(tmp_path, monkeypatch):
    """run.json keeps each settled file's digest with its inode, size and mtime: another
    process (here: the cache emptied) hashes only what changed, and a copy (new inode)."""
    import json
    import shutil

    from quantscope.pipeline.manifest import MANIFEST, Manifest, remember_digests

    big, other = tmp_path / "model.onnx", tmp_path / "stats.npz.txt"
    big.write_bytes(b"weights" * 1000)
    other.write_bytes(b"x")
    old = time.time_ns() - 10 * manifest.SETTLED_NS
    for f in (big, other):
        os.utime(f, ns=(old, old))
    calls = []
    real = manifest._contents_digest
    monkeypatch.setattr(manifest, "_contents_digest",
                        lambda p, h: calls.append(p.name) or real(p, h))
    monkeypatch.setattr(manifest, "_SEEN", {})
    m = Manifest(tmp_path)
    m.record("calibrate", "k", ["model.onnx"], 1.0)
    want = file_digest(big)
    kept = json.loads((tmp_path / MANIFEST).read_text())["digests"]
    assert kept[str(big.resolve())][3] == want and calls == ["model.onnx"]

    monkeypatch.setattr(manifest, "_SEEN", {})  # a new process
    remember_digests(tmp_path)
    assert file_digest(big) == want and calls == ["model.onnx"]  # not hashed again
    assert Manifest(tmp_path).done("calibrate", "k") and calls == ["model.onnx"]
    other.write_bytes(b"y")  # changed since: hashed, and never from the record
    os.utime(other, ns=(old + 5, old + 5))
    file_digest(other)
    assert calls == ["model.onnx", "stats.npz.txt"]
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy2(big, copy / "model.onnx")  # same size and mtime, another inode
    monkeypatch.setattr(manifest, "_SEEN", {})
    remember_digests(tmp_path)
    assert file_digest(copy / "model.onnx") == want and calls[-1] == "model.onnx"
    assert len(calls) == 3
    # a manifest without digests (an older run) or unreadable gives nothing, no error
    (tmp_path / MANIFEST).write_text("{not json")
    remember_digests(tmp_path)
