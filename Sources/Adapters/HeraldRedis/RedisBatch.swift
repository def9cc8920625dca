/// Commands written straight into one buffer in the Redis protocol (RESP multi-bulk), for the paths that run per
/// recipient or per device: resolve's state reads, send's claims and confirmations, the explain trail.
///
/// A `RedisCommand` per command costs an argument array, a box per argument, a `String` per key and a buffer of
/// its own; here a key made of parts (`herald:<app>:user:{<user>}:devices`) is written piece by piece, and the
/// whole batch is one buffer that `RedisConnection.pipeline(_:)` hands to hiredis in one call.
///
/// Each `command(_:arguments:)` must be followed by exactly that many `argument` calls (checked in debug builds).
public struct RedisBatch: Sendable {
    /// The commands as they go over the wire.
    public private(set) var bytes: [UInt8]
    /// How many commands the batch holds (the number of replies it gets).
    public private(set) var count = 0
    /// Arguments still owed by the last command begun.
    private var owed = 0

    public init(capacity: Int = 1024) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// `count` commands already in RESP form, one after another (the cluster router's per-node batches).
    init(encoded: [UInt8], count: Int) {
        bytes = encoded
        self.count = count
    }

    /// The commands, in order (tests and tools: the stages write their batches argument by argument).
    public init(commands: [RedisCommand]) {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(commands.reduce(0) { $0 + $1.encodedLength })
        for command in commands { bytes.append(contentsOf: command.encoded) }
        self.init(encoded: bytes, count: commands.count)
    }

    public var isEmpty: Bool { count == 0 }

    /// Appends every command of `other`.
    public mutating func append(_ other: RedisBatch) {
        assert(owed == 0 && other.owed == 0, "RedisBatch: a command is missing arguments")
        count += other.count
        bytes.append(contentsOf: other.bytes)
    }

    /// Begins a command with `arguments` arguments after its name.
    public mutating func command(_ name: StaticString, arguments: Int) {
        assert(owed == 0, "RedisBatch: the previous command is missing \(owed) argument(s)")
        count += 1
        owed = arguments
        bytes.append(UInt8(ascii: "*"))
        RESP.appendDecimal(Int64(arguments + 1), to: &bytes)
        bytes.append(13)
        bytes.append(10)
        name.withUTF8Buffer { RESP.appendBulk($0, to: &bytes) }
    }

    public mutating func argument(_ value: String) {
        owed -= 1
        RESP.appendBulk(value, to: &bytes)
    }

    public mutating func argument(_ value: [UInt8]) {
        owed -= 1
        value.withUnsafeBufferPointer { RESP.appendBulk($0, to: &bytes) }
    }

    public mutating func argument(_ value: ArraySlice<UInt8>) {
        owed -= 1
        value.withUnsafeBufferPointer { RESP.appendBulk($0, to: &bytes) }
    }

    public mutating func argument(_ value: Int64) {
        owed -= 1
        RESP.appendDecimalBulk(value, to: &bytes)
    }

    /// One argument made of `parts` one after another (a key), without building it as a string first.
    public mutating func argument(
        _ p0: String, _ p1: String, _ p2: String = "", _ p3: String = "", _ p4: String = "", _ p5: String = "",
        _ p6: String = ""
    ) {
        owed -= 1
        let length =
            p0.utf8.count + p1.utf8.count + p2.utf8.count + p3.utf8.count + p4.utf8.count + p5.utf8.count
            + p6.utf8.count
        bytes.append(UInt8(ascii: "$"))
        RESP.appendDecimal(Int64(length), to: &bytes)
        bytes.append(13)
        bytes.append(10)
        Self.appendUTF8(p0, to: &bytes)
        Self.appendUTF8(p1, to: &bytes)
        Self.appendUTF8(p2, to: &bytes)
        Self.appendUTF8(p3, to: &bytes)
        Self.appendUTF8(p4, to: &bytes)
        Self.appendUTF8(p5, to: &bytes)
        Self.appendUTF8(p6, to: &bytes)
        bytes.append(13)
        bytes.append(10)
    }

    /// `count` arguments already in RESP form (bulk strings, one after another): fixed arguments encoded once.
    mutating func arguments(encoded: [UInt8], count: Int) {
        owed -= count
        bytes.append(contentsOf: encoded)
    }

    /// The batch has every argument its commands announced.
    var isComplete: Bool { owed == 0 }

    @inline(__always) static func appendUTF8(_ s: String, to bytes: inout [UInt8]) {
        if s.isEmpty { return }
        if s.utf8.withContiguousStorageIfAvailable({ bytes.append(contentsOf: $0) }) == nil {
            bytes.append(contentsOf: s.utf8)
        }
    }
}
