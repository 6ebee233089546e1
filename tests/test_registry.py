"""frugal.registry.Registry: registration, lookup errors that list the choices, removal."""

from __future__ import annotations

import pytest

from frugal.config import ConfigError
from frugal.registry import Registry


def test_entries_keep_their_order_and_unknown_names_list_the_choices() -> None:
    reg: Registry[int] = Registry("codec", field="codec")
    reg.register("fp32", 32)
    reg.decorator("fp16")(16)
    assert reg.names() == ("fp32", "fp16") and list(reg) == ["fp32", "fp16"] and len(reg) == 2
    assert reg.get("fp16") == 16 and "fp32" in reg and "q3" not in reg
    assert reg.check("fp32") == "fp32"
    message = "codec='q3' is not a registered codec; choose one of fp32, fp16"
    with pytest.raises(ConfigError, match=message):  # bad input: the CLI prints one line
        reg.get("q3")


def test_a_taken_name_is_refused_unless_replaced() -> None:
    reg: Registry[int] = Registry("codec", field="codec")
    reg.register("fp32", 32)
    with pytest.raises(ValueError, match="'fp32' is already registered; pick another name"):
        reg.register("fp32", 1)
    reg.register("fp32", 1, replace=True)
    assert reg.get("fp32") == 1
    assert reg.unregister("fp32") == 1 and reg.names() == ()
    for bad in ("", " fp32"):
        with pytest.raises(ValueError, match="must be non-empty, without spaces"):
            reg.register(bad, 0)
