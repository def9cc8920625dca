import Logging

/// swift-otel's diagnostic log, read for the spans it drops and passed on to the stage's log.
///
/// swift-otel's batch processor does not count dropped spans anywhere a caller can read; it logs a warning per
/// export round: "Spans were dropped this iteration because queue was full" with `dropped_count`, and "Failed to
/// export batch." with the logger's `batch_size`. This handler turns those into `dropped(reason, count)` calls
/// (`queue_full`, `export_failed`) and hands every line to `inner` (the stage's JSON log handler). A test
/// (`StageLoopSpanTests`) fails if a swift-otel upgrade changes the lines.
struct ExportDiagnostics: LogHandler {
    var inner: any LogHandler
    let dropped: @Sendable (_ reason: String, _ count: Int) -> Void

    static let queueFull = "Spans were dropped this iteration because queue was full"
    static let exportFailed = "Failed to export batch."

    var metadata: Logger.Metadata {
        get { inner.metadata }
        set { inner.metadata = newValue }
    }

    var logLevel: Logger.Level {
        get { inner.logLevel }
        set { inner.logLevel = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { inner[metadataKey: key] }
        set { inner[metadataKey: key] = newValue }
    }

    func log(event: LogEvent) {
        let message = event.message.description
        if message == Self.queueFull, let count = Self.number(event.metadata?["dropped_count"]) {
            dropped("queue_full", count)
        } else if message == Self.exportFailed,
            let count = Self.number(event.metadata?["batch_size"] ?? inner[metadataKey: "batch_size"])
        {
            dropped("export_failed", count)
        }
        inner.log(event: event)
    }

    private static func number(_ value: Logger.Metadata.Value?) -> Int? {
        guard case .string(let text)? = value else { return nil }
        return Int(text)
    }
}
