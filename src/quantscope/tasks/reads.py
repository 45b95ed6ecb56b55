"""Which model outputs a task's figures read, where that is known.

A plan's scoring keeps, for the task, each batch's outputs after the fidelity of every
output is summed (:func:`quantscope.emulate.evaluate.compare_model`); it needs to keep
only those the task reads. Kept whole, IS-Net's 12 outputs at 1024 x 1024 (118.5 MB a
photo) were held for every candidate of a plan search for its matte's mask IoU, which
reads one output of 4 MB a photo: the search grew by that much a photo (h74).

=========================  ==========================================================
no task (plain fidelity)   none: the figures are the fidelity, summed as they come
a task of one output       that output (:data:`ONE_OUTPUT`: a map, a score, an image,
                           a depth map: each reads ``task.output`` by name and no other)
several outputs' tasks     their outputs, where every task's are known
any other task             None: every output is kept, as before (a task that reads
                           outputs by position, or several of them: a detection's
                           scores, a CTC's lengths)
=========================  ==========================================================
"""

from __future__ import annotations

from quantscope.tasks.depth import DepthTask
from quantscope.tasks.layout import OutputTasks
from quantscope.tasks.maps import MapTask, ScoreTask
from quantscope.tasks.pictures import ImageTask

ONE_OUTPUT = (MapTask, ScoreTask, ImageTask, DepthTask)
"""Tasks whose figures read their ``output`` alone, by name."""


def outputs_read(task: object | None) -> tuple[str, ...] | None:
    """The outputs ``task``'s figures read, in the order named (None: not known here, so
    every output is kept; () for no task)."""
    if task is None:
        return ()
    if isinstance(task, ONE_OUTPUT):
        return (task.output,)
    if isinstance(task, OutputTasks):
        parts = [outputs_read(t) for t in task.tasks]
        if any(p is None for p in parts):
            return None
        return tuple(dict.fromkeys(o for p in parts if p is not None for o in p))
    return None
