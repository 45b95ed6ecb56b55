"""An output with dead channels and collapsed ones (PP-OCRv4's recognizer at a8_w8: 5,640
of 6,625 Softmax classes dead, 923 collapsed): ``run``'s verdict names where an output is
NOT LIKE FP32 by the line after that note, and it quoted the dead channels' line, which
says they are *not* judged; the collapse line, the reason, now comes first (h28)."""

from __future__ import annotations

import numpy as np

from quantscope.emulate.channels import ChannelFidelity


def test_the_collapse_line_comes_before_the_dead_channels_line() -> None:
    rng = np.random.default_rng(0)
    ref = np.stack([rng.uniform(0.0, 1.0, 200),        # live, kept
                    rng.uniform(0.0, 1e-9, 200),       # dead: within float32 of the peak
                    rng.uniform(1e-3, 3e-3, 200)], 1)  # live but below one 8-bit step
    test = ref.copy()
    test[:, 1:] = 0.0
    fid = ChannelFidelity(axis=1)
    fid.add(ref, test)
    notes = fid.notes("probs")
    assert len(notes) == 2
    assert "channels collapse" in notes[0] and "are dead on this data" in notes[1]
