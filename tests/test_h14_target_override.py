"""``with_params`` checks an override as a loaded profile is checked: a rule parameter that
makes the profile's ``default_precision`` illegal (an error rule refusing it on a whole op
kind) is refused in one line naming the parameter and the fix; a value of the wrong kind
likewise."""

import tomllib
from pathlib import Path

import pytest

from quantscope.targets import parse_target, with_params
from quantscope.types import QuantscopeError

HAILO10H = Path(__file__).parents[1] / "src/quantscope/targets/hailo10h.toml"
KEY = "hailo.a16_low_sublayer_empty.low_bits"


def _a16_default_profile():
    """hailo10h with default_precision a16_w16 (legal: 16-bit weight codes fill the low
    byte of the 16-bit split), its act16_on_kinds rules made warnings."""
    raw = tomllib.loads(HAILO10H.read_text())
    raw["default_precision"] = "a16_w16"
    for rule in raw["rules"]:
        if rule["check"] == "act16_on_kinds":
            rule["severity"] = "warning"
    return parse_target(raw, source="mine.toml")


def test_an_override_that_makes_the_default_illegal_is_refused():
    target = _a16_default_profile()
    assert with_params(target, {KEY: 9}).rules  # still legal: 16 - 16 < 9
    with pytest.raises(QuantscopeError) as e:
        with_params(target, {KEY: 0})  # 16 - 16 >= 0: every weighted layer refused
    msg = str(e.value)
    assert "\n" not in msg
    assert f"rule parameter '{KEY}' set to 0 makes error rule " \
           "'hailo.a16_low_sublayer_empty' refuse the default precision a16_w16" in msg, msg
    assert f"keep '{KEY}' at 8 (the profile's)" in msg, msg
    # the same fact a loaded profile is refused by
    raw = tomllib.loads(HAILO10H.read_text())
    raw["default_precision"] = "a16_w16"
    for rule in raw["rules"]:
        if rule["check"] == "act16_on_kinds":
            rule["severity"] = "warning"
        if rule["id"] == "hailo.a16_low_sublayer_empty":
            rule["params"]["low_bits"] = 0
    with pytest.raises(QuantscopeError, match="error rule 'hailo.a16_low_sublayer_empty' refuses"):
        parse_target(raw, source="mine.toml")


def test_an_override_of_the_wrong_kind_is_refused():
    target = _a16_default_profile()
    with pytest.raises(QuantscopeError, match=f"rule parameter '{KEY}' set to 'eight'.*params.low_bits is 'eight': give a whole number"):
        with_params(target, {KEY: "eight"})
