"""The saturation check's rows: which evaluation rows are calibrated to see the tensors
whose values leave their calibrated range (:func:`saturation_batches`), their statistics
(:func:`_saturation_stats`, kept by content), and a plan's entry from them."""

from __future__ import annotations

from typing import Any

from quantscope.analyze.evalcache import content_digest, model_digest
from quantscope.calibrate.collect import calibrate
from quantscope.emulate.release import STAGE_RELEASE_GROWTH, release_memory
from quantscope.kept import Kept
from quantscope.model.groups import find_groups
from quantscope.model.load import Model
from quantscope.types import Batch, Encodings, Stats, batch_rows

SATURATION_ROWS = 256  # evaluation rows whose ranges are checked against the calibration's


def saturation_batches(batches: list[Batch]) -> tuple[list[Batch], int]:
    """The evaluation batches whose ranges are checked (up to SATURATION_ROWS rows, whole
    batches), and their rows."""
    rows, part = 0, []
    for b in batches:
        if rows >= SATURATION_ROWS:
            break
        part.append(b)
        rows += batch_rows(b)
    return part, rows


KEPT_SATURATION = 4  # the last saturation statistics kept, by model and rows (~6 MB each)
_SATURATION: Kept[tuple[str, str], tuple[Stats, int]] = Kept(KEPT_SATURATION)


def _saturation_stats(model: Model, batches: list[Batch]) -> tuple[Stats, int]:
    """Streaming statistics of (up to SATURATION_ROWS of) the evaluation rows: the last
    :data:`KEPT_SATURATION` kept by the model's content and the rows', as the same graph
    on the same rows gives the same statistics (a repair offer's folds, a test measuring
    the same model twice: each calibrated them again)."""
    part, rows = saturation_batches(batches)
    key = (model_digest(model.proto), content_digest(part))
    got = _SATURATION.get(key)
    if got is not None:
        return got
    stats = calibrate(model, find_groups(model), part)
    # its tapped tensors given back before the passes run (h67: minilm-l3's evaluate kept
    # 586 MB of them resident under every pass after it)
    release_memory(growth=STAGE_RELEASE_GROWTH)
    return _SATURATION.put(key, (stats, rows))


def _saturation_entry(data_stats: Stats | None, enc: Encodings, n_rows: int) -> dict[str, Any]:
    from quantscope.calibrate.saturation import saturation, saturation_note

    if data_stats is None:
        return {}
    rows = saturation(data_stats, enc)
    note = saturation_note(rows, n_rows)
    return {"saturation": {"rows": n_rows, "tensors": [c.to_dict() for c in rows]},
            **({"saturation_note": note} if note else {})}
