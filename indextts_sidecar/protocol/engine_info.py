"""What an engine says about itself to the other end: its speed control, and the
description ``python -m indextts_sidecar --describe-engines`` prints and the client reads.

Here rather than beside the engine interface, so that the shared layer (the doctor's report
embeds a description) never imports the server's engines.  msgspec structs only.
"""

from __future__ import annotations

from typing import Union

import msgspec

__all__ = ["EngineDescription", "SpeedControl"]


class SpeedControl(msgspec.Struct, frozen=True, kw_only=True):
    """How an engine speaks faster or slower: the request option that does it and its range.

    Speed 1 is the option at ``normal``; speed ``s`` sets it to ``normal * s`` (a rate), or
    ``normal / s`` with ``inverse`` (a duration).  Servers map OpenAI's ``speed`` through
    this and refuse a speed whose value falls outside ``[minimum, maximum]``.
    """

    option: str
    normal: float
    minimum: float
    maximum: float
    inverse: bool = False
    integer: bool = False

    def speed_range(self) -> tuple[float, float]:
        """The speeds whose option value lies in range."""
        low, high = self.minimum / self.normal, self.maximum / self.normal
        return (1 / high, 1 / low) if self.inverse else (low, high)

    def value(self, speed: float) -> Union[int, float, None]:
        """The option's value for ``speed``; None when out of range."""
        value = self.normal / speed if self.inverse else self.normal * speed
        if self.integer:
            value = round(value)
        slack = 1e-9 * max(abs(self.minimum), abs(self.maximum))  # 0.06 / 0.25 is 0.24000000000000002
        if not self.minimum - slack <= value <= self.maximum + slack:
            return None
        return min(max(value, self.minimum), self.maximum)


class EngineDescription(msgspec.Struct, kw_only=True):
    """What ``python -m indextts_sidecar --describe-engines`` reports about one engine."""

    name: str
    description: str = ""
    native_sample_rate: Union[int, None] = None
    #: Requests it runs at once as one batch at most with its default options; 1: one at a time.
    max_batch: int = 1
    capabilities: list[str] = msgspec.field(default_factory=list)
    #: Whether its dependencies are there, as far as can be told without loading a model.
    available: bool = False
    #: Why it is not available.
    problem: Union[str, None] = None
    #: Its speed control, when it has one.
    speed: Union[SpeedControl, None] = None
