"""Routes the unit tests share.

FAN_OUT: producer p writes local/in; processor group proc (location proc) reads it and writes local/out;
sinks s1 and s2 read local/out.
"""

from __future__ import annotations

from khipu.registry import parse_registry

FAN_OUT_TEXT = """
version: 1
clusters: {local: {}}
streams:
  orders:
    owner: team-t
    route:
      producers: [{location: p, writes: [local/in]}]
      consumers:
        - {group: proc, reads: [local/in], writes: [local/out]}
        - {group: s1, reads: [local/out]}
        - {group: s2, reads: [local/out]}
"""
FAN_OUT_REGISTRY = parse_registry(FAN_OUT_TEXT)
FAN_OUT = FAN_OUT_REGISTRY.stream("orders")
SRC, PROC_IN, PROC_OUT = "p -> local/in", "local/in -> proc", "proc -> local/out"
S1, S2 = "local/out -> s1", "local/out -> s2"

# FAN_OUT with s2 keeping its offsets outside Kafka (as MirrorMaker 2's source consumer does): it never commits
EXTERNAL_OFFSETS_REGISTRY = parse_registry(
    FAN_OUT_TEXT.replace("{group: s2, reads: [local/out]}", "{group: s2, reads: [local/out], commits_offsets: false}")
)
