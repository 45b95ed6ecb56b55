"""Face data split by person, for ``run``'s held-out evaluation (no ``--eval-data``).

A face's variants (flip, light, distance slices) and a person's other photos are no
independent samples: a split by chip would put a person's gallery chip on one side and its
variants on the other, and the held-out figure would be on people the plan was fitted on.
So ``faces`` (and a folder of identity folders) is split by person:

==============  ====================================================================
order           people by chip count, most first (ties: the lower identity index, the
                order the built-in set or the identity folders list them); each goes
                to the half with fewer chips so far (the fit half on a tie): a stable
                order, no seed. The built-in ``faces``: ArcFace chips 12 people, 126
                chips fit (``obama``'s three photos among them), 12 people, 117 chips
                held out (``sample1`` face 1 = ``sample3`` face 2 among them); dlib
                chips 8 people, 72 chips fit (``sample1`` face 1 = ``sample3`` face 2
                among them), 9 people, 72 chips held out
halves          every chip of a person in one half, never in both
pairs           each half's own: the pairs of the whole set whose two chips are both
                in it (genuine pairs within a person; impostor pairs between the
                half's people); impostor pairs across the halves are in neither
too few         a half with fewer than :data:`MIN_PEOPLE` people (no impostor pair)
                or :data:`MIN_GENUINE` genuine pairs: no split, said (the data is
                evaluated on the fit data, as before)
==============  ====================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from quantscope.tasks.verification import VerificationTask
from quantscope.types import Batch, batch_rows, concat_rows, take_rows

# in the resume key of ``run`` on face data without --eval-data (pipeline.context): a new
# split rule gets a new key, so no run folder fitted under another split is reused
SPLIT_KEY = "faces by person/1"
MIN_PEOPLE = 2  # a half of one person has no impostor pair: nothing to falsely accept
MIN_GENUINE = 8  # genuine pairs a half needs (a folder photo with its 4 distance slices: 4)


@dataclass(frozen=True)
class PeopleSplit:
    """Chip indices (sorted, in data order) of the fit and the held-out half."""

    fit: np.ndarray
    held: np.ndarray


@dataclass(frozen=True)
class FaceHalves:
    """Face data split by person: the split, each half's task (its chips, their own
    pairs) and its batches (its chips, in data order)."""

    split: PeopleSplit
    tasks: tuple[VerificationTask, VerificationTask]
    batches: tuple[tuple[Batch, ...], tuple[Batch, ...]]

    @property
    def people(self) -> tuple[int, int]:
        """People in each half."""
        a, b = (len(np.unique(t.identity)) for t in self.tasks)  # type: ignore[arg-type]
        return a, b


def splits_by_people(task: object) -> bool:
    """Whether ``task`` is face verification that knows each chip's person (face data)."""
    return isinstance(task, VerificationTask) and task.identity is not None


def split_people(task: VerificationTask) -> PeopleSplit:
    """The two halves by person (module table), before any check of their size."""
    ids = np.asarray(task.identity)
    people, counts = np.unique(ids, return_counts=True)
    order = sorted(range(len(people)), key=lambda i: (-counts[i], people[i]))
    chips = [0, 0]
    side: dict[Any, int] = {}
    for i in order:
        half = 0 if chips[0] <= chips[1] else 1
        side[people[i]] = half
        chips[half] += int(counts[i])
    where = np.array([side[p] for p in ids], np.int8)
    return PeopleSplit(np.flatnonzero(where == 0), np.flatnonzero(where == 1))


def halves_by_person(task: VerificationTask, batches: tuple[Batch, ...]) -> FaceHalves | str:
    """``task`` and ``batches`` (its chips, in its order) split by person (module table),
    or why not: a half too small to judge (:func:`too_few`)."""
    if sum(batch_rows(b) for b in batches) != _chip_count(task):
        raise ValueError("the batches do not hold the task's chips")  # a caller's error
    split = split_people(task)
    tasks = (take_chips(task, split.fit), take_chips(task, split.held))
    why = next(filter(None, map(too_few, tasks)), None)
    if why is not None:
        return why
    size = batch_rows(batches[0])
    return FaceHalves(split, tasks, (take_samples(batches, split.fit, size),
                                     take_samples(batches, split.held, size)))


def take_samples(batches: tuple[Batch, ...], index: np.ndarray, size: int
                 ) -> tuple[Batch, ...]:
    """The samples ``index`` (in data order) of ``batches``, in batches of ``size``."""
    starts = np.cumsum([0] + [batch_rows(b) for b in batches])
    rows = [take_rows(b, index[(index >= lo) & (index < hi)] - lo)
            for b, lo, hi in zip(batches, starts[:-1], starts[1:], strict=True)]
    whole = concat_rows(rows)
    return tuple(take_rows(whole, slice(i, i + size)) for i in range(0, len(index), size))


def take_chips(task: VerificationTask, chips: np.ndarray) -> VerificationTask:
    """``task`` on the chips ``chips`` (indices into its chips, in order), re-indexed: the
    pairs whose two chips are both among them, each chip's face and person."""
    new = np.full(_chip_count(task), -1, np.int64)
    new[chips] = np.arange(len(chips))
    p = task.pairs
    keep = (new[p.first] >= 0) & (new[p.second] >= 0)
    pairs = replace(p, first=new[p.first[keep]], second=new[p.second[keep]],  # type: ignore[type-var]
                    genuine=p.genuine[keep], distance=p.distance[keep], change=p.change[keep])
    faces = None if task.faces is None else np.asarray(task.faces)[chips]
    identity = None if task.identity is None else np.asarray(task.identity)[chips]
    return replace(task, pairs=pairs, faces=faces, identity=identity)


def too_few(task: VerificationTask) -> str | None:
    """Why a half cannot be judged on its own (module table), or None."""
    people = len(np.unique(task.identity))
    genuine = int(np.sum(task.pairs.genuine))  # type: ignore[attr-defined]
    if people >= MIN_PEOPLE and genuine >= MIN_GENUINE:
        return None
    return (f"{people} {'person' if people == 1 else 'people'} and {genuine} genuine "
            f"pair{'' if genuine == 1 else 's'} (each half needs {MIN_PEOPLE} people and "
            f"{MIN_GENUINE} genuine pairs)")


def half_record(task: object) -> dict[str, Any] | None:
    """The people, photos and pairs of face data (a half's, or the whole's), for the
    data provenance; None for other tasks."""
    if not splits_by_people(task):
        return None
    t: VerificationTask = task  # type: ignore[assignment]
    photos = sorted({int(f) for f in np.asarray(t.faces)}) if t.faces is not None else []
    names = [t.photo_names[i] if i < len(t.photo_names) else str(i) for i in photos]
    return {"people": sorted(int(i) for i in np.unique(t.identity)), "photos": names,
            "chips": int(len(t.identity)), "pairs": len(t.pairs),  # type: ignore[arg-type]
            "genuine_pairs": int(np.sum(t.pairs.genuine))}  # type: ignore[attr-defined]


def _chip_count(task: VerificationTask) -> int:
    return int(len(task.identity))  # type: ignore[arg-type]
