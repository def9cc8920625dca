/// A bad field in an event, a record or a request body: `field` is the dotted path (`message.text`,
/// `recipients[2]`, `dnd.start`, `conversations.c1.muted`, or `(body)` for the whole), `message` says what is wrong
/// with it, `reason` is the dead-letter reason (`invalid`, or `out_of_range` for a value outside its
/// `InputRanges` range).
public struct FieldError: Error, Sendable, Hashable, CustomStringConvertible {
    public var field: String
    public var message: String
    public var reason: String

    public init(field: String, message: String, reason: String = "invalid") {
        self.field = field
        self.message = message
        self.reason = reason
    }

    /// One line, e.g. `message.text: longer than 65536 bytes`.
    public var description: String { "\(field): \(message)" }
}

extension JSONValue {
    /// A request body that must be a JSON object: its members in order, each key given once. Anything else is a
    /// `FieldError`: `(body)` when it is not JSON or not an object, the key when a key is given twice.
    public static func bodyObject(_ body: some Collection<UInt8>) throws(FieldError) -> [(String, JSONValue)] {
        let root: JSONValue
        do {
            root = try JSONValue.parse(body)
        } catch {
            throw FieldError(field: "(body)", message: "not valid JSON: \(error)")
        }
        guard case .object(let pairs) = root else {
            throw FieldError(field: "(body)", message: "expected a JSON object, got \(root.typeName)")
        }
        var seen = Set<String>()
        for (key, _) in pairs where !seen.insert(key).inserted { throw FieldError(field: key, message: "given twice") }
        return pairs
    }
}
