import Foundation
import HeraldCore
import Logging

/// Metadata key names used in every Herald log line, defined once.
public enum LogKey {
    public static let stage = "stage"
    public static let app = "app"
    public static let eventId = "event_id"
    public static let user = "user"
    public static let conversation = "conversation"
    /// A device token. `JSONLogHandler` redacts any value under this key (first 8 characters + "…").
    public static let token = "token"
    public static let topic = "topic"
    public static let partition = "partition"
    public static let offset = "offset"
    public static let apnsId = "apns_id"
    public static let status = "status"
    public static let reason = "reason"
    public static let attempt = "attempt"
    public static let count = "count"
    public static let durationMs = "duration_ms"
    public static let error = "error"
    public static let host = "host"
    public static let port = "port"
    public static let key = "key"
    /// The name of an environment variable (never its value).
    public static let variable = "variable"
    /// A traced event's trace id and the stage's span id (32 and 16 hex digits), on log lines about it.
    public static let traceID = "trace_id"
    public static let spanID = "span_id"

    /// Keys whose values are always shortened to `redactToken` form, whoever logs them.
    public static let tokenKeys: Set<String> = [token, "device_token", "voip_token"]
    /// Keys whose values are never written at all (message text, credentials).
    public static let forbiddenKeys: Set<String> = [
        "text", "message_text", "body", "password", "secret", "authorization", "jwt", "private_key", "p8",
    ]
}

/// A device token shortened for logs: its first 8 characters and "…".
public func redactToken(_ token: String) -> String {
    String(token.prefix(8)) + "…"
}

/// Where JSON log lines go. The default writes each line with one `write(2)` to stderr.
public protocol LogSink: Sendable {
    func write(line: String)
}

/// Writes to standard error, one `write(2)` per line so concurrent lines never interleave.
public struct StandardErrorSink: LogSink {
    public init() {}

    public func write(line: String) {
        var bytes = Array(line.utf8)
        bytes.append(0x0A)
        bytes.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let written = Foundation.write(2, raw.baseAddress! + offset, raw.count - offset)
                if written <= 0 { return }
                offset += written
            }
        }
    }
}

/// A swift-log handler writing one JSON object per line:
/// `{"ts":"2024-11-19T07:06:40.123Z","level":"info","label":"herald.send","message":"...","metadata":{...}}`.
///
/// Defense in depth: values under `LogKey.tokenKeys` are redacted to 8 characters + "…", and keys in
/// `LogKey.forbiddenKeys` (message text, secrets) are replaced by `"[redacted]"`, whatever the caller passed.
public struct JSONLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    public var logLevel: Logger.Level
    private let label: String
    private let sink: any LogSink

    public init(
        label: String, level: Logger.Level = .info, sink: any LogSink = StandardErrorSink(),
        metadataProvider: Logger.MetadataProvider? = nil
    ) {
        self.label = label
        self.logLevel = level
        self.sink = sink
        self.metadataProvider = metadataProvider
    }

    /// Bootstraps swift-log with this handler; call once at process start.
    public static func bootstrap(level: Logger.Level, sink: any LogSink = StandardErrorSink()) {
        LoggingSystem.bootstrap { label in JSONLogHandler(label: label, level: level, sink: sink) }
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() {
            merged.merge(provided) { _, new in new }
        }
        if let extra = event.metadata {
            merged.merge(extra) { _, new in new }
        }
        if let error = event.error, merged[LogKey.error] == nil {
            merged[LogKey.error] = .string("\(error)")
        }
        sink.write(
            line: Self.line(
                ts: Date(), level: event.level, label: label, message: event.message.description, metadata: merged))
    }

    /// One log line (no trailing newline). Exposed for tests and for tools that write the same format.
    public static func line(
        ts: Date, level: Logger.Level, label: String, message: String, metadata: Logger.Metadata
    ) -> String {
        var out = "{\"ts\":"
        appendString(Self.timestamp(ts), to: &out)
        out += ",\"level\":"
        appendString(level.rawValue, to: &out)
        out += ",\"label\":"
        appendString(label, to: &out)
        out += ",\"message\":"
        appendString(message, to: &out)
        if !metadata.isEmpty {
            out += ",\"metadata\":"
            appendObject(metadata, redacting: true, to: &out)
        }
        out += "}"
        return out
    }

    private static func timestamp(_ date: Date) -> String {
        let style = Date.ISO8601FormatStyle(includingFractionalSeconds: true, timeZone: .gmt)
        return date.formatted(style)
    }

    private static func appendObject(_ metadata: Logger.Metadata, redacting: Bool, to out: inout String) {
        out += "{"
        var first = true
        for (key, value) in metadata.sorted(by: { $0.key < $1.key }) {
            if !first { out += "," }
            first = false
            appendString(key, to: &out)
            out += ":"
            if redacting && LogKey.forbiddenKeys.contains(key) {
                appendString("[redacted]", to: &out)
            } else if redacting && LogKey.tokenKeys.contains(key) {
                appendString(redactToken(flatten(value)), to: &out)
            } else {
                appendValue(value, to: &out)
            }
        }
        out += "}"
    }

    private static func flatten(_ value: Logger.Metadata.Value) -> String {
        switch value {
        case .string(let string): return string
        case .stringConvertible(let convertible): return convertible.description
        case .array, .dictionary: return "\(value)"
        }
    }

    private static func appendValue(_ value: Logger.Metadata.Value, to out: inout String) {
        switch value {
        case .string(let string):
            appendString(string, to: &out)
        case .stringConvertible(let convertible):
            appendString(convertible.description, to: &out)
        case .array(let values):
            out += "["
            for (index, element) in values.enumerated() {
                if index > 0 { out += "," }
                appendValue(element, to: &out)
            }
            out += "]"
        case .dictionary(let dictionary):
            // Nested dictionaries are redacted by the same key rules.
            appendObject(dictionary, redacting: true, to: &out)
        }
    }

    /// A JSON string literal: quotes, backslash and every control character escaped (also DEL, U+2028 and
    /// U+2029), so a line stays one line. HeraldCore's escaper, the one Herald has.
    static func appendString(_ string: String, to out: inout String) {
        out += JSONWriter.quoted(string, lineSafe: true)
    }
}
