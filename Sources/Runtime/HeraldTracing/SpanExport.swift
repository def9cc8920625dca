import Foundation
import Logging
import OTel
import ServiceLifecycle
import Tracing

/// The stage's span exporter: swift-otel's tracer over its OTLP/HTTP exporter, with a bounded, batched queue
/// (`tracing.max_queue_spans`, `max_batch_spans`, `export_interval_ms`): a collector that is slow or down costs
/// dropped spans, never a waiting stage. `service` must run in the stage's service group, started before the stage
/// loops and stopped after them, so their last spans are exported.
public final class SpanExport: Sendable {
    private let tracer: any Tracer
    public let service: any Service

    /// Builds the exporter of `settings` (swift-otel applies the `OTEL_*` environment over it as well). swift-otel's
    /// own warnings go to `logger`; the spans it drops are reported to `dropped` (`queue_full`, `export_failed`).
    public init(
        settings: TracingSettings, logger: Logger,
        dropped: @escaping @Sendable (_ reason: String, _ count: Int) -> Void = { _, _ in }
    ) throws {
        var configuration = settings.otelConfiguration
        let handler = ExportDiagnostics(inner: logger.handler, dropped: dropped)
        var diagnostics = Logger(label: "herald.otel") { _ in handler }
        diagnostics.logLevel = .warning
        configuration.diagnosticLogger = .custom(diagnostics)
        configuration.diagnosticLogLevel = .warning
        // swift-otel applies the process's `OTEL_*` variables over `configuration` as it builds the backend, and takes
        // an empty one as a value (an empty endpoint would fail every export); Herald reads an empty one as unset.
        for name in Self.blankVariables(in: ProcessInfo.processInfo.environment) { unsetenv(name) }
        let backend = try OTel.makeTracingBackend(configuration: configuration)
        tracer = backend.factory
        service = backend.service
    }

    /// The `OTEL_*` variables of `environment` whose value is empty or blank: unset for Herald (`TracingSettings`),
    /// so they are removed from the process's environment before swift-otel reads it.
    public static func blankVariables(in environment: [String: String]) -> [String] {
        environment.filter { $0.key.hasPrefix("OTEL_") && $0.value.trimmingCharacters(in: .whitespaces).isEmpty }
            .map(\.key).sorted()
    }

    /// Starts the span of a traced event at `start` (nanoseconds since the epoch): a child of `parent`, or with
    /// `parent` nil the root of a new trace (an event Herald's sampler chose, which arrived without a context).
    /// `fallback` is the context the event's outputs carry if the tracer gives the span none.
    public func startSpan(
        _ name: String, parent: TraceContext?, fallback: TraceContext, kind: SpanKind, startNanoseconds: UInt64
    ) -> EventSpan {
        var context = InstrumentationContext.topLevel
        if let parent {
            var carrier = [TraceContext.traceparentHeader: parent.traceparent]
            if let state = parent.traceState { carrier[TraceContext.tracestateHeader] = state }
            tracer.extract(carrier, into: &context, using: HeaderExtractor())
        }
        let span = tracer.startSpan(
            name, context: context, ofKind: kind,
            at: DefaultTracerClock.Timestamp(nanosecondsSinceEpoch: startNanoseconds))
        return eventSpan(span, fallback: fallback)
    }

    /// Starts a child of `parent` at `start` (nanoseconds since the epoch): a step of the event in the stage with
    /// a time of its own, such as send's request to a provider (kind `client`). The caller ends it.
    public func startChildSpan(
        _ name: String, of parent: EventSpan, kind: SpanKind, startNanoseconds: UInt64
    ) -> EventSpan {
        let span = tracer.startSpan(
            name, context: parent.span.context, ofKind: kind,
            at: DefaultTracerClock.Timestamp(nanosecondsSinceEpoch: startNanoseconds))
        return eventSpan(span, fallback: parent.context)
    }

    /// `span` with the context that makes it a parent (`fallback` when the tracer gives none).
    private func eventSpan(_ span: any Span, fallback: TraceContext) -> EventSpan {
        var outgoing: [String: String] = [:]
        tracer.inject(span.context, into: &outgoing, using: HeaderInjector())
        let continued =
            outgoing[TraceContext.traceparentHeader].flatMap {
                TraceContext(
                    traceparent: Array($0.utf8),
                    tracestate: outgoing[TraceContext.tracestateHeader].map { Array($0.utf8) })
            } ?? fallback
        return EventSpan(span: span, context: continued)
    }
}

/// One event's span in one stage, and the context its outputs carry (the span as their parent).
public struct EventSpan: Sendable {
    let span: any Span
    /// The trace context to put on the records produced for the event: this span is their parent.
    public let context: TraceContext

    public func setAttribute(_ key: String, _ value: String) { span.attributes[key] = value }
    public func setAttribute(_ key: String, _ value: Int64) { span.attributes[key] = value }

    /// Marks the span failed (OTLP status `error`), with `description` (a reason code, never message text).
    public func setError(_ description: String) { span.setStatus(SpanStatus(code: .error, message: description)) }

    public func addEvent(_ name: String, atNanoseconds nanoseconds: UInt64, attributes: [String: String] = [:]) {
        var spanAttributes = SpanAttributes()
        for (key, value) in attributes { spanAttributes[key] = value }
        span.addEvent(
            SpanEvent(
                name: name, at: DefaultTracerClock.Timestamp(nanosecondsSinceEpoch: nanoseconds),
                attributes: spanAttributes))
    }

    public func end(atNanoseconds nanoseconds: UInt64) {
        span.end(at: DefaultTracerClock.Timestamp(nanosecondsSinceEpoch: nanoseconds))
    }
}

private struct HeaderExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

private struct HeaderInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) { carrier[key] = value }
}
