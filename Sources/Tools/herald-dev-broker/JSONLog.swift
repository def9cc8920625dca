// Log lines: one JSON object per line on standard error (the ready line alone goes to standard output).
import Foundation

struct JSONLog: Sendable {
    func write(_ level: String, _ message: String, _ fields: [String: String] = [:]) {
        var object = fields
        object["ts"] = Date().formatted(.iso8601)
        object["level"] = level
        object["msg"] = message
        object["component"] = "herald-dev-broker"
        guard
            let data = try? JSONSerialization.data(
                withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
        else { return }
        // One write(2) per line, so lines from the control thread and the main thread never interleave.
        FileHandle.standardError.write(data + Data("\n".utf8))
    }
}
