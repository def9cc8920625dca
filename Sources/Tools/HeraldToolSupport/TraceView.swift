import Foundation

/// The spans herald-mock-otlp keeps: the newest `maxSpans`, oldest dropped first, and the queries its
/// `GET /v1/spans` answers (by trace, or by the event a trace carries).
package struct OTLPSpanStore: Sendable {
    package let maxSpans: Int
    private var spans: [OTLPSpan] = []
    /// Spans dropped to keep the bound, since the start.
    package private(set) var dropped = 0

    package init(maxSpans: Int) { self.maxSpans = max(1, maxSpans) }

    /// The spans kept, oldest first.
    package var all: [OTLPSpan] { spans }

    /// Keeps `new` (in the order given), dropping the oldest spans beyond `maxSpans`.
    package mutating func add(_ new: [OTLPSpan]) {
        spans.append(contentsOf: new)
        if spans.count > maxSpans {
            let excess = spans.count - maxSpans
            spans.removeFirst(excess)
            dropped += excess
        }
    }

    /// Every span of the trace `traceID` (hex, any case), by start time.
    package func spans(traceID: String) -> [OTLPSpan] {
        let id = traceID.lowercased()
        return Self.byStart(spans.filter { $0.traceID == id })
    }

    /// Every span of the traces in which some span carries `herald.event_id` = `eventID`, by start time.
    package func spans(eventID: String) -> [OTLPSpan] {
        let traces = Set(spans.filter { $0.attributes[TraceView.eventIDAttribute] == .string(eventID) }.map(\.traceID))
        return Self.byStart(spans.filter { traces.contains($0.traceID) })
    }

    static func byStart(_ spans: [OTLPSpan]) -> [OTLPSpan] {
        spans.enumerated().sorted { ($0.element.startUnixNano, $0.offset) < ($1.element.startUnixNano, $1.offset) }
            .map(\.element)
    }

    /// The JSON herald-mock-otlp answers and `heraldctl trace` reads: `{"spans": [...]}`, keys sorted.
    package static func json(_ spans: [OTLPSpan]) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return Array((try? encoder.encode(SpanList(spans: spans))) ?? Data("{\"spans\":[]}".utf8))
    }

    /// Reads that JSON back.
    package static func spans(fromJSON bytes: [UInt8]) throws -> [OTLPSpan] {
        try JSONDecoder().decode(SpanList.self, from: Data(bytes)).spans
    }

    struct SpanList: Codable {
        var spans: [OTLPSpan]
    }
}

/// One trace (or several) drawn as a tree of spans, for `heraldctl trace`: a pure function of the spans.
package enum TraceView {
    /// The attribute every stage span of an event carries.
    package static let eventIDAttribute = "herald.event_id"
    /// The span attributes shown on a span's line, in this order, when present.
    package static let keyAttributes = [
        "herald.provider", "http.response.status_code", "herald.reason", "herald.wait_in_topic_ms",
    ]

    /// The spans as text: per trace (by its first span's start) a header line, then each span on a line indented
    /// two spaces per level under its parent (children by start time; a span whose parent is not among `spans` is a
    /// root): its name, `[service]`, its duration and its start after the trace's first span in milliseconds, its
    /// key attributes and an error status; its events on the lines beneath it (`- name +offset ms attributes`).
    /// Attributes whose value is an empty string are left out.
    package static func render(_ spans: [OTLPSpan]) -> String {
        var traces: [String: [OTLPSpan]] = [:]
        for span in spans { traces[span.traceID, default: []].append(span) }
        let ordered = traces.values.map { OTLPSpanStore.byStart($0) }
            .sorted { ($0[0].startUnixNano, $0[0].traceID) < ($1[0].startUnixNano, $1[0].traceID) }
        var lines: [String] = []
        for trace in ordered {
            let origin = trace[0].startUnixNano
            let end = trace.map(\.endUnixNano).max() ?? origin
            lines.append(
                "trace \(trace[0].traceID)  \(trace.count) span\(trace.count == 1 ? "" : "s"), "
                    + "\(milliseconds(from: origin, to: end)) ms")
            let ids = Set(trace.map(\.spanID))
            var children: [String: [OTLPSpan]] = [:]
            var roots: [OTLPSpan] = []
            for span in trace {
                if !span.parentSpanID.isEmpty, span.parentSpanID != span.spanID, ids.contains(span.parentSpanID) {
                    children[span.parentSpanID, default: []].append(span)
                } else {
                    roots.append(span)
                }
            }
            var shown = Set<Int>()
            // Spans are told apart by their position (a malformed trace may repeat an id); each is drawn once, so
            // a cycle of parents cannot loop.
            let positions = Dictionary(
                trace.enumerated().map { ($0.element, $0.offset) }, uniquingKeysWith: { a, _ in a })
            func draw(_ span: OTLPSpan, depth: Int) {
                guard let position = positions[span], shown.insert(position).inserted else { return }
                lines.append(String(repeating: "  ", count: depth + 1) + line(span, origin: origin))
                for event in span.events.sorted(by: { $0.timeUnixNano < $1.timeUnixNano }) {
                    lines.append(String(repeating: "  ", count: depth + 2) + line(event, origin: origin))
                }
                for child in children[span.spanID] ?? [] { draw(child, depth: depth + 1) }
            }
            for root in roots { draw(root, depth: 0) }
            // Spans only reachable through a cycle of parents: drawn as roots.
            for span in trace { draw(span, depth: 0) }
        }
        return lines.joined(separator: "\n")
    }

    static func line(_ span: OTLPSpan, origin: UInt64) -> String {
        var text = span.name
        if !span.service.isEmpty { text += "  [\(span.service)]" }
        text += "  \(milliseconds(from: span.startUnixNano, to: span.endUnixNano)) ms"
        text += "  +\(milliseconds(from: origin, to: span.startUnixNano)) ms"
        let shown = keyAttributes.compactMap { key in
            span.attributes[key].flatMap { $0 == .string("") ? nil : "\(key)=\($0)" }
        }
        if !shown.isEmpty { text += "  " + shown.joined(separator: " ") }
        if span.status.code == "error" {
            text += "  error" + (span.status.message.isEmpty ? "" : ": \(span.status.message)")
        }
        return text
    }

    static func line(_ event: OTLPSpanEvent, origin: UInt64) -> String {
        var text = "- \(event.name)  +\(milliseconds(from: origin, to: event.timeUnixNano)) ms"
        let attributes = event.attributes.filter { $0.value != .string("") }.sorted { $0.key < $1.key }
            .map { "\($0.key)=\($0.value)" }
        if !attributes.isEmpty { text += "  " + attributes.joined(separator: " ") }
        return text
    }

    /// `end - start` in milliseconds with one decimal; 0.0 when `end` is before `start`.
    static func milliseconds(from start: UInt64, to end: UInt64) -> String {
        let nanoseconds = end >= start ? end - start : 0
        return String(format: "%.1f", Double(nanoseconds) / 1_000_000)
    }
}
