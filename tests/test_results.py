"""Result files carry a ``format`` tag; ``serde.read_result`` reads any of them by it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest

from quantscope import serde
from quantscope.results import (
    RESULT_TYPES,
    DeviceIOResult,
    EvaluateResult,
    TaggedResult,
    WhatifResult,
)
from quantscope.serde import read_result, tagged_reader, write_json, write_plan
from quantscope.types import Plan, Precision, QuantscopeError

IO_ROWS = [{"name": "x", "role": "input", "dtype": "uint8", "scale": 0.1, "zero_point": 128}]


def test_the_tag_goes_first_and_every_other_key_stays_as_written(tmp_path):
    # the producer's dict (cli io --json), keys in its order
    doc = {"io": IO_ROWS, "mapping_checks": [], "note": "how to feed the device"}
    tagged = DeviceIOResult.of(doc).to_dict()
    assert list(tagged) == ["format", *doc] and {k: tagged[k] for k in doc} == doc
    # a key written only in some cases (the run's io.json has no mapping checks)
    assert list(DeviceIOResult(io=IO_ROWS, note="n").to_dict()) == ["format", "io", "note"]
    write_json(tmp_path / "io.json", tagged)
    back = read_result(tmp_path / "io.json")
    assert back == DeviceIOResult.of(doc) and back.to_dict() == tagged


def test_every_result_type_has_one_tag_and_one_reader():
    tags = [kind.FORMAT for kind in RESULT_TYPES]
    assert len(set(tags)) == len(tags)
    assert all(tag in serde.RESULT_READERS for tag in tags)
    assert serde.PLAN_FORMAT in serde.RESULT_READERS


def test_a_plan_reads_back_through_the_same_reader(tmp_path):
    plan = Plan(default=Precision.A8_W8, overrides=(("g", Precision.A16_W16),))
    write_plan(tmp_path / "plan.json", plan)
    assert read_result(tmp_path / "plan.json") == plan


def test_an_evaluate_result_keeps_its_optional_keys_in_place(tmp_path):
    doc = {"model": "m.onnx", "data": "x.npy", "plan": {"default": "a8_w8"},
           "method": "minmax", "metrics": {"sqnr_db": 31.5}, "outputs": {}, "coverage": {},
           "saturation": {"rows": 8, "tensors": []}, "notes": ["a note"]}
    tagged = EvaluateResult.of(doc).to_dict()
    assert list(tagged) == ["format", *doc]
    write_json(tmp_path / "e.json", tagged)
    assert read_result(tmp_path / "e.json").metrics == {"sqnr_db": 31.5}


@pytest.mark.parametrize("doc, message", [
    ({"metric": "sqnr_db"}, "carries no 'format' tag"),
    ([1, 2], "carries no 'format' tag"),
    ({"format": "quantscope.nothing/1"}, "format 'quantscope.nothing/1', which no reader knows"),
    ({"format": WhatifResult.FORMAT, "metric": "m", "plan": {}, "kinds": [], "all": {},
      "note": "", "extra": 1}, "unknown key 'extra'"),
    ({"format": WhatifResult.FORMAT, "metric": "m"}, "missing key 'plan'"),
])
def test_bad_result_files_are_one_line_errors(tmp_path, doc, message):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(QuantscopeError, match=message) as err:
        read_result(path)
    assert "\n" not in str(err.value) and "r.json" in str(err.value)


def test_another_result_type_is_one_registry_entry(tmp_path, monkeypatch):
    @dataclass(frozen=True)
    class RouteResult(TaggedResult):
        FORMAT: ClassVar[str] = "quantscope.route/1"
        buckets: list[int]

    monkeypatch.setitem(serde.RESULT_READERS, RouteResult.FORMAT, tagged_reader(RouteResult))
    write_json(tmp_path / "route.json", RouteResult(buckets=[32, 64]).to_dict())
    assert read_result(tmp_path / "route.json") == RouteResult(buckets=[32, 64])
