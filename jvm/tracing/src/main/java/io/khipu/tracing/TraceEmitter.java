package io.khipu.tracing;

import java.lang.management.ManagementFactory;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import javax.management.ObjectName;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Sends traces to the trace topic without ever blocking or throwing into the application (the Python library's
 * {@code khipu.tracing.emitter}, with the same sequence numbers, back-pointers and marks).
 *
 * <p>The application's threads (and a producer's I/O thread, which acknowledges) only build a trace and offer it to a
 * bounded queue: when the queue is full (the trace channel slow or down) the trace is dropped at once and counted. One
 * sender thread encodes queued traces and hands them to the trace producer (idempotent, acks=all) several to a record
 * (a batch, {@link TraceFormat#joinBatch}: what gathered in khipu.batch.linger.ms after the sender woke, up to
 * {@link TraceFormat#BATCH_MAX_TRACES} traces or {@link TraceFormat#BATCH_MAX_BYTES}), and publishes the emitter's
 * marks. Records are keyed by the emitter's id: its traces and marks stay in order on one partition. Every trace gets its sequence number before any
 * drop, so the detector sees the gap. One emitter serves every client of the JVM with the same location and trace
 * cluster (a Kafka Streams application's producers and consumers share one).
 */
public final class TraceEmitter implements TraceEmitterMXBean {
    public static final int BACK_POINTERS = 3;
    private static final long[] NO_OFFSETS = new long[0];
    private static final Logger log = LoggerFactory.getLogger(TraceEmitter.class);
    private static final long WARN_INTERVAL_NS = TimeUnit.SECONDS.toNanos(60);
    private static final long LINGER_SLICE_NANOS = TimeUnit.MILLISECONDS.toNanos(5); // how often a linger looks again
    private static final Map<Object, TraceEmitter> SHARED = new HashMap<>();
    private static final Map<Object, Integer> USERS = new HashMap<>();

    private final TracingConfig config;
    private final String emitterId;
    private final byte[] recordKey;
    private final ArrayBlockingQueue<Trace> queue;
    private final KafkaProducer<byte[], byte[]> producer;
    private final Thread sender;
    private final AtomicLong seq = new AtomicLong();
    private final AtomicLong emitted = new AtomicLong();
    private final AtomicLong accepted = new AtomicLong();
    private final AtomicLong delivered = new AtomicLong();
    private final AtomicLong droppedQueueFull = new AtomicLong();
    private final AtomicLong droppedInvalid = new AtomicLong();
    private final AtomicLong failedDelivery = new AtomicLong();
    private final AtomicLong droppedAtClose = new AtomicLong(); // refused while closing, or still queued at the end
    private final AtomicLong stranded = new AtomicLong(); // accepted, then still queued when close gave up
    private final Object finalCounts = new Object(); // close() settles the counters once; later callbacks count nothing
    private boolean countsFinal;
    // per partition received from: its newest RECEIVED offsets (newest first) and when the newest was traced
    private final Map<Partition, Recent> received = new HashMap<>();
    private long markedAtEmitted;
    private volatile boolean closing;
    private volatile long lastWarningNs = System.nanoTime() - WARN_INTERVAL_NS;
    private ObjectName mbeanName;

    private record Partition(String cluster, String topic, int partition) {}

    private record Recent(long[] offsets, long atNanos) {}

    /** The emitter for this configuration, shared with the JVM's other clients of the same location. */
    public static TraceEmitter acquire(TracingConfig config) {
        synchronized (SHARED) {
            Object key = config.emitterKey();
            TraceEmitter emitter = SHARED.get(key);
            if (emitter == null) {
                emitter = new TraceEmitter(config);
                SHARED.put(key, emitter);
            }
            USERS.merge(key, 1, Integer::sum);
            return emitter;
        }
    }

    /** A client is done with its emitter; the last one closes it (flushing, bounded by khipu.close.timeout.ms). */
    public void release() {
        Object key = config.emitterKey();
        synchronized (SHARED) {
            int left = USERS.merge(key, -1, Integer::sum);
            if (left > 0) {
                return;
            }
            USERS.remove(key);
            SHARED.remove(key);
        }
        close();
    }

    TraceEmitter(TracingConfig config) {
        this.config = config;
        this.emitterId = config.location() + "-" + Sampling.randomHex(4);
        this.recordKey = emitterId.getBytes(java.nio.charset.StandardCharsets.UTF_8);
        this.queue = new ArrayBlockingQueue<>(config.queueMaxTraces());
        Map<String, Object> settings = new HashMap<>(config.traceProducerConfig());
        settings.put("client.id", emitterId);
        settings.put("acks", "all");
        settings.put("enable.idempotence", true);
        settings.putIfAbsent("linger.ms", 20);
        settings.putIfAbsent("max.block.ms", 10_000);
        settings.put("delivery.timeout.ms", config.deliveryTimeoutMs());
        settings.putIfAbsent("request.timeout.ms", Math.min(30_000, config.deliveryTimeoutMs() - 100));
        KafkaProducer<byte[], byte[]> built;
        try {
            built = new KafkaProducer<>(settings, new ByteArraySerializer(), new ByteArraySerializer());
        } catch (KafkaException e) { // e.g. the trace cluster's names do not resolve: the application still runs
            built = null;
            log.error("trace emitter {}: no trace producer ({}); every trace of location '{}' is dropped and counted "
                    + "as failed", emitterId, e.getMessage(), config.location());
        }
        this.producer = built;
        this.sender = new Thread(this::sendLoop, "khipu-emitter-" + config.location());
        this.sender.setDaemon(true);
        this.sender.start();
        try {
            mbeanName = new ObjectName("io.khipu.tracing:type=TraceEmitter,id=" + ObjectName.quote(emitterId));
            ManagementFactory.getPlatformMBeanServer().registerMBean(this, mbeanName);
        } catch (Exception e) {
            mbeanName = null;
            log.warn("trace emitter {}: counters not registered over JMX: {}", emitterId, e.toString());
        }
        log.info("trace emitter {} started: traces of location '{}' go to topic '{}' at {}", emitterId,
                config.location(), config.traceTopic(), config.traceProducerConfig().get("bootstrap.servers"));
    }

    // -- what the interceptors call ------------------------------------------------------------------------------------

    /** The broker acknowledged a traced write: {@code timestampMs} is the record's own timestamp (null: not known). */
    public void emitSent(TraceContext context, String cluster, String topic, int partition, long offset,
            Long timestampMs, String keyHash, boolean tombstone, boolean transactional) {
        long number = seq.getAndIncrement();
        long at = timestampMs != null ? timestampMs : System.currentTimeMillis();
        publish(new Trace(context.messageId(), context.stream(), config.location(), cluster, TraceType.SENT, at, topic,
                partition, offset, null, emitterId, number, context.samplingPercent(), Map.of(), NO_OFFSETS, keyHash,
                tombstone, transactional, false));
    }

    /** Consumer group {@code group} received a traced record. */
    public void emitReceived(TraceContext context, String cluster, String topic, int partition, long offset,
            String group, Map<String, String> attributes, boolean readUncommitted) {
        long number = seq.getAndIncrement();
        long at = System.currentTimeMillis();
        long[] previous;
        Partition where = new Partition(cluster, topic, partition);
        synchronized (received) {
            Recent recent = received.get(where);
            previous = recent == null ? new long[0] : recent.offsets();
            long[] newest = new long[Math.min(BACK_POINTERS, previous.length + 1)];
            newest[0] = offset;
            System.arraycopy(previous, 0, newest, 1, newest.length - 1);
            received.put(where, new Recent(newest, System.nanoTime()));
        }
        long[] pointers = previous;
        publish(new Trace(context.messageId(), context.stream(), config.location(), cluster, TraceType.RECEIVED, at,
                topic, partition, offset, group, emitterId, number, context.samplingPercent(), attributes, pointers,
                null, false, false, readUncommitted));
    }

    private void publish(Trace trace) {
        emitted.incrementAndGet();
        if (closing) {
            droppedAtClose.incrementAndGet();
        } else if (queue.offer(trace)) {
            accepted.incrementAndGet();
        } else {
            droppedQueueFull.incrementAndGet();
            warn("trace queue full ({} traces): dropping traces until the trace channel catches up",
                    config.queueMaxTraces());
        }
    }

    // -- the sender thread ------------------------------------------------------------------------------------------------

    private void sendLoop() {
        long nextMark = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(config.markIntervalMs());
        List<Trace> drained = new ArrayList<>(TraceFormat.BATCH_MAX_TRACES);
        while (!closing || !queue.isEmpty()) { // closing: what is queued goes out, then the last mark
            try {
                Trace first = queue.poll(100, TimeUnit.MILLISECONDS);
                if (first != null) {
                    drained.add(first);
                    linger();
                    queue.drainTo(drained, TraceFormat.BATCH_MAX_TRACES - 1);
                    send(drained);
                    drained.clear();
                }
                if (System.nanoTime() >= nextMark && !closing) {
                    nextMark = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(config.markIntervalMs());
                    mark();
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return;
            } catch (Throwable e) { // the sender never dies: a bad moment costs traces, counted, never the thread
                warn("trace emitter error: {}", e.toString());
            }
        }
        try {
            mark(); // the last number of the sequence, after every trace
        } catch (RuntimeException e) {
            warn("emitter mark not sent: {}", e.toString());
        }
    }

    /**
     * Let a batch gather for up to khipu.batch.linger.ms after its first trace: woken for every trace, a sparse stream
     * (1 % sampled) cost a record, a send and two thread wake-ups per trace. It stops early when a batch is full, the
     * bounded queue is half full, the emitter closes ({@link #close} unparks it) or the thread is interrupted.
     */
    private void linger() {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(config.batchLingerMs());
        int halfQueue = Math.max(1, config.queueMaxTraces() / 2);
        while (!closing && !Thread.currentThread().isInterrupted()) {
            int queued = queue.size();
            long left = deadline - System.nanoTime();
            if (left <= 0 || queued >= TraceFormat.BATCH_MAX_TRACES - 1 || queued >= halfQueue) {
                return;
            }
            LockSupport.parkNanos(this, Math.min(left, LINGER_SLICE_NANOS));
        }
    }

    /** Encode traces and send them, as few records as {@link TraceFormat#BATCH_MAX_BYTES} allows. */
    private void send(List<Trace> traces) {
        List<byte[]> batch = new ArrayList<>(traces.size());
        int bytes = 0;
        for (Trace trace : traces) {
            byte[] encoded;
            try {
                encoded = TraceFormat.encode(trace);
            } catch (RuntimeException e) { // tracing never throws into the application it observes
                droppedInvalid.incrementAndGet();
                warn("trace for message {} dropped: {}", trace.messageId(), e.toString());
                continue;
            }
            if (!batch.isEmpty() && bytes + encoded.length > TraceFormat.BATCH_MAX_BYTES) {
                sendBatch(batch);
                batch = new ArrayList<>(traces.size());
                bytes = 0;
            }
            batch.add(encoded);
            bytes += encoded.length + 1;
        }
        if (!batch.isEmpty()) {
            sendBatch(batch);
        }
    }

    private void sendBatch(List<byte[]> batch) {
        int traces = batch.size();
        if (producer == null) {
            countFailed(traces);
            return;
        }
        try {
            producer.send(new ProducerRecord<>(config.traceTopic(), null, System.currentTimeMillis(), recordKey,
                    TraceFormat.joinBatch(batch)), (metadata, error) -> {
                        if (error == null) {
                            countDelivered(traces);
                        } else {
                            countFailed(traces);
                            warn("a trace record ({} traces) not delivered: {}", traces, error.toString());
                        }
                    });
        } catch (RuntimeException e) {
            countFailed(traces);
            warn("trace producer refused {} traces: {}", traces, e.toString());
        }
    }

    private void countDelivered(int traces) {
        synchronized (finalCounts) {
            if (!countsFinal) {
                delivered.addAndGet(traces);
            }
        }
    }

    private void countFailed(int traces) {
        synchronized (finalCounts) {
            if (!countsFinal) {
                failedDelivery.addAndGet(traces);
            }
        }
    }

    /** Publish the next sequence number and where the emitter received lately, when it traced since the last mark or
     * received within khipu.mark.memory.ms. */
    void mark() {
        List<EmitterMark.Received> recent = new ArrayList<>();
        synchronized (received) {
            long now = System.nanoTime();
            long memory = TimeUnit.MILLISECONDS.toNanos(config.markMemoryMs());
            List<Map.Entry<Partition, Recent>> fresh = new ArrayList<>();
            for (Map.Entry<Partition, Recent> entry : received.entrySet()) {
                if (now - entry.getValue().atNanos() <= memory) {
                    fresh.add(entry);
                }
            }
            long count = emitted.get();
            if (count == markedAtEmitted && fresh.isEmpty()) {
                return;
            }
            markedAtEmitted = count;
            fresh.sort((a, b) -> Long.compare(b.getValue().atNanos(), a.getValue().atNanos()));
            for (Map.Entry<Partition, Recent> entry : fresh) {
                Partition where = entry.getKey();
                for (long offset : entry.getValue().offsets()) {
                    if (recent.size() < TraceFormat.MAX_MARK_ENTRIES) {
                        recent.add(new EmitterMark.Received(where.cluster(), where.topic(), where.partition(), offset));
                    }
                }
            }
        }
        EmitterMark mark = new EmitterMark(emitterId, config.location(), seq.getAndIncrement(),
                System.currentTimeMillis(), recent);
        if (producer == null) {
            return;
        }
        try {
            producer.send(new ProducerRecord<>(config.traceTopic(), null, System.currentTimeMillis(), recordKey,
                    TraceFormat.encode(mark)),
                    (metadata, error) -> {
                        if (error != null) {
                            warn("emitter mark not delivered: {}", error.toString());
                        }
                    });
        } catch (RuntimeException e) {
            warn("emitter mark not sent: {}", e.toString());
        }
    }

    /** Flush (bounded by khipu.close.timeout.ms), stop, and log the final counters. */
    void close() {
        if (closing) {
            return;
        }
        closing = true; // the sender sends what is queued, then the last mark; the caller waits at most the close timeout
        LockSupport.unpark(sender); // out of its linger at once
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(config.closeTimeoutMs());
        try {
            sender.join(Math.max(1, config.closeTimeoutMs()));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        int left = 0;
        for (Trace ignored; (ignored = queue.poll()) != null; ) {
            left++;
        }
        stranded.addAndGet(left);
        droppedAtClose.addAndGet(left);
        if (producer != null) { // what is still in flight after this fails its callback: counted as failed
            producer.close(java.time.Duration.ofNanos(Math.max(0, deadline - System.nanoTime())));
        }
        synchronized (finalCounts) { // what the sender still held, or a callback had not counted yet, is lost at close
            long unsettled = getPending();
            stranded.addAndGet(unsettled);
            droppedAtClose.addAndGet(unsettled);
            countsFinal = true;
        }
        if (mbeanName != null) {
            try {
                ManagementFactory.getPlatformMBeanServer().unregisterMBean(mbeanName);
            } catch (Exception e) {
                log.debug("trace emitter {}: JMX counters not unregistered: {}", emitterId, e.toString());
            }
        }
        long dropped = getDroppedQueueFull() + getDroppedInvalid() + getFailedDelivery() + getDroppedAtClose();
        String message = "trace emitter {} closed: {} emitted, {} delivered, {} dropped (queue full {}, failed {}, at close {})";
        Object[] args = {emitterId, getEmitted(), getDelivered(), dropped, getDroppedQueueFull(), getFailedDelivery(),
            getDroppedAtClose()};
        if (dropped > 0) {
            log.warn(message, args);
        } else {
            log.info(message, args);
        }
    }

    /** Warn at most once a minute: a trace channel that is down must not flood the application's log. */
    private void warn(String message, Object... args) {
        long now = System.nanoTime();
        if (now - lastWarningNs >= WARN_INTERVAL_NS) {
            lastWarningNs = now;
            log.warn(message, args);
        }
    }

    // -- counters -----------------------------------------------------------------------------------------------------------

    public TracingConfig config() {
        return config;
    }

    @Override
    public String getEmitterId() {
        return emitterId;
    }

    @Override
    public long getEmitted() {
        return emitted.get();
    }

    @Override
    public long getAccepted() {
        return accepted.get();
    }

    @Override
    public long getDelivered() {
        return delivered.get();
    }

    @Override
    public long getDroppedQueueFull() {
        return droppedQueueFull.get();
    }

    @Override
    public long getDroppedInvalid() {
        return droppedInvalid.get();
    }

    @Override
    public long getFailedDelivery() {
        return failedDelivery.get();
    }

    @Override
    public long getDroppedAtClose() {
        return droppedAtClose.get();
    }

    @Override
    public long getPending() {
        // a trace the sender could not encode, or one stranded at close, was accepted first
        return Math.max(0, accepted.get() - delivered.get() - failedDelivery.get() - stranded.get() - droppedInvalid.get());
    }
}
