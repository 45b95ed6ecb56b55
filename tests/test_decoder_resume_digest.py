"""A decoder run's resume key holds the weights its graphs name, whatever their file is called.

The key digested each phase graph with ``X.onnx.data`` beside it only: a decoder whose
graphs keep their weights in files of other names (``location`` in each tensor's
``external_data``, e.g. ``byte.prefill.weights``) was keyed by the graph files alone, so a
rerun after new weights were written under unchanged graphs skipped every stage and
reported the old model's figures. The key now holds every file the tensors name.
"""

from __future__ import annotations

import onnx
from decoder_tiny import byte_decoder

from quantscope.pipeline.decoder import phases_digest


def _with_weights_apart(folder, seed: int):
    """The tiny decoder with each phase's weights in ``byte.<phase>.weights``."""
    folder.mkdir(exist_ok=True)
    byte_decoder(folder, seed=seed)
    for phase in ("prefill", "decode"):
        path = folder / f"byte.{phase}.onnx"
        proto = onnx.load(str(path))
        onnx.save(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"byte.{phase}.weights", size_threshold=0)
    return folder / "byte.prefill.onnx"


def test_new_weights_under_the_same_graphs_are_a_new_model(tmp_path):
    prefill = _with_weights_apart(tmp_path, seed=0)
    before = phases_digest(prefill)
    assert phases_digest(prefill) == before  # the same files: the same key
    assert not (tmp_path / "byte.prefill.onnx.data").exists()
    # new weights under the unchanged graph files: the decode graph's weights file with
    # another decoder's (same sizes, so the graphs' offsets still hold)
    weights = tmp_path / "byte.decode.weights"
    other = _with_weights_apart(tmp_path / "other", seed=1).parent / "byte.decode.weights"
    assert weights.stat().st_size == other.stat().st_size
    assert weights.read_bytes() != other.read_bytes()
    weights.write_bytes(other.read_bytes())
    assert phases_digest(prefill) != before
