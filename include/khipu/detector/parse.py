"""From Kafka-source rows (Spark's Kafka schema) to trace rows, decoded in the JVM; malformed records to quarantine.

Each record's value is parsed once in the JVM (``try_parse_json`` to Spark's VARIANT) and checked
there against the trace format (docs/trace-format.md) with the limits of the strict codec
(:mod:`khipu.trace.codec`): exact JSON types (a number is not a string), no field its version
does not define, every name and count in range. No Python runs per record. The few records that
fail go to the quarantine; their reason is worded by the codec itself
(:func:`quarantine_reason`, in the driver), so "valid" and "why not" mean the same here as in
every application that decodes traces. ``tests/integration/detector/test_parse.py`` holds both
decoders to the same table of records.

A record that is a valid trace but names a stream the registry does not define is quarantined
too; the query keeps running.

A record may be a batch: several traces (and marks) joined by a line feed (``khipu.trace.codec.split_record``).
Each record is first exploded into its lines, numbered from 0 in ``source_line`` (a record of one: line 0), and
everything above works per line: a line is decoded, limited and quarantined as a record of one trace was. Only a
valid UTF-8 record holding ``}``, a line feed, ``{`` is split; every other record is its own line 0, untouched.
A record that is not UTF-8 is not split (the JVM cannot split its bytes without decoding them): it is
quarantined whole.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from khipu.trace.codec import (
    BATCH_SPLIT_PATTERN,
    MAX_ATTRIBUTE_CHARS,
    MAX_ATTRIBUTES,
    MAX_COUNT,
    MAX_ID_CHARS,
    MAX_MARK_BYTES,
    MAX_MARK_ENTRIES,
    MAX_PARTITION,
    MAX_PREV_OFFSETS,
    MAX_TRACE_BYTES,
    READABLE_VERSIONS,
    TraceDecodeError,
    decode_record,
    mark_fields,
    trace_fields,
)
from khipu.trace.keys import KEY_HASH_PATTERN
from khipu.trace.model import EmitterMark
from khipu.trace.names import MAX_NAME_CHARS

TRACE_COLUMNS = (
    "message_id string, stream string, location string, cluster string, type string, timestamp_ms long, "
    "topic string, partition int, offset long, `group` string, emitter_id string, emitter_seq long, "
    "sampling_percent double, attributes string, key_hash string, tombstone boolean, transactional boolean, "
    "read_uncommitted boolean"
)
RECEIVED_SCHEMA = "array<struct<cluster:string, topic:string, partition:int, offset:long>>"
POINTER_COLUMNS = f"prev_offsets array<long>, received {RECEIVED_SCHEMA}"  # back-pointers; a mark's list
PARSED_SCHEMA = (
    f"{TRACE_COLUMNS}, {POINTER_COLUMNS}, malformed boolean, raw_value binary, source_topic string, "
    "source_partition int, source_offset long, source_line int, kafka_timestamp_ms long"
)  # source_line: the line of a batch record (0: a record of one trace)
TRACE_NAMES = [part.split()[0].strip("`") for part in TRACE_COLUMNS.split(", ")]
_JSON = "_j"
_KEY_HASH = KEY_HASH_PATTERN.pattern  # the same regular expression in Java's dialect


# -- the JVM's checks, one small expression per rule of the trace format ------------------------------


# Typed extraction is always try_variant_get: Spark may evaluate a cast before the type test guarding
# it (common subexpressions are hoisted), and a failing variant_get cast throws instead of answering.


def _kind(path: str) -> str:
    """The JSON type at ``path``: STRING, BIGINT, DOUBLE, DECIMAL(p,s), BOOLEAN, VOID (null), OBJECT<..>,
    ARRAY<..>; SQL NULL when absent."""
    return f"schema_of_variant(variant_get({_JSON}, '{path}'))"


def _absent(path: str) -> str:
    return f"coalesce({_kind(path)} = 'VOID', true)"


def _name(path: str, max_chars: int = MAX_NAME_CHARS) -> str:
    return (
        f"coalesce({_kind(path)} = 'STRING' "
        f"AND char_length(try_variant_get({_JSON}, '{path}', 'string')) BETWEEN 1 AND {max_chars}, false)"
    )


def _count(path: str, largest: int = MAX_COUNT) -> str:
    """An integer >= 0 that fits a long, or an int (a partition): the codec's 'integer >= 0'."""
    value = f"try_variant_get({_JSON}, '{path}', 'bigint')"
    return f"coalesce({_kind(path)} = 'BIGINT' AND {value} >= 0 AND {value} <= {largest}, false)"


def _only_fields(allowed: Iterable[str]) -> str:
    keys = ", ".join(f"'{name}'" for name in sorted(allowed))
    return (
        f"coalesce(size(array_except(map_keys(try_variant_get({_JSON}, '$', 'map<string,variant>')), "
        f"array({keys}))) = 0, false)"
    )


def _version(version: int) -> str:
    return f"coalesce({_kind('$.v')} = 'BIGINT' AND try_variant_get({_JSON}, '$.v', 'bigint') = {version}, false)"


def _sampling_percent() -> str:
    value = f"try_variant_get({_JSON}, '$.sampling_percent', 'double')"
    kind = _kind("$.sampling_percent")
    number = f"({kind} IN ('BIGINT', 'DOUBLE') OR {kind} LIKE 'DECIMAL%')"
    return f"coalesce({number} AND {value} > 0 AND {value} <= 100, false)"


def _attributes() -> str:
    entries = f"try_variant_get({_JSON}, '$.attributes', 'map<string,variant>')"
    return (
        f"({_absent('$.attributes')} OR coalesce({_kind('$.attributes')} LIKE 'OBJECT<%' "
        f"AND size({entries}) <= {MAX_ATTRIBUTES} "
        f"AND forall(map_values({entries}), a -> schema_of_variant(a) = 'STRING' "
        f"AND char_length(try_variant_get(a, '$', 'string')) <= {MAX_ATTRIBUTE_CHARS}), false))"
    )


def _prev_offsets(sent: str) -> str:
    kind = _kind("$.prev_offsets")
    offsets = f"try_variant_get({_JSON}, '$.prev_offsets', 'array<bigint>')"
    empty = f"({_absent('$.prev_offsets')} OR coalesce({kind} = 'ARRAY<VOID>' AND size({offsets}) = 0, false))"
    listed = (
        f"coalesce({kind} = 'ARRAY<BIGINT>' AND size({offsets}) <= {MAX_PREV_OFFSETS} "
        f"AND forall({offsets}, o -> o >= 0), false)"
    )
    return f"({empty} OR (NOT {sent} AND {listed}))"


def _version_3_fields(sent: str) -> str:
    """``key_hash`` (SENT only, 16 lowercase hex digits) and the flags, each a JSON boolean that may say true only on
    the type of trace it is about; all absent or null is fine (the codec's _key_hash and _flag)."""
    key_kind = _kind("$.key_hash")
    key = f"try_variant_get({_JSON}, '$.key_hash', 'string')"
    key_ok = (
        f"({_absent('$.key_hash')} OR coalesce({key_kind} = 'STRING' AND {sent} AND {key} RLIKE '{_KEY_HASH}', false))"
    )

    def flag(name: str, allowed: str) -> str:
        value = f"try_variant_get({_JSON}, '$.{name}', 'boolean')"
        typed = f"{_kind(f'$.{name}')} = 'BOOLEAN' AND (NOT {value} OR {allowed})"
        return f"({_absent(f'$.{name}')} OR coalesce({typed}, false))"

    flags = [flag("tombstone", sent), flag("transactional", sent), flag("read_uncommitted", f"NOT {sent}")]
    return " AND ".join([key_ok, *flags])


def _received() -> str:
    """A mark's list of ``[cluster, topic, partition, offset]`` entries."""
    entries = f"try_variant_get({_JSON}, '$.received', 'array<variant>')"
    names = [
        f"schema_of_variant(variant_get(e, '$[{i}]')) = 'STRING' "
        f"AND char_length(try_variant_get(e, '$[{i}]', 'string')) BETWEEN 1 AND {MAX_NAME_CHARS}"
        for i in (0, 1)
    ]
    counts = [
        f"schema_of_variant(variant_get(e, '$[{i}]')) = 'BIGINT' AND try_variant_get(e, '$[{i}]', 'bigint') >= 0 "
        f"AND try_variant_get(e, '$[{i}]', 'bigint') <= {largest}"
        for i, largest in ((2, MAX_PARTITION), (3, MAX_COUNT))
    ]
    entry = " AND ".join(
        ["schema_of_variant(e) LIKE 'ARRAY<%'", "size(try_variant_get(e, '$', 'array<variant>')) = 4", *names, *counts]
    )
    return (
        f"({_absent('$.received')} OR coalesce({_kind('$.received')} LIKE 'ARRAY<%' "
        f"AND size({entries}) <= {MAX_MARK_ENTRIES} AND forall({entries}, e -> coalesce({entry}, false)), false))"
    )


def _valid_trace(known_streams: Iterable[str]) -> str:
    is_sent = f"coalesce(try_variant_get({_JSON}, '$.type', 'string') = 'SENT', false)"
    is_received = f"coalesce(try_variant_get({_JSON}, '$.type', 'string') = 'RECEIVED', false)"
    versions = " OR ".join(f"({_version(v)} AND {_only_fields(trace_fields(v))})" for v in READABLE_VERSIONS)
    known = ", ".join(f"'{name}'" for name in sorted(known_streams)) or "NULL"
    rules = [
        f"octet_length(value) <= {MAX_TRACE_BYTES}",
        f"({versions})",
        _name("$.message_id", MAX_ID_CHARS),
        *(_name(f"$.{field}") for field in ("stream", "location", "cluster", "topic", "emitter_id")),
        f"{_kind('$.type')} = 'STRING' AND ({is_sent} OR {is_received})",
        f"(({is_received} AND {_name('$.group')}) OR ({is_sent} AND {_absent('$.group')}))",
        *(_count(f"$.{field}") for field in ("timestamp_ms", "offset", "emitter_seq")),
        _count("$.partition", MAX_PARTITION),
        _sampling_percent(),
        _attributes(),
        _prev_offsets(is_sent),
        _version_3_fields(is_sent),
        f"try_variant_get({_JSON}, '$.stream', 'string') IN ({known})",
    ]
    return " AND ".join(f"({rule})" for rule in rules)


def _valid_mark() -> str:
    versions = " OR ".join(f"({_version(v)} AND {_only_fields(mark_fields(v))})" for v in READABLE_VERSIONS)
    rules = [
        f"octet_length(value) <= {MAX_MARK_BYTES}",
        f"({versions})",
        _name("$.emitter_id"),
        _name("$.location"),
        _count("$.emitter_seq"),
        _count("$.timestamp_ms"),
        _received(),
    ]
    return " AND ".join(f"({rule})" for rule in rules)


def _string(path: str) -> Column:
    return F.expr(f"try_variant_get({_JSON}, '{path}', 'string')")


def _typed(path: str, spark_type: str) -> Column:
    return F.expr(f"try_variant_get({_JSON}, '{path}', '{spark_type}')")


# -- the common case, checked cheaply: a trace without attributes, its shape read once ------------------

# Each field's JSON types as ``schema_of_variant`` names them; optional fields may be absent. A record of exactly
# this shape (its fields sorted, as schema_of_variant lists them) needs only its values checked, on the columns
# extracted anyway; any other record (attributes, a mark, anything odd) gets every rule above.
_SHAPE_TYPES = {
    "attributes": r"OBJECT<>",
    "cluster": "STRING",
    "emitter_id": "STRING",
    "emitter_seq": "BIGINT",
    "group": "(?:STRING|VOID)",
    "key_hash": "(?:STRING|VOID)",
    "location": "STRING",
    "message_id": "STRING",
    "offset": "BIGINT",
    "partition": "BIGINT",
    "prev_offsets": "ARRAY<(?:BIGINT|VOID)>",
    "read_uncommitted": "(?:BOOLEAN|VOID)",
    "sampling_percent": r"(?:BIGINT|DOUBLE|DECIMAL\(\d+,\d+\))",
    "stream": "STRING",
    "timestamp_ms": "BIGINT",
    "tombstone": "(?:BOOLEAN|VOID)",
    "topic": "STRING",
    "transactional": "(?:BOOLEAN|VOID)",
    "type": "STRING",
    "v": "BIGINT",
}
_OPTIONAL = frozenset(
    {"attributes", "group", "prev_offsets", "key_hash", "tombstone", "transactional", "read_uncommitted"}
)


def _shape_pattern(version: int) -> str:
    """The regular expression of the plain shape of a trace of this format version."""
    fields = sorted(trace_fields(version))
    unknown = set(fields) - set(_SHAPE_TYPES)
    if unknown:  # a field the format gained: give it a type here
        raise ValueError(f"trace fields without a shape type: {sorted(unknown)}")
    if fields[-1] in _OPTIONAL:
        raise ValueError(f"the last trace field in order, {fields[-1]!r}, must be required")
    parts = [
        (f"(?:{name}: {_SHAPE_TYPES[name]}, )?" if name in _OPTIONAL else f"{name}: {_SHAPE_TYPES[name]}, ")
        for name in fields[:-1]
    ]
    return "^OBJECT<" + "".join(parts) + f"{fields[-1]}: {_SHAPE_TYPES[fields[-1]]}>$"


def _plain_shape() -> Column:
    """Whether the record has the plain shape of its version's trace."""
    plain = F.lit(False)
    for version in READABLE_VERSIONS:
        plain = plain | ((F.col("_v") == version) & F.col("_shape").rlike(_shape_pattern(version)))
    return F.coalesce(plain, F.lit(False))


def _plain_values(known_streams: Iterable[str]) -> str:
    """The rules of a trace of a known shape (the encoder's template, or the plain variant shape), on the columns
    extracted from it: their JSON types are known to be right, only their values are checked."""
    known = ", ".join(f"'{name}'" for name in sorted(known_streams)) or "NULL"
    names = " AND ".join(
        f"char_length(`{name}`) BETWEEN 1 AND {MAX_NAME_CHARS}"
        for name in ("stream", "location", "cluster", "topic", "emitter_id")
    )
    return (
        f"octet_length(value) <= {MAX_TRACE_BYTES} AND char_length(message_id) BETWEEN 1 AND {MAX_ID_CHARS} "
        f"AND {names} "
        f"AND ((type = 'RECEIVED' AND char_length(`group`) BETWEEN 1 AND {MAX_NAME_CHARS}) "
        "OR (type = 'SENT' AND `group` IS NULL)) "
        f"AND timestamp_ms >= 0 AND `offset` >= 0 AND emitter_seq >= 0 AND `partition` BETWEEN 0 AND {MAX_PARTITION} "
        "AND sampling_percent > 0 AND sampling_percent <= 100 "
        f"AND (_prev IS NULL OR size(_prev) = 0 OR (type <> 'SENT' AND size(_prev) <= {MAX_PREV_OFFSETS} "
        "AND coalesce(forall(_prev, o -> o >= 0), false))) "
        f"AND (key_hash IS NULL OR (type = 'SENT' AND key_hash RLIKE '{_KEY_HASH}')) "
        "AND (NOT coalesce(tombstone, false) OR type = 'SENT') "
        "AND (NOT coalesce(transactional, false) OR type = 'SENT') "
        "AND (NOT coalesce(read_uncommitted, false) OR type = 'RECEIVED') "
        f"AND stream IN ({known})"
    )


# -- the commonest case of all, cheaper still: a trace exactly as khipu's own encoder writes it ----------

# Java regular expressions; every repetition possessive (no backtracking, no recursion on long input).
_STRING = r'"[^"\\\x00-\x1f]*+(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*+)*+"'  # a JSON string
_INTEGER = r"(?:0|[1-9][0-9]{0,18}+)"  # >= 0, as an integer
_NUMBER = r"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][+-]?+[0-9]++)?+"
# khipu.trace.codec.encode_trace's template (format version 3, no attributes; the version-3 fields in their order,
# each only when true or set): matched, its fields are read by from_json with these types (a JSON string where a
# string is due, an integer where one is)
ENCODER_TEMPLATE = (
    r'^\{"v":3,"message_id":<S>,"stream":<S>,"location":<S>,"cluster":<S>,"type":"(?:SENT|RECEIVED)",'
    r'"timestamp_ms":<N>,"topic":<S>,"partition":<N>,"offset":<N>,"group":(?:null|<S>),"emitter_id":<S>,'
    r'"emitter_seq":<N>,"sampling_percent":<F>,"attributes":\{\},"prev_offsets":\[(?:<N>(?:,<N>)*+)?+\]'
    r'(?:,"key_hash":<S>)?+(?:,"tombstone":true)?+(?:,"transactional":true)?+(?:,"read_uncommitted":true)?+\}$'
)
for _mark_, _pattern_ in (("<S>", _STRING), ("<N>", _INTEGER), ("<F>", _NUMBER)):
    ENCODER_TEMPLATE = ENCODER_TEMPLATE.replace(_mark_, _pattern_)
_TEMPLATE_SCHEMA = (
    "message_id string, stream string, location string, cluster string, type string, timestamp_ms bigint, "
    "topic string, partition bigint, offset bigint, `group` string, emitter_id string, emitter_seq bigint, "
    "sampling_percent double, prev_offsets array<bigint>, key_hash string, tombstone boolean, transactional boolean, "
    "read_uncommitted boolean"
)


def _field(name: str, variant: Column) -> Column:
    """A field read from the template's parse for a templated record, else from its variant."""
    return F.when(F.col("_tpl"), F.col(f"_t.`{name}`")).otherwise(variant)


def record_lines(kafka_rows: DataFrame) -> DataFrame:
    """Each Kafka row as the lines of its value: ``value`` (binary) one line, ``source_line`` its number (0 for a
    record of one trace), ``_utf8`` whether the record is valid UTF-8 (so is each of its lines).

    Only a valid UTF-8 value holding ``}``, a line feed, ``{`` is split (at
    :data:`khipu.trace.codec.BATCH_SPLIT_PATTERN`, as :func:`khipu.trace.codec.split_record` splits); any other
    value is its own line, its bytes untouched."""
    record = F.col("value").cast("string")
    utf8 = F.expr("is_valid_utf8(CAST(value AS STRING))").alias("_utf8")
    records = kafka_rows.select("value", "topic", "partition", "offset", "timestamp", utf8)
    batch = F.col("_utf8") & record.contains("}\n{")
    split = F.split(record, BATCH_SPLIT_PATTERN).cast("array<binary>")
    return records.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "_utf8",
        F.posexplode(F.when(batch, split).otherwise(F.array("value"))).alias("source_line", "value"),
    )


def parse_traces(kafka_rows: DataFrame, known_streams: Iterable[str]) -> DataFrame:
    """Decode a DataFrame of Spark's Kafka schema (in the JVM), line by line (:func:`record_lines`); split it with
    :func:`valid`.

    Three ways, each at most as lenient as the next: a line exactly as khipu's encoder writes a trace is read
    with ``from_json`` (its shape checked by one regular expression); any other is parsed to a VARIANT, and
    one of the plain variant shape has only its values checked; everything else gets every rule."""
    streams = sorted(set(known_streams))
    is_mark = f"coalesce({_kind('$.mark')} = 'BOOLEAN' AND try_variant_get({_JSON}, '$.mark', 'boolean'), false)"
    text = F.col("value").cast("string")
    decoded = (
        record_lines(kafka_rows)
        .withColumn("_tpl", F.col("_utf8") & text.rlike(ENCODER_TEMPLATE))
        .withColumn("_t", F.when(F.col("_tpl"), F.from_json(text, _TEMPLATE_SCHEMA)))
        .withColumn(_JSON, F.when(F.col("_utf8") & ~F.col("_tpl"), F.expr("try_parse_json(CAST(value AS STRING))")))
        .withColumn("_shape", F.expr(f"schema_of_variant({_JSON})"))
        .withColumn("_v", F.expr(f"try_variant_get({_JSON}, '$.v', 'bigint')"))
        .withColumn("_plain", _plain_shape())
        .withColumn("_mark", F.expr(f"NOT _tpl AND NOT _plain AND {is_mark}"))
    )
    full = F.expr(
        f"{_JSON} IS NOT NULL AND _shape LIKE 'OBJECT<%' "
        f"AND CASE WHEN _mark THEN {_valid_mark()} ELSE {_valid_trace(streams)} END"
    )
    entries = F.expr(
        f"transform(try_variant_get({_JSON}, '$.received', 'array<variant>'), e -> named_struct("
        "'cluster', try_variant_get(e, '$[0]', 'string'), 'topic', try_variant_get(e, '$[1]', 'string'), "
        "'partition', try_variant_get(e, '$[2]', 'int'), 'offset', try_variant_get(e, '$[3]', 'bigint')))"
    )
    trace = ~F.col("_mark")
    attributes = _typed("$.attributes", "map<string,string>")
    prev = _field("prev_offsets", _typed("$.prev_offsets", "array<bigint>"))
    extracted = decoded.select(
        F.when(trace, _field("message_id", _string("$.message_id"))).alias("message_id"),
        F.when(trace, _field("stream", _string("$.stream"))).alias("stream"),
        _field("location", _string("$.location")).alias("location"),
        F.when(trace, _field("cluster", _string("$.cluster"))).alias("cluster"),
        F.when(F.col("_mark"), F.lit("MARK")).otherwise(_field("type", _string("$.type"))).alias("type"),
        _field("timestamp_ms", _typed("$.timestamp_ms", "bigint")).alias("timestamp_ms"),
        F.when(trace, _field("topic", _string("$.topic"))).alias("topic"),
        F.when(trace, _field("partition", _typed("$.partition", "bigint"))).alias("_partition"),
        F.when(trace, _field("offset", _typed("$.offset", "bigint"))).alias("offset"),
        F.when(trace, _field("group", _string("$.group"))).alias("group"),
        _field("emitter_id", _string("$.emitter_id")).alias("emitter_id"),
        _field("emitter_seq", _typed("$.emitter_seq", "bigint")).alias("emitter_seq"),
        F.when(trace, _field("sampling_percent", _typed("$.sampling_percent", "double"))).alias("sampling_percent"),
        F.when(trace & ~F.col("_tpl") & ~F.col("_plain") & (F.size(attributes) > 0), F.to_json(attributes)).alias(
            "attributes"
        ),
        F.when(trace, _field("key_hash", _string("$.key_hash"))).alias("key_hash"),
        *(
            F.when(trace, F.coalesce(_field(flag, _typed(f"$.{flag}", "boolean")), F.lit(False))).alias(flag)
            for flag in ("tombstone", "transactional", "read_uncommitted")
        ),
        F.when(trace, prev).alias("_prev"),
        F.when(F.col("_mark") & (F.size(entries) > 0), entries).alias("received"),
        "_tpl",
        "_plain",
        "_shape",
        "_mark",
        "value",
        F.col(_JSON),
        F.col("topic").alias("source_topic"),
        F.col("partition").alias("source_partition"),
        F.col("offset").alias("source_offset"),
        F.col("source_line").cast("int").alias("source_line"),
        F.expr("unix_millis(timestamp)").alias("kafka_timestamp_ms"),
    ).withColumn("partition", F.col("_partition").try_cast("int"))
    known_shape = (F.col("_tpl") | F.col("_plain")) & F.expr(f"coalesce({_plain_values(streams)}, false)")
    checked = extracted.withColumn("_ok", F.when(known_shape, F.lit(True)).otherwise(full))
    return checked.select(
        *[F.col(f"`{name}`") for name in TRACE_NAMES],
        F.when(F.size("_prev") > 0, F.col("_prev")).alias("prev_offsets"),
        "received",
        (~F.col("_ok")).alias("malformed"),
        F.when(~F.col("_ok"), F.col("value")).alias("raw_value"),
        "source_topic",
        "source_partition",
        "source_offset",
        "source_line",
        "kafka_timestamp_ms",
    )


def valid(parsed: DataFrame, with_pointers: bool = False) -> DataFrame:
    """The traces (emitter marks left out), with their back-pointers if asked."""
    columns = [*[f"`{name}`" for name in TRACE_NAMES], *(["prev_offsets"] if with_pointers else [])]
    return parsed.where("NOT malformed AND type <> 'MARK'").select(*columns)


def quarantine_reason(raw: bytes | None, known_streams: Iterable[str]) -> str:
    """Why the JVM rejected a record (a line of a batch record), in the codec's words (the codec is the
    specification)."""
    try:
        record = decode_record(raw)
    except TraceDecodeError as exc:
        return str(exc)
    if isinstance(record, EmitterMark):
        return "an emitter mark the JVM decoder rejected though the codec accepts it (report this as a bug)"
    known = sorted(set(known_streams))
    if record.stream not in known:
        return f"unknown stream {record.stream!r}; the registry defines: {', '.join(known) or 'none'}"
    return "a trace the JVM decoder rejected though the codec accepts it (report this as a bug)"
