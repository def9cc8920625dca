import Foundation

/// One decoded Redis reply (RESP2, as hiredis 0.14 speaks it).
///
/// Bulk strings are kept as raw bytes (`Data`) so binary values survive unchanged;
/// status and error replies are short ASCII lines and are kept as `String`.
public enum RedisValue: Sendable, Hashable {
    /// A bulk string (binary-safe).
    case string(Data)
    /// An integer reply.
    case integer(Int64)
    /// A multi-bulk reply.
    case array([RedisValue])
    /// The nil bulk string or nil multi-bulk.
    case null
    /// A status reply such as `OK` or `QUEUED`.
    case status(String)
    /// An error reply (`ERR ...`, `WRONGTYPE ...`). Inside a pipeline it is a value, not a thrown error,
    /// so one failing command does not hide the answers of the others.
    case error(String)

    /// The bulk string as UTF-8 text, or the status line; nil for every other case and for invalid UTF-8.
    public var text: String? {
        switch self {
        case .string(let data): return String(data: data, encoding: .utf8)
        case .status(let line): return line
        default: return nil
        }
    }

    /// The bulk string bytes; nil for every other case.
    public var data: Data? {
        if case .string(let data) = self { return data }
        return nil
    }

    /// The integer, also parsed from a bulk string holding a decimal integer (e.g. HGET of a counter).
    public var int: Int64? {
        switch self {
        case .integer(let value): return value
        case .string(let data): return String(data: data, encoding: .utf8).flatMap { Int64($0) }
        default: return nil
        }
    }

    /// The array elements; nil for every other case (a nil multi-bulk is `.null`).
    public var array: [RedisValue]? {
        if case .array(let values) = self { return values }
        return nil
    }

    public var isNull: Bool {
        if case .null = self { return true }
        return false
    }

    /// Throws `RedisError.serverError` when this is an error reply, otherwise returns self.
    @discardableResult
    public func orThrow(_ command: String = "") throws -> RedisValue {
        if case .error(let message) = self {
            throw RedisError(.serverError, command.isEmpty ? message : "\(command): \(message)")
        }
        return self
    }
}

/// Something that can be one argument of a Redis command. Arguments are sent binary-safe (with their length),
/// so any byte, including NUL and CR LF, is allowed.
public protocol RedisArgument: Sendable {
    var redisBytes: Data { get }
}

extension String: RedisArgument {
    public var redisBytes: Data { Data(self.utf8) }
}

extension Substring: RedisArgument {
    public var redisBytes: Data { Data(self.utf8) }
}

extension Data: RedisArgument {
    public var redisBytes: Data { self }
}

extension Array: RedisArgument where Element == UInt8 {
    public var redisBytes: Data { Data(self) }
}

extension Int: RedisArgument {
    public var redisBytes: Data { Data(String(self).utf8) }
}

extension Int64: RedisArgument {
    public var redisBytes: Data { Data(String(self).utf8) }
}

/// One Redis command: the command name and its arguments, each as bytes.
public struct RedisCommand: Sendable, Hashable, CustomStringConvertible {
    public var arguments: [Data]

    /// `RedisCommand("HSET", key, field, value)`.
    public init(_ name: String, _ arguments: any RedisArgument...) {
        self.arguments = [Data(name.utf8)] + arguments.map(\.redisBytes)
    }

    /// `RedisCommand("SADD", [key] + members)`.
    public init(_ name: String, _ arguments: [any RedisArgument]) {
        self.arguments = [Data(name.utf8)] + arguments.map(\.redisBytes)
    }

    /// The raw argument vector, the command name first.
    public init(arguments: [Data]) {
        self.arguments = arguments
    }

    /// The command name only: arguments can hold tokens or user data and never go into logs.
    public var description: String {
        arguments.first.flatMap { String(data: $0, encoding: .utf8) } ?? "?"
    }

    /// The command's size in the Redis protocol (RESP multi-bulk), as it goes over the wire.
    public var encodedLength: Int {
        var total = "*\(arguments.count)\r\n".utf8.count
        for argument in arguments {
            total += "$\(argument.count)\r\n".utf8.count + argument.count + 2
        }
        return total
    }
}
