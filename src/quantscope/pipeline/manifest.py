"""The run folder's manifest ``run.json``: which stages finished, on which inputs.

A stage is *done* when the manifest holds an entry for it whose ``key`` (a hash of the
stage's options and of the digests of every file it reads) equals the key computed now,
and every file it wrote still has the digest recorded. The manifest is rewritten
atomically after each stage, so a run killed in the middle of a stage (SIGINT, SIGKILL)
has no entry for it and reruns exactly that stage; the stage's own files are written
atomically too, so no half-written file is ever read back.

A stage being run is ``started`` in ``run.json`` (its name, when, the process id, and the
memory estimate the stage said, as soon as it says it): written before its work, cleared
when it is recorded, marked ``ended`` with the reason when Python sees it end (Ctrl-C, an
error). A rerun that finds one left there says so in one line (:func:`unfinished_line`:
a process killed without a word, SIGKILL as the kernel's out-of-memory killer sends, with
the estimate and the options that lower it) and keeps it under ``unfinished`` (the
verdict's ``resumed_after``), then resumes.

Digests are of *contents*: an ``.npz`` is hashed array by array (the zip container stores
write times), every other file byte by byte. A file's digest is kept with its inode, size,
modification and change times (``digests`` in ``run.json``, for every settled file the run
hashed: the given model, the data, the rewritten model, the stages' files), so a resumed
run hashes only the files that changed since (:func:`remember_digests`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx

from quantscope.progress import MEMORY_FIX, keeping_estimates
from quantscope.serde import write_json
from quantscope.types import QuantscopeError

T = TypeVar("T")
FORMAT = "quantscope.run/1"
MANIFEST = "run.json"


# digests computed in this process, by (path, inode, size, mtime, ctime): a resumed run
# asks for the same file's digest several times (each stage's key, each finished stage's
# check). The ctime, which no tool sets back, tells a file rewritten in place with its
# size and mtime kept (cp -p, touch -r, an archive's fixed times on a reused inode): with
# the mtime alone such a swapped model or data file was read as the one the stages used,
# and every stage was skipped on it (h42)
_SEEN: dict[tuple[str, int, int, int, int], str] = {}


def file_digest(path: str | Path) -> str:
    """sha256 of a file's contents (array by array for ``.npz``; every file in a folder).

    A file's digest is computed once per process while its inode, size, modification
    and change times stay the same (the atomic writes of a run replace the inode) and it was last
    modified over two seconds before."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_dir():
        for p in sorted(q for q in path.rglob("*") if q.is_file()):
            h.update(str(p.relative_to(path)).encode() + b"\0" + file_digest(p).encode())
        return h.hexdigest()
    try:
        st = path.stat()
        seen = (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:
        return _contents_digest(path, h)
    if seen in _SEEN:
        return _SEEN[seen]
    digest = _contents_digest(path, h)
    # kept only for a file untouched for SETTLED_NS: a later change in place then has a
    # later modification time, whatever the clock's granularity ("racy git")
    if time.time_ns() - st.st_mtime_ns > SETTLED_NS:
        _SEEN[seen] = digest
    return digest


def model_file_digest(path: str | Path) -> str:
    """An ONNX model file's digest followed by that of each external data file its tensors
    name (``onnx.save(..., save_as_external_data=True)``): new weights under an unchanged
    graph file are a new model."""
    path = Path(path)
    digest = file_digest(path)
    if digest not in _EXTERNAL:
        _EXTERNAL[digest] = _external_files(path)
    return digest + "".join(file_digest(path.parent / f) for f in _EXTERNAL[digest]
                            if (path.parent / f).is_file())


def _external_files(path: Path) -> tuple[str, ...]:
    """The external data files a model's tensors name, sorted (none for an unreadable file:
    loading it says why)."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf raises several unrelated types; the loader names them
        return ()
    tensors = [*proto.graph.initializer,
               *(a.t for n in proto.graph.node for a in n.attribute if a.HasField("t"))]
    return tuple(sorted({ExternalDataInfo(t).location for t in tensors
                         if uses_external_data(t)}))


_EXTERNAL: dict[str, tuple[str, ...]] = {}  # model file digest -> its external data files
SETTLED_NS = 2_000_000_000
DIGESTS = "digests"  # run.json: {path: [inode, size, mtime_ns, digest, ctime_ns]}


def remember_digests(folder: Path) -> None:
    """The digests the run folder's manifest kept (``digests``), known to this process:
    a file whose inode, size, modification and change times are those recorded is not
    hashed again (:func:`file_digest`; a copied folder's files have new inodes and are;
    a record without the change time, from before h42, is hashed again once). An
    unreadable manifest gives nothing here (opening it says why)."""
    try:
        raw = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    kept = raw.get(DIGESTS) if isinstance(raw, dict) else None
    for path, rec in (kept.items() if isinstance(kept, dict) else ()):
        if (isinstance(rec, list) and len(rec) == 5 and isinstance(rec[3], str)
                and all(isinstance(x, int) and not isinstance(x, bool)
                        for x in (*rec[:3], rec[4]))):
            _SEEN[(path, rec[0], rec[1], rec[2], rec[4])] = rec[3]


def known_digests() -> dict[str, list[Any]]:
    """This process's settled digests whose files are unchanged now (what
    :meth:`Manifest.write` keeps), by path."""
    out: dict[str, list[Any]] = {}
    for (path, ino, size, mtime, ctime), digest in list(_SEEN.items()):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (ino, size, mtime, ctime):
            out[path] = [ino, size, mtime, digest, ctime]
    return dict(sorted(out.items()))


def _contents_digest(path: Path, h: Any) -> str:
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as z:
                for name in sorted(z.files):
                    arr = np.ascontiguousarray(z[name])
                    h.update(f"{name}|{arr.dtype.str}|{arr.shape}".encode())
                    h.update(arr.tobytes())
            return h.hexdigest()
        except (OSError, ValueError, zipfile.BadZipFile):
            pass  # not a readable archive: hash the bytes (a digest never matches then)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stage_key(name: str, options: dict[str, Any], inputs: dict[str, str]) -> str:
    """Hash of a stage's name, options and input digests (the manifest's ``key``)."""
    blob = json.dumps({"stage": name, "options": options, "inputs": inputs}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class Manifest:
    """The ``run.json`` of one run folder (read on open, written after every stage)."""

    def __init__(self, folder: Path, *, say: Callable[[str], None] | None = None) -> None:
        self.folder = folder
        self.path = folder / MANIFEST
        self.stages: dict[str, dict[str, Any]] = {}
        self.started: dict[str, Any] | None = None  # the stage being run now
        self.unfinished: list[dict[str, Any]] = []  # stages earlier runs left unfinished
        # the stage the last process started and did not finish, found on opening
        self.left: dict[str, Any] | None = None
        if self.path.is_file():
            self.stages, self.unfinished, left = _read(self.path)
            remember_digests(folder)
            if left is not None:
                self.left = {**left, "found": _now()}
                self.unfinished.append(self.left)
                if say is not None:  # before any stage runs: which one, when, why
                    say(unfinished_line(self.left))

    def run(self, name: str, stage: Callable[..., T], *args: Any) -> T:
        """``stage(*args)`` with stage ``name`` ``started`` in ``run.json`` (:meth:`running`)."""
        with self.running(name):
            return stage(*args)

    @contextmanager
    def running(self, name: str) -> Iterator[None]:
        """``started`` for stage ``name`` in ``run.json`` while its body runs (cleared by
        :meth:`record`); an exception Python sees marks it ``ended`` with the reason."""
        self.started = {"stage": name, "at": _now(), "pid": os.getpid()}
        self.write()
        try:
            with keeping_estimates(self.note_estimate):
                yield
        except BaseException as exc:
            if self.started is not None:
                self.started["ended"] = _ended(exc)
                self.write()
            raise

    def note_estimate(self, text: str, peak: int | None = None) -> None:
        """The stage's memory estimate, kept before the work it estimates (a SIGKILL then
        finds it in ``run.json``); ``peak`` (bytes) as ``memory_estimate_mb``. A stage that
        says several (the analysis' sweeps) keeps the last said and the largest peak."""
        if self.started is None or self.started.get("memory_estimate") == text:
            return
        self.started["memory_estimate"] = text
        if peak:
            mb = round(peak / 2**20)
            self.started["memory_estimate_mb"] = max(mb, self.started.get(
                "memory_estimate_mb", 0))
        self.write()

    def done(self, name: str, key: str) -> bool:
        """Finished with this key, and every file it wrote is there, unchanged."""
        entry = self.stages.get(name)
        if not entry or entry.get("key") != key:
            return False
        files = entry.get("files", {})
        return all((self.folder / f).exists() and file_digest(self.folder / f) == d
                   for f, d in files.items())

    def changed(self, name: str, key: str) -> list[str]:
        """The files a stage finished with this key wrote that are missing or changed
        since (edited, deleted): why it runs again on the same inputs."""
        entry = self.stages.get(name)
        if not entry or entry.get("key") != key:
            return []
        return [f for f, d in entry.get("files", {}).items()
                if not (self.folder / f).exists() or file_digest(self.folder / f) != d]

    def digest(self, file: str) -> str:
        """The recorded digest of a file a finished stage wrote (else computed now)."""
        for entry in self.stages.values():
            if file in entry.get("files", {}):
                return entry["files"][file]
        return file_digest(self.folder / file)

    def record(self, name: str, key: str, files: Sequence[str], seconds: float,
               timings: dict[str, Any] | None = None, *, peak: int | None = None,
               before: int | None = None) -> None:
        """A finished stage: its key, files' digests, wall seconds, timings, the process's
        peak resident set while it ran (``peak_rss_mb``, MiB, when known) and, for the
        first stage a run ran, the peak before it (``before_peak_rss_mb``); the memory the
        stage estimated before its work (``memory_estimate``, ``memory_estimate_mb``: what
        :meth:`note_estimate` kept) beside the peak it reached."""
        said = {k: v for k, v in (self.started or {}).items()
                if k in ("memory_estimate", "memory_estimate_mb")}  # beside the peak
        self.started = None
        self.stages[name] = {"key": key, "files": {f: file_digest(self.folder / f) for f in files},
                             "seconds": round(seconds, 2), "timings": timings or {},
                             **({"peak_rss_mb": round(peak / 2**20)} if peak else {}),
                             **({"before_peak_rss_mb": round(before / 2**20)} if before
                                else {}), **said}
        self.write()

    def forget(self, names: Sequence[str]) -> None:
        for n in names:
            self.stages.pop(n, None)
        self.write()

    def write(self) -> None:
        """Written after each stage (a rerun with every stage done writes nothing: its
        files stay byte for byte, ``run.json`` too)."""
        write_json(self.path, {"format": FORMAT, "stages": self.stages,
                               **({STARTED: self.started} if self.started else {}),
                               **({UNFINISHED: self.unfinished} if self.unfinished else {}),
                               DIGESTS: known_digests()})


STARTED, UNFINISHED = "started", "unfinished"  # run.json: the stage now; those left before


def unfinished_line(left: dict[str, Any], *, done: bool = False) -> str:
    """The one line a rerun says of a stage an earlier process started and never finished
    (``done``: as the verdict says it, once resumed)."""
    when = f"started {left.get('at', '?')} (pid {left.get('pid', '?')})"
    how, estimate = left.get("ended"), left.get("memory_estimate")
    memory = ((f"the stage estimated {estimate}" if estimate else
               "the stage said no memory estimate") + f"; to lower it: {MEMORY_FIX}")
    if how:
        why = f"the process ended without finishing it: {how}" + (
            f" ({memory})" if "MemoryError" in how else "")
    else:
        why = ("the process ended without finishing it and without a word (killed: SIGKILL, "
               f"as the kernel's out-of-memory killer sends when the machine's memory is "
               f"short; {memory})")
    return (f"[{left.get('stage', '?')}] {when} and never finished: {why}: "
            + ("resumed by a later run" if done else "resuming at it"))


def unfinished_lines(folder: Path) -> list[str]:
    """Every stage earlier processes of the run in ``folder`` left unfinished, one line
    each (``run.json`` ``unfinished``; the verdict's ``resumed_after``)."""
    try:
        _, unfinished, _ = _read(folder / MANIFEST)
    except QuantscopeError:
        return []
    return [unfinished_line(u, done=True) for u in unfinished]


def _ended(exc: BaseException) -> str:
    """How a stage ended that Python saw end (``run.json`` ``started.ended``)."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"failed: {type(exc).__name__}" + (f": {text}" if text else "")


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _read(path: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]],
                               dict[str, Any] | None]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise QuantscopeError(f"'{path}' is not a readable run manifest: delete it to start "
                              "the run afresh") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise QuantscopeError(f"'{path}' is not a {FORMAT} manifest: use another --out folder "
                              "or delete it")
    stages = raw.get("stages", {})
    if not isinstance(stages, dict) or not all(map(_is_entry, stages.values())):
        raise QuantscopeError(f"'{path}' has a malformed stage entry (edited by hand?): delete "
                              "it to start the run afresh")
    started, unfinished = raw.get(STARTED), raw.get(UNFINISHED, [])
    return (dict(stages),
            [u for u in unfinished if isinstance(u, dict)] if isinstance(unfinished, list)
            else [], started if isinstance(started, dict) else None)


def _is_entry(entry: Any) -> bool:
    """A stage's entry as :meth:`Manifest.record` writes it: its key and its files'
    digests (what :meth:`Manifest.done` and :meth:`Manifest.digest` read)."""
    files = entry.get("files") if isinstance(entry, dict) else None
    return (isinstance(entry, dict) and isinstance(entry.get("key"), str)
            and isinstance(files, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()))
