"""The demo pipeline on the real broker: the traces on the trace topic are exactly what the
ground-truth ledger predicts, per hop and type, with every fault type injected."""

from __future__ import annotations

import secrets
from collections import Counter
from pathlib import Path

import pytest

from khipu.demo.faults import Fault, FaultRates
from khipu.demo.ledger import GroundTruth, build_truth, read_ledger
from khipu.demo.pipeline import DemoConfig, DemoError, DemoReport, run_demo
from khipu.demo.topology import DEMO_STREAM, DemoTopology
from khipu.localstack.broker import BrokerProcess
from khipu.localstack.processes import free_port
from khipu.registry import Hop, load_registry
from khipu.trace import Trace, TraceType
from tests.integration.helpers import TEST_SESSION_TIMEOUT_MS, traces_of

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
# Fault decisions depend on the seed and the message ids, which start with the run id: tests pin
# both, so which messages each fault strikes is the same in every run.
ALL_FAULTS = FaultRates(
    consumer_skip=0.02,
    processor_drop=0.02,
    rebalance_drop=0.01,
    offset_rewind=0.02,
    producer_retry=0.02,
    delay=0.02,
    trace_loss=0.01,
)


@pytest.fixture(scope="module")
def topology() -> DemoTopology:
    return DemoTopology.from_stream(load_registry(ROOT / "config" / "registry.yaml").stream(DEMO_STREAM))


def run(
    broker: BrokerProcess, topology: DemoTopology, tmp_path: Path, **options: object
) -> tuple[DemoReport, GroundTruth, list[Trace]]:
    trace_topic = f"traces-{secrets.token_hex(3)}"
    config = DemoConfig(
        bootstrap_servers=broker.bootstrap_servers,
        ledger_path=tmp_path / "ledger.jsonl",
        trace_topic=trace_topic,
        session_timeout_ms=TEST_SESSION_TIMEOUT_MS,
        delay_ms=1500,
        progress_interval_s=60,
        **options,
    )  # type: ignore[arg-type]
    report = run_demo(config, topology, progress=lambda line: None)
    truth = build_truth(read_ledger(config.ledger_path, run_id=config.run_id))
    traces = [t for t in traces_of(broker, trace_topic) if t.message_id.startswith(f"{config.run_id}-")]
    return report, truth, traces


def test_traces_per_hop_and_type_equal_the_ground_truth_with_every_fault_injected(
    broker: BrokerProcess, topology: DemoTopology, tmp_path: Path
) -> None:
    report, truth, traces = run(
        broker, topology, tmp_path, count=400, rate_per_s=400, faults=ALL_FAULTS, seed=11, run_id="exact"
    )

    struck = truth.fault_counts()
    assert {f.value for f in Fault} <= set(struck), (
        f"this seed and run id must strike every fault type; struck {struck}"
    )
    assert len(truth.messages) == 400
    observed = Counter((Hop.of_trace(t).id, t.type.value) for t in traces)
    assert observed == truth.expected_trace_counts()
    assert sum(report.emitters[loc].dropped for loc in report.emitters) == 0  # the channel itself lost nothing


def test_each_fault_leaves_the_trace_pattern_the_detector_will_read(
    broker: BrokerProcess, topology: DemoTopology, tmp_path: Path
) -> None:
    _, truth, traces = run(
        broker, topology, tmp_path, count=300, rate_per_s=300, faults=ALL_FAULTS, seed=11, run_id="pattern"
    )
    seen: Counter[tuple[str, str]] = Counter((t.message_id, Hop.of_trace(t).id) for t in traces)
    source_hop, read_hop = topology.source_hop.id, topology.processor_read_hop.id
    write_hop = topology.processor_write_hop.id
    skip_hop = Hop.read(topology.output_topic, topology.skip_group).id
    rewind_hop = Hop.read(topology.output_topic, topology.rewind_group).id

    checked: Counter[str] = Counter()
    for row in truth.rows():
        hops = truth.messages[row.message_id].hops
        if "trace_loss" not in row.faults:
            assert seen[(row.message_id, row.hop)] == row.count, row  # one trace per real pass, at 100 % sampling
        if "consumer_skip" in row.faults:  # committed past, never received (one copy at least)
            assert row.hop == skip_hop and row.count < hops[write_hop].count, row
        if row.faults & {"processor_drop", "rebalance_drop"}:  # received by the processor, never written on
            assert row.hop == write_hop and row.count < hops[read_hop].count, row
        if "offset_rewind" in row.faults:  # the same offset read again
            assert row.hop == rewind_hop and row.count > hops[write_hop].count, row
        if "producer_retry" in row.faults:  # one id at two offsets
            assert row.hop == source_hop and row.count == 2, row
        checked.update(row.faults)
    assert {"consumer_skip", "processor_drop", "rebalance_drop", "offset_rewind", "producer_retry"} <= set(checked)


def test_ids_propagate_through_the_processor_and_sampling_is_the_same_at_every_hop(
    broker: BrokerProcess, topology: DemoTopology, tmp_path: Path
) -> None:
    _, truth, traces = run(
        broker, topology, tmp_path, count=300, rate_per_s=300, sampling_percent=30, run_id="sampling"
    )

    sampled = {mid for mid, m in truth.messages.items() if m.sampled}
    hops_per_id: dict[str, set[str]] = {}
    for trace in traces:
        hops_per_id.setdefault(trace.message_id, set()).add(Hop.of_trace(trace).id)
    all_hops = {hop.id for hop in topology.stream.route.hops}
    assert 60 < len(sampled) < 120
    assert set(hops_per_id) == sampled  # unsampled messages left no trace anywhere
    assert all(hops == all_hops for hops in hops_per_id.values())  # sampled ones left one at every hop
    processor_out = {t.message_id for t in traces if t.type is TraceType.SENT and t.location == "demo-enricher"}
    assert processor_out == sampled


def test_unreachable_broker_fails_fast_with_the_address_in_the_error(topology: DemoTopology, tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    config = DemoConfig(bootstrap_servers=address, ledger_path=tmp_path / "l.jsonl", count=1)
    with pytest.raises(DemoError, match=f"cannot reach cluster 'local' at {address}"):
        run_demo(config, topology, progress=lambda line: None)
