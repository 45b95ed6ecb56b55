"""JSON outputs are strict JSON; quantscope's own reader restores the non-finite values."""

import json
import math

import pytest

from quantscope.serde import read_json, write_json
from quantscope.types import QuantscopeError


def _strict_load(text):
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(text, parse_constant=bad)


def test_non_finite_numbers_become_null_with_a_note(tmp_path):
    doc = {"metrics": {"sqnr_db": math.inf, "cos": 0.5}, "rows": [1.0, -math.inf, math.nan]}
    path = write_json(tmp_path / "r.json", doc)
    strict = _strict_load(path.read_text())
    assert strict["metrics"]["sqnr_db"] is None and strict["rows"][1] is None
    assert strict["nonfinite"] == {"/metrics/sqnr_db": "inf", "/rows/1": "-inf", "/rows/2": "nan"}
    back = read_json(path, "result")
    assert back["metrics"]["sqnr_db"] == math.inf and back["rows"][1] == -math.inf
    assert math.isnan(back["rows"][2]) and "nonfinite" not in back


def test_finite_documents_are_unchanged(tmp_path):
    doc = {"a": [1, 2.5, None], "b": "x"}
    path = write_json(tmp_path / "r.json", doc)
    assert "nonfinite" not in path.read_text() and read_json(path, "result") == doc


def test_broken_json_is_one_clear_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{nope")
    with pytest.raises(QuantscopeError, match="not valid JSON"):
        read_json(p, "result")
