"""Which faults the demo injects, and the deterministic plan that decides where.

Each decision is a pure function of (seed, fault, key): the same run id and seed give the same
faults, so a failing score can be replayed.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum

from khipu.errors import InvalidSetting


class Fault(StrEnum):
    CONSUMER_SKIP = "consumer_skip"  # a sink commits past records it never processed
    PROCESSOR_DROP = "processor_drop"  # the processor consumes and commits, never writes on
    REBALANCE_DROP = "rebalance_drop"  # buffered records discarded on revoke after their offsets were committed
    OFFSET_REWIND = "offset_rewind"  # a sink seeks back and re-reads: duplicates of the same offsets
    PRODUCER_RETRY = "producer_retry"  # the source writes the same id twice: duplicates at two offsets
    DELAY = "delay"  # the processor holds a record for delay_ms before writing it on
    TRACE_LOSS = "trace_loss"  # the trace of a hop is lost in the trace channel; the message is fine


class DemoConfigError(InvalidSetting):
    """A demo setting is invalid; the message names it, the value and what is allowed."""

    kind = "demo setting"


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Probability, per message (per trace for trace_loss), that each fault is injected."""

    consumer_skip: float = 0.0
    processor_drop: float = 0.0
    rebalance_drop: float = 0.0
    offset_rewind: float = 0.0
    producer_retry: float = 0.0
    delay: float = 0.0
    trace_loss: float = 0.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or not 0.0 <= value <= 1.0
            ):
                raise DemoConfigError(f"faults.{item.name}", value, "a probability in [0, 1]")

    def rate(self, fault: Fault) -> float:
        return float(getattr(self, fault.value))

    @staticmethod
    def parse(specs: list[str] | None) -> FaultRates:
        """Parse ``name=rate`` items, e.g. ``["consumer_skip=0.01", "delay=0.05"]``."""
        rates: dict[str, float] = {}
        known = ", ".join(f.value for f in Fault)
        for spec in specs or []:
            name, sep, raw = spec.partition("=")
            if not sep or name not in {f.value for f in Fault}:
                raise DemoConfigError("fault", spec, f"'name=rate' with name one of: {known}")
            try:
                rates[name] = float(raw)
            except ValueError:
                raise DemoConfigError(f"faults.{name}", raw, "a probability in [0, 1]") from None
        return FaultRates(**rates)

    def as_dict(self) -> Mapping[str, float]:
        return {item.name: getattr(self, item.name) for item in fields(self)}


@dataclass(frozen=True, slots=True)
class FaultPlan:
    rates: FaultRates
    seed: int = 0

    def injects(self, fault: Fault, key: str, rate: float | None = None) -> bool:
        """Whether ``fault`` strikes the message (or trace) identified by ``key`` (at ``rate`` instead of the
        plan's, when given: a rate changed while the demo runs)."""
        rate = self.rates.rate(fault) if rate is None else rate
        if rate <= 0.0:
            return False
        digest = hashlib.blake2b(f"{self.seed}|{fault.value}|{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < rate
