"""The names a symbolic dim counting the samples goes by. (A static axis of size 1 the data
fills is the samples' before any symbolic dim: ``tasks.tensors.find_layout``; ddddocr's
``input1 [1, 1, 64, image_width]``, IS-Net's ``[1, 3, H, W]``.)"""

from __future__ import annotations

import re

# a dim named as the samples' (torch's 'batch_size', 'batch', 'N', 'B'): taken without a note
BATCH_NAME = re.compile(r"(?i)[nb]|bs|.*batch.*")

