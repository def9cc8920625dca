/// The text of a Linux `/proc/<pid>/stat` line, read by field number as proc(5) numbers them. The command name (field
/// 2) is in parentheses and may itself hold spaces and parentheses, so the fields are counted from the last `)`.
/// Parsing only: the callers read the file (the stages' `/metrics`, the benchmarks).
public struct ProcStat: Sendable {
    /// Fields 3 onwards (the state first).
    private let fields: [Substring]

    /// Nil when the text has no command name in parentheses.
    public init?(_ text: String) {
        guard let close = text.lastIndex(of: ")") else { return nil }
        fields = text[text.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
    }

    /// Field `number` (3 and up) as a number; nil when the line is shorter or the field is not a number.
    public func number(_ number: Int) -> Double? {
        number >= 3 && fields.count > number - 3 ? Double(fields[number - 3]) : nil
    }

    /// User plus system CPU time in clock ticks (fields 14 and 15); nil when they are missing.
    public var cpuTicks: Double? {
        guard let user = number(14), let system = number(15) else { return nil }
        return user + system
    }
}
