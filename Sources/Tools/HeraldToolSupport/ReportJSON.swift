import HeraldCore

/// Building the tools' JSON reports (heraldctl's output, the benchmarks' and the fault suite's reports) as
/// HeraldCore's `JSONValue`, written by its one writer (docs/architecture.md, "JSON").
extension JSONValue {
    /// An object whose members are written in key order: every report the tools print sorts its keys.
    package static func sorted(_ members: [String: JSONValue]) -> JSONValue {
        .object(members.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
    }

    /// An integer, or null for nil.
    package static func int<I: BinaryInteger>(_ value: I?) -> JSONValue {
        value.map { .number(String($0)) } ?? .null
    }

    /// A number: written as an integer when it is one (below 10^15), null for nil, NaN or an infinity.
    package static func double(_ value: Double?) -> JSONValue {
        guard let value, value.isFinite else { return .null }
        if value == value.rounded(), abs(value) < 1e15 { return .number(String(Int64(value))) }
        return .number(String(value))
    }

    /// A string, or null for nil.
    package static func text(_ value: String?) -> JSONValue { value.map { .string($0) } ?? .null }

    /// An array of strings.
    package static func strings(_ values: [String]) -> JSONValue { .array(values.map { .string($0) }) }

    /// The value written over several lines, two spaces an indent level and `"key" : value` (the layout of
    /// Foundation's pretty-printed JSON, which the benchmarks' report files have).
    package var prettyPrinted: String {
        var out = ""
        JSONValue.writePretty(self, indent: 0, into: &out)
        return out
    }

    private static func writePretty(_ value: JSONValue, indent: Int, into out: inout String) {
        let inner = String(repeating: "  ", count: indent + 1)
        switch value {
        case .array(let items) where !items.isEmpty:
            out += "[\n"
            for (i, item) in items.enumerated() {
                out += inner
                writePretty(item, indent: indent + 1, into: &out)
                out += i == items.count - 1 ? "\n" : ",\n"
            }
            out += String(repeating: "  ", count: indent) + "]"
        case .object(let members) where !members.isEmpty:
            out += "{\n"
            for (i, (key, item)) in members.enumerated() {
                out += inner + JSONValue.string(key).serialized + " : "
                writePretty(item, indent: indent + 1, into: &out)
                out += i == members.count - 1 ? "\n" : ",\n"
            }
            out += String(repeating: "  ", count: indent) + "}"
        default:
            out += value.serialized
        }
    }
}
