"""The stream and route registry: which streams exist, who owns them, and the hops they take."""

from __future__ import annotations

from khipu.registry.loader import RegistryError, RegistryProblem, load_registry, parse_registry
from khipu.registry.model import (
    AlertThresholds,
    Cluster,
    ConsumerSpec,
    Hop,
    HopKind,
    ProducerSpec,
    Registry,
    ResendMode,
    ResendPolicy,
    Route,
    Stream,
    TopicRef,
    UnknownStreamError,
)

__all__ = [
    "AlertThresholds",
    "Cluster",
    "ConsumerSpec",
    "Hop",
    "HopKind",
    "ProducerSpec",
    "Registry",
    "RegistryError",
    "RegistryProblem",
    "ResendMode",
    "ResendPolicy",
    "Route",
    "Stream",
    "TopicRef",
    "UnknownStreamError",
    "load_registry",
    "parse_registry",
]
