import Foundation
import HeraldCore

/// One decoded Redis reply (RESP2, the protocol Herald speaks to Redis).
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
    /// Appends the argument's bytes.
    func appendRedisBytes(to buffer: inout [UInt8])
    /// Appends the argument as a RESP bulk string (`$<length>` CRLF bytes CRLF). The default goes through
    /// `appendRedisBytes` and a scratch buffer; strings, byte arrays and integers write straight into `buffer`.
    func appendRedisBulk(to buffer: inout [UInt8])
}

extension RedisArgument {
    public func appendRedisBulk(to buffer: inout [UInt8]) {
        var scratch: [UInt8] = []
        appendRedisBytes(to: &scratch)
        RESP.appendBulk(scratch, to: &buffer)
    }
}

extension RedisArgument {
    public var redisBytes: Data {
        var bytes: [UInt8] = []
        appendRedisBytes(to: &bytes)
        return Data(bytes)
    }
}

extension String: RedisArgument {
    public func appendRedisBytes(to buffer: inout [UInt8]) {
        var s = self
        s.withUTF8 { buffer.append(contentsOf: $0) }
    }

    public func appendRedisBulk(to buffer: inout [UInt8]) {
        var s = self
        s.withUTF8 { RESP.appendBulk($0, to: &buffer) }
    }
}

extension Substring: RedisArgument {
    public func appendRedisBytes(to buffer: inout [UInt8]) { buffer.append(contentsOf: utf8) }
}

extension Data: RedisArgument {
    public func appendRedisBytes(to buffer: inout [UInt8]) { buffer.append(contentsOf: self) }
}

extension Array: RedisArgument where Element == UInt8 {
    public func appendRedisBytes(to buffer: inout [UInt8]) { buffer.append(contentsOf: self) }
    public func appendRedisBulk(to buffer: inout [UInt8]) {
        withUnsafeBufferPointer { RESP.appendBulk($0, to: &buffer) }
    }
}

extension Int: RedisArgument {
    public func appendRedisBytes(to buffer: inout [UInt8]) { RESP.appendDecimal(Int64(self), to: &buffer) }
    public func appendRedisBulk(to buffer: inout [UInt8]) { RESP.appendDecimalBulk(Int64(self), to: &buffer) }
}

extension Int64: RedisArgument {
    public func appendRedisBytes(to buffer: inout [UInt8]) { RESP.appendDecimal(self, to: &buffer) }
    public func appendRedisBulk(to buffer: inout [UInt8]) { RESP.appendDecimalBulk(self, to: &buffer) }
}

/// One Redis command, kept in its wire form (a RESP multi-bulk array), so pipelining a batch copies bytes once
/// instead of converting every argument.
public struct RedisCommand: Sendable, Hashable, CustomStringConvertible {
    /// The command as it goes over the wire.
    public private(set) var encoded: [UInt8]
    /// The command name (for errors and logs; arguments can hold tokens or user data and never go into logs).
    public let name: String

    /// `RedisCommand("HSET", key, field, value)`.
    public init(_ name: String, _ arguments: any RedisArgument...) {
        self.init(name, arguments)
    }

    /// `RedisCommand("SADD", [key] + members)`.
    public init(_ name: String, _ arguments: [any RedisArgument]) {
        self.name = name
        var out: [UInt8] = []
        out.reserveCapacity(32 + arguments.count * 24)
        out.append(UInt8(ascii: "*"))
        RESP.appendDecimal(Int64(arguments.count + 1), to: &out)
        out.append(13)
        out.append(10)
        name.appendRedisBulk(to: &out)
        for argument in arguments { argument.appendRedisBulk(to: &out) }
        encoded = out
    }

    /// The raw argument vector, the command name first.
    public init(arguments: [Data]) {
        self.init(arguments.first.map { String(decoding: $0, as: UTF8.self) } ?? "", Array(arguments.dropFirst()))
    }

    public var description: String { name }

    /// The command's size in the Redis protocol (RESP multi-bulk), as it goes over the wire.
    public var encodedLength: Int { encoded.count }
}

enum RESP {
    static let crlf: [UInt8] = [13, 10]

    @inline(__always)
    static func appendDecimal(_ value: Int64, to out: inout [UInt8]) { DecimalASCII.append(value, to: &out) }

    static func appendBulk(_ bytes: some Collection<UInt8>, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "$"))
        appendDecimal(Int64(bytes.count), to: &out)
        out.append(13)
        out.append(10)
        out.append(contentsOf: bytes)
        out.append(13)
        out.append(10)
    }

    /// `value` in decimal as a bulk string, without an intermediate buffer.
    static func appendDecimalBulk(_ value: Int64, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "$"))
        appendDecimal(Int64(DecimalASCII.length(of: value)), to: &out)
        out.append(13)
        out.append(10)
        appendDecimal(value, to: &out)
        out.append(13)
        out.append(10)
    }

    static func appendBulk(_ string: String, to out: inout [UInt8]) {
        appendBulk(string.utf8, to: &out)
    }
}
