import ArgumentParser
import Foundation
import HeraldToolSupport

/// `heraldctl trace <event-id>`: one event's trace as a tree of spans, read from an OTLP receiver that answers
/// `GET /v1/spans?event_id=` (herald-mock-otlp, which the local stack runs).
struct TraceCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "trace",
        abstract: "Show an event's trace (its spans as a tree) from the local stack's OTLP receiver.",
        discussion: """
            Reads every span of each trace in which a stage's span carries herald.event_id = EVENT-ID from \
            herald-mock-otlp (scripts/local-stack.sh runs it on port 4318 and points the stages' tracing at it). \
            Each line: the span's name, [service], its duration, its start after the trace's first span, and its \
            key attributes; the span's events beneath it. --trace-id HEX shows one trace instead. Exits 1 when the receiver cannot be reached or has no \
            span of the event (not sampled, not exported yet, or dropped by the receiver's --max-spans).
            """)

    @Argument(help: "The event's id (event_id in chat.events).") var eventID: String?

    @Option(
        name: .customLong("trace-id"),
        help: "Show this trace (32 hex digits) instead of an event's, e.g. the trace id of a chat back end's request.")
    var traceID: String?

    @Option(help: "The OTLP receiver, http://HOST:PORT (herald-mock-otlp).") var receiver = "http://127.0.0.1:4318"

    @Option(name: .long, help: "Seconds to wait for the receiver's answer.") var timeout: Int = 5

    @Flag(name: .long, help: "Print the spans as JSON ({\"spans\": [...]}) instead of a tree.") var json = false

    func validate() throws {
        guard StageEndpoint(url: receiver) != nil else {
            throw ValidationError("--receiver: expected http://HOST:PORT, got \(receiver)")
        }
        guard timeout > 0 else { throw ValidationError("--timeout: a positive number of seconds") }
        switch (eventID, traceID) {
        case (nil, nil), (.some, .some): throw ValidationError("give an event id or --trace-id, not both")
        case (let event?, nil) where event.isEmpty: throw ValidationError("the event id is empty")
        case (nil, let trace?) where trace.count != 32 || !trace.allSatisfy(\.isHexDigit):
            throw ValidationError("--trace-id: expected 32 hex digits, got \(trace)")
        default: break
        }
    }

    func run() throws {
        guard let endpoint = StageEndpoint(url: receiver) else { throw ExitCode.validationFailure }
        // Only URL-unreserved ASCII stays as it is; everything else (UTF-8 bytes included) is percent-encoded.
        let allowed = CharacterSet(
            charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
        let query =
            traceID.map { "trace_id=\($0.lowercased())" }
            ?? "event_id=" + ((eventID ?? "").addingPercentEncoding(withAllowedCharacters: allowed) ?? "")
        let subject = traceID.map { "trace \($0)" } ?? "event \(eventID ?? "")"
        guard let answer = endpoint.get("/v1/spans?\(query)", timeout: timeout) else {
            Self.fail(
                "cannot reach the OTLP receiver at \(endpoint) (is herald-mock-otlp running? scripts/local-stack.sh --keep starts it)"
            )
        }
        guard answer.status == 200 else {
            Self.fail("the OTLP receiver at \(endpoint) answered \(answer.status): \(answer.body.prefix(200))")
        }
        let spans: [OTLPSpan]
        do {
            spans = try OTLPSpanStore.spans(fromJSON: Array(answer.body.utf8))
        } catch {
            Self.fail("the OTLP receiver at \(endpoint) did not answer a span list (is it herald-mock-otlp?): \(error)")
        }
        guard !spans.isEmpty else {
            Self.fail(
                "the OTLP receiver at \(endpoint) has no span of \(subject) (not traced, not exported yet, or dropped)"
            )
        }
        print(json ? String(decoding: OTLPSpanStore.json(spans), as: UTF8.self) : TraceView.render(spans))
    }

    /// Writes `message` to standard error and exits 1.
    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data(("heraldctl trace: " + message + "\n").utf8))
        Foundation.exit(1)
    }
}
