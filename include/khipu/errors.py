"""The shape shared by Khipu's configuration errors: what was set, the value received, what is allowed.

Each concept still owns its error class (tracing, demo, settings); this base only keeps their
messages uniform: ``<kind> '<setting>': got <value>; expected <allowed>``.
"""

from __future__ import annotations


class InvalidSetting(ValueError):
    kind = "setting"

    def __init__(self, setting: str, value: object, expected: str) -> None:
        super().__init__(f"{self.kind} '{setting}': got {value!r}; expected {expected}")
        self.setting = setting
        self.value = value
        self.expected = expected
