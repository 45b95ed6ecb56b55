"""The segment sweep's memory: estimated before any session is built, kept within a budget.

A sweep holds one session per segment for each chain (FP32, all-``low``) and, per
candidate, sessions of its own for the segments its plan changes. Held for every
candidate at once, those grow with the candidates (11 GB on a 12-layer encoder at 256
tokens). :func:`plan_memory` splits the candidates into windows whose own sessions hold at
most a budget of weights (from the memory available), estimates the peak (the chains'
weights, the largest window's, the tensors a batch keeps), says it, and refuses with one
line when not even one candidate fits next to the chains.

A candidate's reduced output rows are held too, until its window is scored
(:func:`quantscope.analyze.sweeps.sweep_segments` with ``score``): small for an encoder's
pooled rows, but an image model scored by fidelity keeps every output value (IS-Net at
1024 x 1024: 118.5 MB per sample over its 12 outputs; held for its 258 enable-one
candidates at once they were 30 GB, and the kernel's OOM killer ended the analysis at
22 GB). The windows also keep those rows within what the memory left allows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import helper

from quantscope.model.load import Model
from quantscope.types import Batch, QuantscopeError

HEADROOM = 0.7  # the share of the available memory the sweep plans to use
# candidates' session weights held at once, in copies of the model's weights: the peak
# stays near the chains' + this many models (bench/memory.py measures it)
WINDOW_MODELS = 2.0
GB, MB = float(1 << 30), float(1 << 20)


@dataclass(frozen=True)
class MemoryPlan:
    """Candidate windows and what the peak is made of (bytes)."""

    windows: tuple[range, ...]
    model_bytes: int  # the weights of one chain
    chains: int
    sessions: int  # candidates whose sessions are held at once, at most
    session_bytes: int  # their weights (the largest window)
    activation_bytes: int  # what the envs of one batch hold
    available: int | None
    row_bytes: int = 0  # the reduced output rows of the largest window's candidates
    held_bytes: int = 0  # rows held throughout: FP32's and the baselines', the chains'
    run_bytes: int = 0  # what one segment's run holds in the arena at once (run_bytes)
    resident_bytes: int = 0  # what the process held before the sweep (the model, data)
    prepass_bytes: int = 0  # the chains' own pass before the windows: weights and envs

    @property
    def peak(self) -> int:
        windows = (self.chains * self.model_bytes + self.session_bytes
                   + self.activation_bytes + self.row_bytes)
        return (max(windows, self.prepass_bytes) + self.held_bytes + self.run_bytes
                + self.resident_bytes)

    def text(self) -> str:
        split = f", in {len(self.windows)} windows" if len(self.windows) > 1 else ""
        free = f"; {self.available / GB:.1f} GB available" if self.available else ""
        rows = (f", their output rows ~{self.row_bytes / MB:.0f} MB until scored"
                if self.row_bytes >= MB else "")
        held = (f", reference and baseline rows ~{self.held_bytes / MB:.0f} MB"
                if self.held_bytes >= MB else "")
        work = (f", a run's working tensors ~{self.run_bytes / MB:.0f} MB"
                if self.run_bytes >= MB else "")
        before = (f", ~{self.resident_bytes / MB:.0f} MB held before it"
                  if self.resident_bytes >= MB else "")
        pre = (f", the chains' own pass ~{self.prepass_bytes / MB:.0f} MB"
               if self.prepass_bytes >= MB else "")
        return (f"~{self.peak / GB:.2f} GB peak ({self.chains} chain(s) of "
                f"{self.model_bytes / MB:.0f} MB, {self.sessions} candidates' sessions "
                f"({self.session_bytes / MB:.0f} MB){rows} at once{split}, a batch's tensors "
                f"~{self.activation_bytes / MB:.0f} MB{pre}{work}{held}{before}{free})")


def _proc_kib(path: str, key: str) -> int | None:
    """The ``key:`` line of a /proc file in kiB, as bytes (None where there is none)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where there is none)."""
    return _proc_kib("/proc/meminfo", "MemAvailable")


def reset_peak() -> bool:
    """Start this process's peak resident set anew (Linux: ``5`` into
    ``/proc/self/clear_refs``), so :func:`peak_bytes` reads the peak since; False where
    that is not possible (then :func:`peak_bytes` reads the process's peak so far)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_bytes() -> int | None:
    """This process's peak resident set (VmHWM of ``/proc/self/status``; None where there is
    none): since the last :func:`reset_peak`. Child processes (Ray workers) are not in it."""
    return _proc_kib("/proc/self/status", "VmHWM")


def weight_bytes(model: Model) -> int:
    return sum(int(np.prod(t.dims, dtype=np.int64)) * itemsize(t.data_type)
               for t in model.graph.initializer)


def itemsize(data_type: int) -> int:
    """Bytes per value of an ONNX tensor type (4 when unknown)."""
    try:
        return int(helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    except (KeyError, TypeError):
        return 4


def batch_tensor_bytes(model: Model, batches: Sequence[Batch], tensors: Sequence[str]) -> int:
    """The bytes of ``tensors`` for the largest batch (:func:`tensor_sizer`, once)."""
    return tensor_sizer(model, batches)(tensors)


def tensor_sizer(model: Model, batches: Sequence[Batch]) -> Callable[[Sequence[str]], int]:
    """A function giving the bytes of a set of tensors for the largest batch, the shapes
    inferred once (a sweep asks it for every segment's live set: one inference each was
    seconds per segment on a 12-layer encoder).

    Each tensor's shape is inferred from the batch's [rows, length] token inputs where the
    model has them (a rewritten model's per-head and per-chunk tensors keep symbolic dims
    that no reading by position can size: read as the length each, one [B, d, d, d]
    tensor of a head-split model counted as 1 GB); else each shape with its first
    symbolic dim read as the batch's rows and every other as its length (e.g. attention
    probabilities [B, H, S, S]); a tensor of unknown shape counts as one value per
    token."""
    if not batches:
        return lambda tensors: 0
    shapes = {vi.name: vi.type.tensor_type.shape for vi in
              [*model.graph.input, *model.graph.value_info, *model.graph.output]}

    def dims(b: Batch) -> tuple[int, int]:
        arrays = [v for v in b.values() if getattr(v, "ndim", 0) >= 1]
        rows = max((int(v.shape[0]) for v in arrays), default=1)
        length = max((int(v.shape[1]) for v in arrays if v.ndim >= 2), default=1)
        return rows, length

    rows, length = max((dims(b) for b in batches), key=lambda d: d[0] * d[1])
    concrete = _inferred(model, rows, length) or _inferred_at(model, batches)
    known_bytes: dict[str, int] = {}

    def size(t: str) -> int:
        known = concrete.get(t)
        if known and all(isinstance(d, int) and d > 0 for d in known):
            return int(np.prod(known, dtype=np.int64)) * 4
        shape = shapes.get(t)
        if shape is None or not shape.dim:
            return rows * length * 4
        n = 1
        for i, d in enumerate(shape.dim):
            n *= d.dim_value if d.dim_value > 0 else (rows if i == 0 else length)
        return n * 4

    def total(tensors: Sequence[str]) -> int:
        out = 0
        for t in dict.fromkeys(tensors):
            if t not in known_bytes:
                known_bytes[t] = size(t)
            out += known_bytes[t]
        return out

    return total


def _inferred(model: Model, rows: int, length: int) -> dict[str, tuple]:
    """Tensor shapes inferred at [rows, length] token inputs ({}: no such inputs, or
    inference failed)."""
    from quantscope.model.shapes import resolve_shapes, seq_len_shapes

    try:
        return resolve_shapes(model, seq_len_shapes(model, length, batch=rows))
    except (QuantscopeError, ValueError, RuntimeError):  # not a token model; no inference
        return {}


def _inferred_at(model: Model, batches: Sequence[Batch]) -> dict[str, tuple]:
    """Tensor shapes inferred at the largest batch's own input shapes, for a model without
    [rows, length] token inputs (a picture model whose H, W are symbolic: read by position
    they were the channels: PP-OCR's detector's 960 x 960 activations counted as
    3 x 3; {}: inference failed)."""
    from quantscope.model.shapes import resolve_shapes

    names = set(model.input_names())
    largest = max(batches, key=lambda b: sum(int(getattr(v, "nbytes", 0))
                                             for k, v in b.items() if k in names))
    given = {k: tuple(int(d) for d in np.shape(v)) for k, v in largest.items() if k in names}
    try:
        return resolve_shapes(model, given)
    except (QuantscopeError, ValueError, RuntimeError):
        return {}


def run_bytes(model: Model, sizer: Callable[[Sequence[str]], int]) -> int:
    """The most bytes of tensors one run of ``model`` holds at once (each tensor alive from
    the node writing it to the last node reading it, in the graph's order, as ONNX
    Runtime's planner frees them), plus the largest tensor once more: a Q/DQ pair's
    dequantized copy beside its input. What a segment's session asks of the arena while it
    runs, besides the tensors the envs keep across the cuts."""
    last: dict[str, int] = {}
    for i, node in enumerate(model.graph.node):
        for t in node.input:
            if t:
                last[t] = i
    for o in model.graph.output:
        last[o.name] = len(model.graph.node)
    consts = {t.name for t in model.graph.initializer}
    live = {i.name for i in model.graph.input if i.name not in consts}
    held = sizer(list(live))
    peak = largest = max((sizer([t]) for t in live), default=0)
    for i, node in enumerate(model.graph.node):
        made = [t for t in node.output if t and t not in live]
        for t in made:
            live.add(t)
            size = sizer([t])
            held += size
            largest = max(largest, size)
        peak = max(peak, held)
        for t in [t for t in node.input if t in live and last.get(t, -1) <= i]:
            live.discard(t)
            held -= sizer([t])
        for t in [t for t in made if t not in last]:  # written, never read
            live.discard(t)
            held -= sizer([t])
    return peak + largest


def plan_memory(model: Model, cand_bytes: Sequence[int], batches: Sequence[Batch],
                tensors: Sequence[str], *, chains: int, budget: int | None = None,
                available: int | None = None,
                sizer: Callable[[Sequence[str]], int] | None = None,
                row_bytes: int = 0, held_bytes: int = 0, measured: int = 0,
                tensor_bytes: int | None = None, resident: int = 0,
                prepass: tuple[int, int] | None = None) -> MemoryPlan:
    """Windows of consecutive candidates whose own sessions' weights (``cand_bytes``, per
    candidate) stay within ``budget`` (default: :data:`WINDOW_MODELS` times the model's
    weights, less where :data:`HEADROOM` of the available memory less the chains and a
    batch's tensors is less), every window at least one candidate. ``sizer``: the
    :func:`tensor_sizer` of ``model`` and ``batches`` when the caller has one.

    ``row_bytes``: the reduced output rows one candidate keeps until its window is scored;
    a window also ends where its candidates' rows would pass the larger of one env's
    tensors and :data:`WINDOW_MODELS` models' weights, or what :data:`HEADROOM` of the
    available memory leaves beside the chains, a batch's tensors and the sessions.
    ``held_bytes``: what the caller holds throughout (FP32's rows, the baselines'), in the
    peak and in what is left. ``measured``: what one run of a batch was measured to take
    (the resident set's rise over an FP32 run: ONNX Runtime's arena keeps more than the
    tensors' own count, IS-Net ~4x); the larger of it and :func:`run_bytes` is counted.
    ``tensor_bytes``: what one env holds at most, when the caller has sized it (else
    ``tensors`` are). ``resident``: what the process holds already (in the peak said; the
    memory available already leaves it out). ``prepass``: (chains, one env's tensors) of
    the chains' own pass before the windows, with no candidate's sessions or rows (the
    all-``low`` sweep's cumulative noise: both chains, each env with its taps); the peak is
    the larger of that pass and a window."""
    model_bytes = weight_bytes(model)
    sizer = sizer or tensor_sizer(model, batches)
    # the chains' envs and a candidate's, each holding the tensors crossing the cuts
    act = (chains + 1) * (sizer(tensors) if tensor_bytes is None else tensor_bytes)
    work = max(run_bytes(model, sizer), measured)  # the one segment running, in the arena
    avail = available if available is not None else available_bytes()
    fixed = chains * model_bytes + act + held_bytes + work
    one = max(cand_bytes, default=0) + row_bytes
    pre = 0 if prepass is None else prepass[0] * (model_bytes + prepass[1])
    if avail is not None and max(fixed + one, pre + held_bytes + work) > HEADROOM * avail:
        need = max(fixed + one, pre + held_bytes + work) / GB
        rows = (f", one candidate's output rows ~{row_bytes / MB:.0f} MB"
                if row_bytes >= MB else "")
        raise QuantscopeError(
            f"the analysis needs ~{need:.1f} GB ({chains} chain(s) of {model_bytes / MB:.0f} MB "
            f"of weights, a batch's tensors ~{(act + work) / MB:.0f} MB{rows}) and "
            f"{avail / GB:.1f} GB "
            "is available: give a shorter --seq-len or smaller inputs (a batch's tensors grow "
            "with them), or run on a machine with more memory")
    if budget is None:
        limit = WINDOW_MODELS * model_bytes  # inf (bench/memory.py): no bound but memory
        if avail is not None:
            limit = min(limit, max(HEADROOM * avail - fixed, 0.0))
        budget = int(min(limit, float(sum(cand_bytes))))
    # the rows held at once: no more than one env's tensors or the sessions' weights (the
    # peak stays near FP32 inference's; a window more re-runs the chains once a batch), nor
    # what the memory available leaves
    row_budget = max(act / (chains + 1), WINDOW_MODELS * model_bytes)
    if avail is not None:
        row_budget = min(row_budget, HEADROOM * avail - fixed - budget)
    row_budget = max(row_budget, float(row_bytes))
    windows, start, held, rows = [], 0, 0, 0
    for i, b in enumerate(cand_bytes):
        if i > start and (held + b > budget or rows + row_bytes > row_budget):
            windows.append(range(start, i))
            start, held, rows = i, 0, 0
        held += b
        rows += row_bytes
    windows.append(range(start, len(cand_bytes)))
    largest = max(windows, key=lambda w: sum(cand_bytes[w.start:w.stop]))
    most = max(len(w) for w in windows)
    return MemoryPlan(tuple(windows), model_bytes, chains, most,
                      sum(cand_bytes[largest.start:largest.stop]), act, avail,
                      most * row_bytes, held_bytes, work, resident, pre)
