// ExportDiagnostics: swift-otel's warnings about dropped spans become counts; every line still reaches the stage's
// log.

import Logging
import Synchronization
import Testing

@testable import HeraldTracing

/// Keeps the messages it is handed.
final class Lines: Sendable {
    let messages = Mutex<[String]>([])
}

struct RecordingHandler: LogHandler {
    let lines: Lines
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    func log(event: LogEvent) { lines.messages.withLock { $0.append(event.message.description) } }
}

@Suite("swift-otel's diagnostics")
struct ExportDiagnosticsTests {
    @Test("a full queue's and a failed export's warnings are counted with their span counts, and passed on")
    func counted() {
        let lines = Lines()
        let counts = Mutex<[String: Int]>([:])
        let handler = ExportDiagnostics(inner: RecordingHandler(lines: lines)) { reason, count in
            counts.withLock { $0[reason, default: 0] += count }
        }
        var logger = Logger(label: "otel") { _ in handler }
        logger.warning(
            "Spans were dropped this iteration because queue was full",
            metadata: ["queue_size": "2048", "dropped_count": "17"])
        logger[metadataKey: "batch_size"] = "5"
        logger.warning("Failed to export batch.")
        logger.warning("Failed to export batch.", metadata: ["batch_size": "2"])
        logger.warning("Something else.", metadata: ["dropped_count": "9"])
        #expect(counts.withLock { $0 } == ["queue_full": 17, "export_failed": 7])
        #expect(lines.messages.withLock { $0.count } == 4)
    }
}
