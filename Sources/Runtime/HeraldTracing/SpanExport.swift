import HeraldHTTP
import Logging
import ServiceLifecycle
import Synchronization

/// The stage's span exporter: spans recorded in the stage's own tasks, finished ones kept in a bounded queue, and
/// sent in batches over OTLP/HTTP (protobuf) by `service` (`tracing.max_queue_spans`, `max_batch_spans`,
/// `export_interval_ms`).
///
/// A span costs its stage a few allocations and one uncontended lock when it ends, and never a thread wake-up: the
/// exporter wakes once per export interval, or once per full batch. A collector that is slow or down costs dropped
/// spans (counted through `dropped`), never a waiting stage. `service` must run in the stage's service group, started
/// before the stage loops and stopped after them: it then sends what they left in the queue.
public final class SpanExport: Sendable {
    let queue: SpanQueue
    private let ids: Mutex<SplitMix64>
    /// Runs the export: in the stage's service group, first to start and last to stop.
    public let service: SpanExportService

    /// An exporter with `settings` (the pipeline file's section with the `OTEL_*` environment over it). Export
    /// failures are logged to `logger` (never the headers); the spans dropped are reported to `dropped`
    /// (`queue_full`, `export_failed`).
    public init(
        settings: TracingSettings, logger: Logger,
        dropped: @escaping @Sendable (_ reason: String, _ count: Int) -> Void = { _, _ in }
    ) throws {
        queue = SpanQueue(capacity: settings.maxQueueSpans, batchSize: settings.maxBatchSpans, dropped: dropped)
        ids = Mutex(SplitMix64.seededBySystem())
        service = try SpanExportService(
            queue: queue, settings: settings, resource: settings.resource, logger: logger, dropped: dropped)
    }

    /// Starts the span of a traced event at `startNanoseconds` (since the epoch), in the trace of `context`: a child
    /// of `context`'s span, or with `root` the first span of a trace Herald's sampler started (`context` then holds
    /// the new trace's id, and its span id is no span's).
    public func startSpan(
        _ name: String, continuing context: TraceContext, root: Bool = false, kind: SpanKind,
        startNanoseconds: UInt64
    ) -> EventSpan {
        let spanID = ids.withLock { TraceSampler.newSpanID(using: &$0) }
        let record = SpanRecord(
            traceIDHigh: context.traceIDHigh, traceIDLow: context.traceIDLow, spanID: spanID,
            parentSpanID: root ? 0 : context.spanID, flags: context.flags, traceState: context.traceState,
            name: name, kind: kind, startNanoseconds: startNanoseconds)
        return EventSpan(recorder: SpanRecorder(record, queue: queue), context: context.continued(from: spanID))
    }

    /// Starts a child of `parent` at `startNanoseconds` (since the epoch): a step of the event in the stage with a
    /// time of its own, such as send's request to a provider (kind `client`). The caller ends it.
    public func startChildSpan(
        _ name: String, of parent: EventSpan, kind: SpanKind, startNanoseconds: UInt64
    ) -> EventSpan {
        startSpan(name, continuing: parent.context, kind: kind, startNanoseconds: startNanoseconds)
    }
}

/// One event's span in one stage, and the context its outputs carry (the span as their parent). Ending it hands it
/// to the export queue; what is set after that is ignored.
public struct EventSpan: Sendable {
    let recorder: SpanRecorder
    /// The trace context to put on the records produced for the event: this span is their parent.
    public let context: TraceContext

    public func setAttribute(_ key: String, _ value: String) { recorder.update { $0.set(key, .string(value)) } }
    public func setAttribute(_ key: String, _ value: Int64) { recorder.update { $0.set(key, .int(value)) } }

    /// Marks the span failed (OTLP status `error`), with `description` (a reason code, never message text).
    public func setError(_ description: String) { recorder.update { $0.errorDescription = description } }

    public func addEvent(_ name: String, atNanoseconds nanoseconds: UInt64, attributes: [String: String] = [:]) {
        let event = SpanEventRecord(
            name: name, timeNanoseconds: nanoseconds,
            attributes: attributes.sorted { $0.key < $1.key }.map { ($0.key, SpanValue.string($0.value)) })
        recorder.update { $0.events.append(event) }
    }

    public func end(atNanoseconds nanoseconds: UInt64) { recorder.end(atNanoseconds: nanoseconds) }
}

/// A span being recorded: its record until it ends, then nothing.
final class SpanRecorder: Sendable {
    private let record: Mutex<SpanRecord?>
    private let queue: SpanQueue

    init(_ record: SpanRecord, queue: SpanQueue) {
        self.record = Mutex(record)
        self.queue = queue
    }

    func update(_ change: (inout SpanRecord) -> Void) {
        record.withLock { current in
            guard var span = current.take() else { return }
            change(&span)
            current = span
        }
    }

    func end(atNanoseconds nanoseconds: UInt64) {
        guard var span = record.withLock({ $0.take() }) else { return }
        span.endNanoseconds = max(nanoseconds, span.startNanoseconds)
        queue.append(span)
    }
}

/// Finished spans waiting for export, at most `capacity`: a span that finds the queue full is dropped and counted
/// (`queue_full`). The exporter waits in `wait()` until a batch is full, its timer runs out or the queue closes.
final class SpanQueue: Sendable {
    private struct State {
        var spans: [SpanRecord] = []
        var waiter: CheckedContinuation<Void, Never>?
        /// A wake-up that came while the exporter was not waiting: its next `wait()` returns at once.
        var woken = false
        var closed = false
    }

    let capacity: Int
    let batchSize: Int
    private let state = Mutex(State())
    private let dropped: @Sendable (_ reason: String, _ count: Int) -> Void

    init(capacity: Int, batchSize: Int, dropped: @escaping @Sendable (_ reason: String, _ count: Int) -> Void) {
        self.capacity = max(1, capacity)
        self.batchSize = max(1, min(batchSize, capacity))
        self.dropped = dropped
    }

    func append(_ span: SpanRecord) {
        let (accepted, waiter) = state.withLock { state -> (Bool, CheckedContinuation<Void, Never>?) in
            guard state.spans.count < capacity else { return (false, nil) }
            state.spans.append(span)
            guard state.spans.count == batchSize else { return (true, nil) }
            return (true, Self.takeWaiter(&state))
        }
        waiter?.resume()
        if !accepted { dropped("queue_full", 1) }
    }

    /// Wakes the exporter (its timer, or the queue closing).
    func wake() { state.withLock { Self.takeWaiter(&$0) }?.resume() }

    func close() {
        state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.closed = true
            return Self.takeWaiter(&state)
        }?.resume()
    }

    var isClosed: Bool { state.withLock { $0.closed } }

    /// Returns when a batch is full, `wake()` was called or the queue is closed (at once if any of these happened
    /// since the last call).
    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLock { state -> Bool in
                if state.woken || state.closed || state.spans.count >= batchSize {
                    state.woken = false
                    return true
                }
                state.waiter = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Up to `batchSize` of the oldest spans, removed from the queue.
    func take() -> [SpanRecord] {
        state.withLock { state in
            let count = min(batchSize, state.spans.count)
            let batch = Array(state.spans.prefix(count))
            state.spans.removeFirst(count)
            return batch
        }
    }

    private static func takeWaiter(_ state: inout State) -> CheckedContinuation<Void, Never>? {
        guard let waiter = state.waiter else {
            state.woken = true
            return nil
        }
        state.waiter = nil
        return waiter
    }
}

/// Sends the queue's spans to the collector: a batch whenever one is full, and what is there at each export
/// interval; on graceful shutdown, what is left, within `shutdownTimeout`. One request at a time, over a kept-alive
/// HTTP/1.1 connection (libcurl, on a thread of its own); a batch the collector refuses, or does not answer within
/// the export timeout, is dropped and counted (`export_failed`).
public struct SpanExportService: Service {
    let queue: SpanQueue
    let endpoint: String
    let headers: [(String, String)]
    let interval: Duration
    let timeout: Duration
    let resource: [(key: String, value: SpanValue)]
    let logger: Logger
    let dropped: @Sendable (_ reason: String, _ count: Int) -> Void
    private let client: HTTP1Client
    /// The most the export of what is left may take when the stage stops.
    public static let shutdownTimeout = Duration.seconds(3)

    init(
        queue: SpanQueue, settings: TracingSettings, resource: [(key: String, value: SpanValue)], logger: Logger,
        dropped: @escaping @Sendable (_ reason: String, _ count: Int) -> Void
    ) throws {
        self.queue = queue
        endpoint = settings.tracesEndpoint
        headers = [("Content-Type", "application/x-protobuf")] + settings.exportHeaders
        interval = settings.exportInterval
        timeout = settings.exportTimeout
        self.resource = resource
        self.logger = logger
        self.dropped = dropped
        client = try HTTP1Client(
            configuration: HTTP1ClientConfiguration(
                trustedCAFile: settings.certificateFile, maxInFlight: 1, maxConnectionsPerHost: 1,
                connectTimeout: min(settings.exportTimeout, .seconds(5))))
    }

    public func run() async throws {
        let failures = FailureLog(logger: logger, endpoint: endpoint)
        await withGracefulShutdownHandler {
            while !queue.isClosed {
                let timer = Task { [queue, interval] in
                    do {
                        try await Task.sleep(for: interval)
                        queue.wake()
                    } catch {}
                }
                // Cancelled (not shut down gracefully), the service closes the queue and stops the same way.
                await withTaskCancellationHandler {
                    await queue.wait()
                } onCancel: {
                    queue.close()
                }
                timer.cancel()
                await exportAll(timeout: timeout, failures: failures)
            }
        } onGracefulShutdown: {
            queue.close()
            // An export in flight, and the last ones, get `shutdownTimeout` in all: then the client stops, and a
            // request not answered by then fails at once.
            Task { [client] in
                try? await Task.sleep(for: Self.shutdownTimeout)
                await client.shutdown()
            }
        }
        await exportAll(timeout: min(timeout, Self.shutdownTimeout), failures: failures)
        await client.shutdown()
    }

    /// Exports batches until the queue is empty.
    private func exportAll(timeout: Duration, failures: FailureLog) async {
        while true {
            let batch = queue.take()
            if batch.isEmpty { return }
            let body = OTLPEncoding.exportRequest(batch, resource: resource)
            let response = await client.send(
                HTTPRequest(url: endpoint, method: "POST", headers: headers, body: body, timeout: timeout))
            if let status = response.status, (200..<300).contains(status) {
                failures.succeeded()
            } else {
                dropped("export_failed", batch.count)
                failures.failed(status: response.status, failure: response.failure, spans: batch.count)
            }
        }
    }
}

/// The export failures' log lines: the first of a run of failures, then at most one a minute with the spans dropped
/// since, and one when export works again. The endpoint is named; the headers (credentials) never are.
final class FailureLog: Sendable {
    private struct State {
        var failing = false
        var lastLine: ContinuousClock.Instant?
        var droppedSinceLine = 0
    }

    private let state = Mutex(State())
    private let logger: Logger
    private let endpoint: String

    init(logger: Logger, endpoint: String) {
        self.logger = logger
        self.endpoint = endpoint
    }

    func failed(status: Int?, failure: HTTPResponse.Failure?, spans: Int) {
        let now = ContinuousClock.now
        let dropped = state.withLock { state -> Int? in
            state.failing = true
            state.droppedSinceLine += spans
            if let last = state.lastLine, now - last < .seconds(60) { return nil }
            state.lastLine = now
            defer { state.droppedSinceLine = 0 }
            return state.droppedSinceLine
        }
        guard let dropped else { return }
        logger.warning(
            "span export failed; the batch is dropped",
            metadata: [
                "endpoint": "\(endpoint)", "status": "\(status.map(String.init) ?? "none")",
                "failure": "\(failure.map { "\($0)" } ?? "none")", "spans_dropped": "\(dropped)",
            ])
    }

    func succeeded() {
        let recovered = state.withLock { state -> Bool in
            defer { state = State() }
            return state.failing
        }
        if recovered { logger.info("span export works again", metadata: ["endpoint": "\(endpoint)"]) }
    }
}
