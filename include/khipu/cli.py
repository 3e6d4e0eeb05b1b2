"""The ``khipu`` command: local stack, demo pipeline, registry checks and trace-topic counts."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from khipu import __version__
from khipu.clock import now_ms, utc_text
from khipu.demo.control import DemoControl
from khipu.demo.faults import DemoConfigError, FaultRates
from khipu.demo.ledger import LedgerError, build_truth, read_ledger
from khipu.demo.pipeline import DemoConfig, DemoError, run_demo
from khipu.demo.topology import DEMO_STREAM, DemoTopology
from khipu.errors import InvalidSetting
from khipu.kafka import KafkaAdmin, KafkaConnectionError, KafkaUnavailable
from khipu.kafka.trace_topic import TraceTopicError, read_trace_topic, tally_traces
from khipu.localstack.broker import BrokerError
from khipu.registry.loader import RegistryError, load_registry
from khipu.registry.model import UnknownStreamError
from khipu.settings import KhipuSettings, project_root
from khipu.store import Store, StoreError

EXIT_USAGE = 2
EXIT_FAILED = 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USAGE
    try:
        settings = KhipuSettings.from_env()
        return int(args.handler(args, settings) or 0)
    except (InvalidSetting, KafkaConnectionError, RegistryError, UnknownStreamError, LedgerError) as exc:
        print(f"khipu: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (DemoError, BrokerError, KafkaUnavailable, TraceTopicError, StoreError, RuntimeError) as exc:
        print(f"khipu: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="khipu", description="Trace messages through Kafka pipelines.")
    parser.add_argument("--version", action="version", version=f"khipu {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    for name, handler, text in (
        ("up", _up, "start the local stack (broker, Airflow, demo); safe to repeat"),
        ("down", _down, "stop everything `up` started"),
        ("status", _status, "show what the local stack runs"),
    ):
        commands.add_parser(name, help=text, description=text).set_defaults(handler=handler)

    demo = commands.add_parser("demo", help="the demo pipeline with fault injection").add_subparsers(metavar="ACTION")
    run = demo.add_parser(
        "run",
        help="run producer -> processor -> sinks against the broker",
        description="Run the traced demo pipeline and write its ground-truth ledger.",
    )
    amount = run.add_mutually_exclusive_group()
    amount.add_argument("--count", type=int, default=1000, help="messages to produce (default 1000)")
    amount.add_argument("--duration", type=float, metavar="SECONDS", help="produce for this long instead")
    amount.add_argument("--forever", action="store_true", help="run until SIGTERM/SIGINT")
    run.add_argument("--rate", type=float, default=100.0, help="messages per second (default 100)")
    run.add_argument("--sampling", type=float, metavar="PERCENT", help="sampling percent (default: the stream's)")
    run.add_argument(
        "--fault",
        action="append",
        metavar="NAME=RATE",
        help="inject a fault with this probability; repeatable. Names: consumer_skip, processor_drop, "
        "rebalance_drop, offset_rewind, producer_retry, delay, trace_loss",
    )
    run.add_argument("--delay-ms", type=int, default=3000, help="hold time of delayed records (default 3000)")
    run.add_argument("--seed", type=int, default=0, help="fault plan seed (default 0)")
    run.add_argument(
        "--trace-producer-config",
        action="append",
        metavar="KEY=VALUE",
        default=[],
        help="extra librdkafka setting for the demo's trace emitters; repeatable",
    )
    run.add_argument("--run-id", help="run id prefixing message ids (default: random)")
    run.add_argument("--stream", default=DEMO_STREAM, help=f"registry stream to run (default {DEMO_STREAM})")
    run.add_argument("--ledger", type=Path, help="ground-truth ledger file (default <state>/demo/ledger.jsonl)")
    run.set_defaults(handler=_demo_run)
    for action, text in (
        ("pause", "make a demo consumer group stall: it stays a member, stops reading and committing"),
        ("resume", "let a paused demo consumer group go on"),
    ):
        steer = demo.add_parser(action, help=text, description=text)
        steer.add_argument("group", help="a consumer group of the demo stream, e.g. demo-sink-audit")
        steer.add_argument("--stream", default=DEMO_STREAM, help=f"the demo's registry stream (default {DEMO_STREAM})")
        steer.set_defaults(handler=_demo_steer, paused=action == "pause")
    steer_faults = demo.add_parser(
        "faults",
        help="change fault rates of the running demo, e.g. processor_drop=0.2 (raise the loss rate); --reset undoes",
        description="Change fault rates of the running demo: each NAME=RATE overrides the rate it started with.",
    )
    steer_faults.add_argument("rates", nargs="*", metavar="NAME=RATE")
    steer_faults.add_argument("--reset", action="store_true", help="back to the rates the demo started with")
    steer_faults.set_defaults(handler=_demo_faults)
    truth = demo.add_parser("truth", help="summarize a ground-truth ledger per hop")
    truth.add_argument("ledger", type=Path)
    truth.add_argument("--run-id", help="only this run")
    truth.set_defaults(handler=_demo_truth)

    recovery = demo.add_parser(
        "recovery",
        help="did the resends recover what the demo lost? the ground truth, the verdicts and the topics compared",
    )
    recovery.add_argument("--ledger", type=Path, help="ground-truth ledger (default <state>/demo/ledger.jsonl)")
    recovery.add_argument("--stream", default="demo.orders", help="the demo's stream (default demo.orders)")
    recovery.set_defaults(handler=_demo_recovery)

    registry = commands.add_parser("registry", help="the stream registry").add_subparsers(metavar="ACTION")
    check = registry.add_parser("check", help="validate the registry and list streams and hops")
    check.add_argument("path", type=Path, nargs="?", help="registry file (default $KHIPU_REGISTRY)")
    check.set_defaults(handler=_registry_check)

    traces = commands.add_parser("traces", help="the trace topic").add_subparsers(metavar="ACTION")
    count = traces.add_parser("count", help="count traces per hop and type, from the beginning to now")
    count.add_argument("--timeout", type=float, default=60.0, help="seconds to reach the end (default 60)")
    count.set_defaults(handler=_traces_count)

    store = commands.add_parser("store", help="the Khipu store").add_subparsers(metavar="ACTION")
    store.add_parser("migrate", help="create or upgrade the store's schema ($KHIPU_STORE_URL)").set_defaults(
        handler=_store_migrate
    )
    health = commands.add_parser(
        "health", help="consumer health per group and partition: status, lag, time lag and the reason"
    )
    health.add_argument("--cluster", help="cluster name (default $KHIPU_CLUSTER)")
    health.add_argument("--group", help="one consumer group only")
    health.set_defaults(handler=_health)
    verdicts = commands.add_parser("verdicts", help="the detector's verdicts per hop, the newest losses, its heartbeat")
    verdicts.add_argument("--stream", help="one stream only")
    verdicts.add_argument("--minutes", type=float, default=60, help="how far back (default 60)")
    verdicts.set_defaults(handler=_verdicts)
    trace = commands.add_parser(
        "trace", help="one message along its route: every trace (where, when, offset) and every verdict"
    )
    trace.add_argument("message_id")
    trace.set_defaults(handler=_trace)
    history = commands.add_parser(
        "history", help="how a message's verdicts changed: LOST at 10:02, RETRACTED at 11:00: RECEIVED trace at 10:58"
    )
    history.add_argument("message_id")
    history.set_defaults(handler=_history)
    alerts = commands.add_parser("alerts", help="alerts raised, newest last, from the store")
    alerts.add_argument("--minutes", type=float, default=24 * 60, help="how far back (default 1440)")
    alerts.set_defaults(handler=_alerts)
    for reader in (health, verdicts, trace, history, alerts):
        reader.add_argument("--json", action="store_true", help="print JSON instead of text")
    resend = commands.add_parser(
        "resend",
        help="resend confirmed losses (streams whose resend.mode is auto or manual), each exactly once",
        description="Resend confirmed losses now, as the khipu_resend_manual DAG does; --dry-run writes nothing. "
        "Uses the trace cluster's connection ($KHIPU_BOOTSTRAP_SERVERS, KHIPU_KAFKA_*).",
    )
    resend.add_argument("--stream", action="append", default=[], help="a stream (repeatable; default: all)")
    resend.add_argument("--hop", help="one hop id, e.g. 'local/demo.orders -> demo-enricher'")
    resend.add_argument("--message-id", action="append", default=[], help="one message (repeatable)")
    resend.add_argument("--since", help="losses decided at or after this ISO time")
    resend.add_argument("--until", help="losses decided before this ISO time")
    resend.add_argument("--dry-run", action="store_true", help="say what would be resent, write nothing")
    resend.add_argument("--json", action="store_true", help="print the run as JSON")
    resend.set_defaults(handler=_resend)
    exporter = commands.add_parser(
        "exporter",
        help="serve Prometheus metrics on /metrics (KHIPU_EXPORTER_HOST/PORT, optional KHIPU_EXPORTER_TOKEN)",
    )
    exporter.set_defaults(handler=_exporter)

    shown = commands.add_parser(
        "settings",
        help="every KHIPU_* setting in effect, with its source (default, environment, file); secrets masked",
        description="Print every setting in effect and where it came from: the environment, the settings file "
        "$KHIPU_SETTINGS_FILE names, or the default. Secrets are masked.",
    )
    shown.add_argument("--markdown", action="store_true", help="print docs/settings.md's table of every variable")
    shown.add_argument("--json", action="store_true", help="print JSON instead of text")
    shown.set_defaults(handler=_settings)

    bundles = commands.add_parser(
        "airflow-bundles",
        help="write each registry team's resend DAG and print Airflow's DAG bundles (each team sees its own DAGs)",
        description="Write each registry owner's manual resend DAG into TEAMS_FOLDER/<team>/ and print "
        "[dag_processor] dag_bundle_config_list: Khipu's own DAGs (DAGS_FOLDER) for the team khipu-every-stream, "
        "each team's resend DAG for the team (docs/view.md#airflows-own-surfaces). Run it again when the "
        "registry's owners change, then restart Airflow's dag-processor.",
    )
    bundles.add_argument("--teams-folder", type=Path, required=True, help="where each team's bundle is written")
    bundles.add_argument("--dags-folder", type=Path, default=project_root() / "dags", help="Khipu's dags/ folder")
    bundles.add_argument(
        "--no-multi-team",
        action="store_true",
        help="bundles without teams, for an auth manager that grants DAGs one by one (FAB's)",
    )
    bundles.set_defaults(handler=_airflow_bundles)

    topics = commands.add_parser("topics", help="Khipu's own topics").add_subparsers(metavar="ACTION")
    ensure = topics.add_parser("ensure", help="create the trace topic and the lost-messages topic if missing")
    ensure.add_argument("--partitions", type=int, default=4, help="of the trace topic (default 4)")
    ensure.set_defaults(handler=_topics_ensure)
    return parser


def _up(_args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.localstack import stack

    stack.up(settings)
    return 0


def _down(_args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.localstack import stack

    stack.down(settings)
    return 0


def _status(_args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.localstack import stack

    return 0 if stack.status(settings) else 3


def _demo_run(args: argparse.Namespace, settings: KhipuSettings) -> int:
    registry = load_registry(settings.registry_path)
    topology = DemoTopology.from_stream(registry.stream(args.stream))
    if topology.source_topic.cluster != settings.cluster:
        raise DemoConfigError("stream cluster", topology.source_topic.cluster, f"KHIPU_CLUSTER ({settings.cluster})")
    options: dict[str, object] = {}
    if args.run_id:
        options["run_id"] = args.run_id
    config = DemoConfig(
        bootstrap_servers=settings.bootstrap_servers,
        ledger_path=args.ledger or settings.state_dir / "demo" / "ledger.jsonl",
        trace_topic=settings.trace_topic,
        count=None if (args.forever or args.duration) else args.count,
        duration_s=args.duration,
        rate_per_s=args.rate,
        sampling_percent=args.sampling,
        faults=FaultRates.parse(args.fault),
        delay_ms=args.delay_ms,
        seed=args.seed,
        trace_producer_config=_key_values(args.trace_producer_config, "--trace-producer-config"),
        **options,  # type: ignore[arg-type]
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    report = run_demo(config, topology, stop=stop, progress=lambda line: print(line, flush=True))
    print(f"\nrun {report.run_id}: {report.produced} records written by the source; ledger {report.ledger_path}")
    _print_hops(report.hop_summary)
    for location, stats in sorted(report.emitters.items()):
        print(f"emitter {location}: {stats.emitted} traces, {stats.delivered} delivered, {stats.dropped} dropped")
    return 0


def _key_values(items: list[str], flag: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DemoConfigError(flag, item, "KEY=VALUE")
        pairs[key] = value
    return pairs


def _demo_steer(args: argparse.Namespace, settings: KhipuSettings) -> int:
    topology = DemoTopology.from_stream(load_registry(settings.registry_path).stream(args.stream))
    groups = [topology.processor.group, *(sink.group for sink in topology.sinks)]
    if args.group not in groups:
        raise DemoConfigError("group", args.group, "a consumer group of the demo: " + ", ".join(groups))
    control = DemoControl(settings.state_dir / "demo" / "control.json")
    paused = control.set_paused(args.group, args.paused)
    print(f"{args.group} {'paused' if args.paused else 'resumed'}; paused now: {', '.join(sorted(paused)) or 'none'}")
    return 0


def _demo_faults(args: argparse.Namespace, settings: KhipuSettings) -> int:
    if not args.rates and not args.reset:
        raise DemoConfigError("faults", "", "NAME=RATE items (e.g. processor_drop=0.2) or --reset")
    parsed = FaultRates.parse(args.rates).as_dict()
    rates = {name: parsed[name] for name in (item.partition("=")[0] for item in args.rates)}
    control = DemoControl(settings.state_dir / "demo" / "control.json")
    now = control.set_faults(rates, reset=args.reset)
    shown = ", ".join(f"{name}={rate:g}" for name, rate in sorted(now.items())) or "none (the rates it started with)"
    print(f"demo fault rates changed now: {shown}; the running demo applies them within a second")
    return 0


def _resend(args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.reconcile.window import parse_time
    from khipu.registry.model import ResendMode
    from khipu.resend.run import Resender, ResendRequestError, ResendSelection, wait_from_env

    selection = ResendSelection(
        modes=frozenset({ResendMode.AUTO, ResendMode.MANUAL}),
        streams=tuple(args.stream),
        hop=args.hop,
        message_ids=tuple(args.message_id),
        since_ms=parse_time(args.since) if args.since else None,
        until_ms=parse_time(args.until) if args.until else None,
        dry_run=args.dry_run,
    )
    registry = load_registry(settings.registry_path)
    store = Store(settings.store_url)
    try:
        resender = Resender(
            store,
            registry,
            {settings.cluster: settings.kafka()},
            now_ms,
            settings.archive_dir,
            wait_from_env(),
            verdict_archive_dir=settings.verdict_archive_dir,
        )
        try:
            run = resender.run(selection, progress=(lambda line: None) if args.json else print)
        except ResendRequestError as exc:
            print(f"khipu: {exc}", file=sys.stderr)
            return EXIT_USAGE
    finally:
        store.close()
    if args.json:
        _print_json(run.as_dict())
    return EXIT_FAILED if any(o.state == "failed" for o in run.outcomes) else 0


def _store_migrate(_args: argparse.Namespace, settings: KhipuSettings) -> int:
    store = Store(settings.store_url)
    store.migrate()
    print(f"store {store.safe_url} is at the newest schema")
    store.close()
    return 0


def _health(args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.report.service import consumer_report

    store = Store(settings.store_url)
    cluster = args.cluster or settings.cluster
    try:
        report = consumer_report(store, cluster, now_ms(), args.group)
    finally:
        store.close()
    if args.json:
        return _print_json(report)
    if not report.partitions:
        print(f"no health recorded for cluster {cluster!r} yet (the DAG khipu_snapshot_offsets writes it)")
        return 0
    print(f"{'group':24} {'topic':24} {'part':>4} {'status':11} {'lag':>7} {'time lag':>9}  {'since':20} reason")
    for p in report.partitions:
        time_lag = "-" if p.time_lag_ms is None else f"{p.time_lag_ms / 1000:.0f}s"
        print(
            f"{p.group:24} {p.topic:24} {p.partition:>4} {p.status:11} {'-' if p.lag is None else p.lag:>7} "
            f"{time_lag:>9}  {utc_text(p.since_ms):20} {p.reason}"
        )
    return 0


def _verdicts(args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.alerting.thresholds import window_start_ms
    from khipu.detector.model import DETECTOR_QUERY
    from khipu.report.service import LOSS_VERDICTS, check_minutes, check_stream
    from khipu.verdicts.metrics import verdict_counts
    from khipu.verdicts.model import KAFKA_SEMANTICS_KINDS, NOT_COUNTED_DUPLICATES, VerdictKind

    if args.stream is not None:
        check_stream(load_registry(settings.registry_path), args.stream)
    window_ms, at_ms = check_minutes(args.minutes), now_ms()
    since = at_ms - window_ms
    counted_since = window_start_ms(at_ms, window_ms)  # counts come from the minute metrics: whole minutes
    store = Store(settings.store_url)
    try:
        exceptions = store.verdicts.kind_counts(counted_since, excluding=[VerdictKind.DELIVERED.value])
        kinds = verdict_counts(exceptions, store.verdicts.read_metrics(args.stream, since_ms=counted_since))
        lost = store.verdicts.page(verdicts=LOSS_VERDICTS, stream=args.stream, since_ms=since, limit=10)
        late = store.verdicts.page(stream=args.stream, since_ms=since, late_evidence=True, limit=1000)
        beat = store.heartbeat.latest(DETECTOR_QUERY)
    finally:
        store.close()
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for (stream, hop, verdict, cause), number in kinds.items():
        if args.stream in (None, stream):
            counts.setdefault((stream, hop), {})[verdict + (f"/{cause}" if cause else "")] = number
    total = sum(sum(per_hop.values()) for per_hop in counts.values())
    # Kafka working as designed, and reprocessing an exactly-once processor did: shown apart from losses
    kafka_kinds = [kind.value for kind in sorted(KAFKA_SEMANTICS_KINDS)]
    reprocessed = {cause.value for cause in NOT_COUNTED_DUPLICATES}
    apart = dict.fromkeys([*kafka_kinds, "reprocessed"], 0)
    for (stream, _, verdict, cause), number in kinds.items():
        if args.stream not in (None, stream):
            continue
        if verdict in kafka_kinds:
            apart[verdict] += number
        elif verdict == VerdictKind.DUPLICATE.value and cause in reprocessed:
            apart["reprocessed"] += number
    if args.json:
        return _print_json(
            {
                "minutes": args.minutes,
                "verdicts": total,
                "per_hop": [{"stream": s, "hop": h, "kinds": k} for (s, h), k in sorted(counts.items())],
                "newest_losses": lost,
                "not_losses": apart,
                "late_evidence": len(late),
                "heartbeat": beat,
            }
        )
    print(f"{total} verdicts in the last {args.minutes:g} minutes")
    for (stream, hop), per_hop in sorted(counts.items()):
        print(f"{stream:14} {hop:52} " + ", ".join(f"{k} {n}" for k, n in sorted(per_hop.items())))
    if any(apart.values()):
        print(
            f"not losses (Kafka's own semantics): {apart['ABORTED']} ABORTED (transactions that aborted), "
            f"{apart['SUPERSEDED']} SUPERSEDED (compacted behind a later record of their key); "
            f"{apart['reprocessed']} duplicates were an exactly-once processor reprocessing after an abort"
        )
    for row in reversed(lost):
        print(f"{row['verdict']} {row['message_id']} at {row['hop']} [{row['cause']}]: {row['detail']}")
    if late:
        shown = f"{len(late)}+" if len(late) == 1000 else str(len(late))
        print(f"{shown} verdicts have late evidence: the next reconciliation re-decides them (khipu history ID)")
    if beat is None:
        print("detector: no heartbeat yet (the DAG khipu_detector starts it)")
    else:
        age = (now_ms() - int(beat["at_ms"])) / 1000
        print(
            f"detector: last heartbeat {age:.0f}s ago, batch {beat['batch_id']}, {beat['input_rows_per_s']:.0f} "
            f"rows/s in, {beat['state_rows']} messages in flight, caught up: {bool(beat['caught_up'])}"
        )
    return 0


def _trace(args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.report.service import UnknownMessage, message_report

    store = Store(settings.store_url)
    try:
        report = message_report(
            store,
            load_registry(settings.registry_path),
            settings.archive_dir,
            args.message_id,
            now_ms(),
            settings.verdict_archive_dir,
        )
    except UnknownMessage as exc:
        print(f"khipu: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()
    if args.json:
        return _print_json(report)
    if report.verdicts_note:
        print(f"khipu: {report.verdicts_note}", file=sys.stderr)
    attributes = ", ".join(f"{k}={v}" for k, v in sorted(report.attributes.items()))
    print(
        f"message {report.message_id}  stream {report.stream or 'unknown'}"
        + (f"  ({attributes})" if attributes else "")
    )
    for hop in report.hops:
        verdict = hop.verdict
        said = hop.not_reached or "no verdict yet"
        if verdict is not None:
            said = str(verdict["verdict"]) + (f"/{verdict['cause']}" if verdict["cause"] else "")
            said += f" at {utc_text(verdict['decided_ms'])} by {verdict['decided_by']}"
        print(f"{hop.hop_kind:5} {hop.hop}{'' if hop.on_route else '  (not on the route)'}: {said}")
        for trace in hop.traces:
            where = trace.location + (f" ({trace.group})" if trace.group else "")
            position = trace.topic if trace.partition is None else f"{trace.topic}[{trace.partition}]@{trace.offset}"
            print(f"        {trace.type:8} {utc_text(trace.at_ms)}  {where}  {position}")
        if not hop.traces:
            print("        no trace")
        for change in hop.history:
            print(f"        {change['from_verdict'] or '-'} -> {change['to_verdict']} at {utc_text(change['at_ms'])}")
        if verdict is not None and verdict["detail"]:
            print(f"        {verdict['detail']}")
    return 0


def _history(args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.verdicts.archive import VerdictArchive
    from khipu.verdicts.read import verdicts_of, with_first_decisions

    store = Store(settings.store_url)
    try:
        with VerdictArchive(settings.verdict_archive_dir, store) as archive:
            found = verdicts_of(store.verdicts, archive, [args.message_id])
        changes = with_first_decisions(store.verdicts.history(args.message_id), found.rows)
    finally:
        store.close()
    if found.note:
        print(f"khipu: {found.note}", file=sys.stderr)
    current = {row["hop"]: row for row in found.rows}
    if not current:
        print(f"no verdict stored for message {args.message_id!r}", file=sys.stderr)
        return 1
    if args.json:
        return _print_json(
            [
                {"hop": hop, "now": row, "changes": [h for h in changes if h["hop"] == hop]}
                for hop, row in sorted(current.items())
            ]
        )
    for hop, row in sorted(current.items()):
        steps = [
            f"{h['to_verdict']} at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(h['at_ms'] / 1000))} UTC "
            f"({h['decided_by']})" + (f": {_reason(h)}" if h["from_verdict"] else "")
            for h in changes
            if h["hop"] == hop
        ]
        print(f"{hop}: {row['verdict']}" + (f"/{row['cause']}" if row["cause"] else ""))
        for step in steps:
            print(f"    {step}")
        print(f"    now: {row['detail']}")
    return 0


def _reason(change: Mapping[str, object]) -> str:
    """A history entry's reason without the verdict it already names ("retracted: X" after RETRACTED)."""
    reason = str(change["reason"])
    return reason.removeprefix(f"{str(change['to_verdict']).lower()}: ")


def _alerts(args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.report.service import alerts_report, check_minutes

    since = now_ms() - check_minutes(args.minutes)
    store = Store(settings.store_url)
    rows = list(reversed(alerts_report(store, since)))  # oldest first: the newest ends up above the prompt
    store.close()
    if args.json:
        return _print_json(rows)
    for alert in rows:
        sent = (
            ", ".join(f"{name} {outcome}" for name, outcome in alert["deliveries"].items())
            if alert["delivered_ms"]
            else "pending"
        )
        print(f"{utc_text(alert['at_ms'])} {alert['state']:8} {alert['severity']:8} {alert['title']}  [{sent}]")
    print(f"{len(rows)} alert(s) in the last {args.minutes:g} minutes")
    return 0


def _exporter(_args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.report.exporter import ExporterConfig, run_exporter

    run_exporter(settings, ExporterConfig.from_env())
    return 0


def _settings(args: argparse.Namespace, _settings: KhipuSettings) -> int:
    from dataclasses import asdict

    from khipu.config import effective_settings, markdown_table, settings_file, unknown_variables

    if args.markdown:
        print(markdown_table(), end="")
        return 0
    rows = effective_settings()
    if args.json:
        return _print_json([asdict(row) for row in rows])
    path = settings_file()
    print(f"settings file: {path if path is not None else 'none (KHIPU_SETTINGS_FILE is not set)'}")
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            print(f"\n{section}")
        print(f"  {row.variable:40} {row.value or '(unset)':40} {row.source}")
    for name in unknown_variables():
        print(f"khipu: {name} is set but is no Khipu setting (a typo?)", file=sys.stderr)
    return 0


def _print_json(value: object) -> int:
    import json

    from khipu.report.plain import plain

    print(json.dumps(plain(value), indent=2, sort_keys=True))
    return 0


def _demo_recovery(args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.demo.recovery import recovery_report
    from khipu.resend.copies import count_resent
    from khipu.verdicts.archive import VerdictArchive
    from khipu.verdicts.read import all_verdicts

    stream = load_registry(settings.registry_path).stream(args.stream)
    truth = build_truth(read_ledger(args.ledger or settings.state_dir / "demo" / "ledger.jsonl"))
    store = Store(settings.store_url)
    try:
        with VerdictArchive(settings.verdict_archive_dir, store) as archive:
            every = all_verdicts(store.verdicts, archive, stream=stream.name)
        verdicts = [r for r in every if r["message_id"] in truth.messages]
    finally:
        store.close()
    topics = sorted({hop.topic.topic for hop in stream.route.hops if hop.topic.cluster == settings.cluster})
    copies = {m: n for m, n in count_resent(settings.kafka(), topics).items() if m in truth.messages}
    report = recovery_report(truth, verdicts, stream, copies)
    for line in report.lines():
        print(line)
    waiting = Counter(v for v in report.not_resent.values())
    if waiting:
        print("not resent yet, by verdict: " + ", ".join(f"{kind} {n}" for kind, n in sorted(waiting.items())))
    return 0 if report.exact else EXIT_FAILED


def _demo_truth(args: argparse.Namespace, _settings: KhipuSettings) -> int:
    truth = build_truth(read_ledger(args.ledger, run_id=args.run_id))
    print(f"{len(truth.messages)} messages, {sum(m.sampled for m in truth.messages.values())} sampled")
    _print_hops(truth.hop_summary())
    return 0


def _print_hops(summary: dict[str, dict[str, int]]) -> None:
    print(f"{'hop':55} {'messages':>8} {'passes':>7} {'traces':>7}  faults")
    for hop, entry in sorted(summary.items()):
        faults = ", ".join(f"{k}={v}" for k, v in sorted(entry.items()) if k not in ("messages", "passes", "traces"))
        print(f"{hop:55} {entry['messages']:>8} {entry['passes']:>7} {entry['traces']:>7}  {faults}")


def _registry_check(args: argparse.Namespace, settings: KhipuSettings) -> int:
    path = args.path or settings.registry_path
    registry = load_registry(path)
    print(f"{path}: valid; {len(registry.streams)} stream(s) on cluster(s) {', '.join(sorted(registry.clusters))}")
    for stream in registry.streams.values():
        print(
            f"\n{stream.name}  owner {stream.owner}  sampling {stream.sampling_percent:g}%  "
            f"resend {stream.resend.mode.value}"
        )
        for hop in stream.route.hops:
            print(f"  {hop.kind.value:5} {hop.id}")
    return 0


def _traces_count(args: argparse.Namespace, settings: KhipuSettings) -> int:
    tally = tally_traces(read_trace_topic(settings.bootstrap_servers, settings.trace_topic, args.timeout))
    print(f"{settings.trace_topic} on {settings.bootstrap_servers}: {tally.total} traces")
    print(f"{'hop':55} {'type':9} {'traces':>8}")
    for (hop, trace_type), number in sorted(tally.by_hop.items()):
        print(f"{hop:55} {trace_type:9} {number:>8}")
    print(f"emitter marks: {tally.marks}")
    for field, number in sorted(tally.malformed.items()):
        print(f"malformed (field {field}): {number}")
    return 0


def _airflow_bundles(args: argparse.Namespace, settings: KhipuSettings) -> int:
    from khipu.access.dags import bundle_setting, dag_bundles, write_team_dag_files

    owners = load_registry(settings.registry_path).owners
    for path in write_team_dag_files(owners, args.teams_folder.resolve()):
        print(f"wrote {path}", file=sys.stderr)
    multi_team = not args.no_multi_team
    print(bundle_setting(dag_bundles(owners, args.dags_folder.resolve(), args.teams_folder.resolve(), multi_team)))
    return 0


def _topics_ensure(args: argparse.Namespace, settings: KhipuSettings) -> int:
    admin = KafkaAdmin(settings.kafka())
    print(admin.ensure_trace_topic(settings.trace_topic, args.partitions))
    created = admin.ensure_topics({settings.lost_topic: 1})
    print(f"created {settings.lost_topic}" if created else f"{settings.lost_topic} exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
