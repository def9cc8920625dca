import CHeraldRESP
import CHiredis
import Foundation

/// The replies of one pipelined call, kept flat: every reply's elements in one array, in the order hiredis's reader
/// parsed them (each aggregate before its elements), and their bytes in one buffer.
///
/// `RedisConnection.pipeline(_:)` decodes each reply into a `RedisValue`: an array per aggregate and a `Data` per
/// bulk string longer than 14 bytes. A caller that reads many small replies and keeps nothing of them as they are
/// (resolve reads one `HMGET` of five or more fields per recipient) asks for them flat instead
/// (`RedisConnection.pipelineFlat(_:)`): the whole call then costs three allocations, whatever its size, and the
/// caller reads each element's bytes in place. A `Reply` is a handle into the `RedisReplies` it came from.
public struct RedisReplies: Sendable {
    /// One element of a reply.
    struct Node: Sendable {
        /// hiredis's reply type (`REDIS_REPLY_STRING`, `_ARRAY`, ...).
        var kind: Int32
        /// An integer's value, a bool's 0 or 1, an aggregate's element count.
        var integer: Int64
        /// A string-like element's bytes in `bytes`.
        var offset: Int
        var length: Int
        /// The index of the node after this one's last element (the next sibling); for a scalar, the next node.
        var next: Int
    }

    /// An element of one of the replies: valid only with the `RedisReplies` it came from.
    public struct Reply: Sendable, Hashable {
        fileprivate let node: Int
    }

    private var nodes: [Node] = []
    private var bytes: [UInt8] = []
    /// The first node of each reply.
    private var starts: [Int] = []

    public init() {}

    /// Room for `replies` replies of about `nodes` elements and `bytes` bytes in all.
    init(replies: Int, nodes: Int = 0, bytes: Int = 0) {
        starts.reserveCapacity(replies)
        self.nodes.reserveCapacity(nodes)
        self.bytes.reserveCapacity(bytes)
    }

    /// How many replies.
    public var count: Int { starts.count }

    public var isEmpty: Bool { starts.isEmpty }

    /// Reply `index` (of the call's commands, in order).
    public subscript(index: Int) -> Reply { Reply(node: starts[index]) }

    // MARK: Reading an element

    /// True for the nil bulk string and the nil multi-bulk.
    public func isNull(_ reply: Reply) -> Bool { nodes[reply.node].kind == REDIS_REPLY_NIL }

    /// True for an error reply (`-ERR ...`).
    public func isError(_ reply: Reply) -> Bool { nodes[reply.node].kind == REDIS_REPLY_ERROR }

    /// An error reply's message; nil for every other kind.
    public func errorMessage(_ reply: Reply) -> String? {
        guard isError(reply) else { return nil }
        return withText(of: nodes[reply.node]) { String(decoding: $0, as: UTF8.self) }
    }

    /// Throws `RedisError.serverError` when `reply` is an error reply (as `RedisValue.orThrow`).
    public func orThrow(_ reply: Reply, _ command: String = "") throws {
        if let message = errorMessage(reply) {
            throw RedisError(.serverError, command.isEmpty ? message : "\(command): \(message)")
        }
    }

    /// An aggregate's element count; nil for every other kind.
    public func elementCount(_ reply: Reply) -> Int? {
        let node = nodes[reply.node]
        return Self.isAggregate(node.kind) ? Int(node.integer) : nil
    }

    /// Element `index` of an aggregate (which has more than `index` elements: `elementCount`).
    public func element(_ reply: Reply, _ index: Int) -> Reply {
        precondition(index < elementCount(reply) ?? 0, "RedisReplies: element \(index) out of range")
        var at = reply.node + 1
        for _ in 0..<index { at = nodes[at].next }
        return Reply(node: at)
    }

    /// The element after `reply` in the aggregate that holds it (which has one more: `elementCount`).
    public func sibling(after reply: Reply) -> Reply {
        Reply(node: nodes[reply.node].next)
    }

    /// Calls `body` with each element of an aggregate, in order; nothing for any other kind.
    public func forEachElement(_ reply: Reply, _ body: (Reply) throws -> Void) rethrows {
        let count = elementCount(reply) ?? 0
        guard count > 0 else { return }
        var element = Reply(node: reply.node + 1)
        for index in 0..<count {
            if index > 0 { element = sibling(after: element) }
            try body(element)
        }
    }

    /// A bulk string as UTF-8 text, or a status line; nil for every other kind and for invalid UTF-8 (as
    /// `RedisValue.text`).
    public func text(_ reply: Reply) -> String? {
        let node = nodes[reply.node]
        guard node.kind == REDIS_REPLY_STRING || node.kind == REDIS_REPLY_STATUS else { return nil }
        return withText(of: node) { String(validating: $0, as: UTF8.self) }
    }

    /// The integer, also parsed from a bulk string holding a decimal integer (as `RedisValue.int`).
    public func int(_ reply: Reply) -> Int64? {
        let node = nodes[reply.node]
        switch node.kind {
        case REDIS_REPLY_INTEGER: return node.integer
        case REDIS_REPLY_STRING: return withText(of: node) { Self.decimal($0) }
        default: return nil
        }
    }

    /// Calls `body` with a bulk string's bytes, read in place, and returns its result; nil, without calling it, for
    /// every other kind.
    public func withBytes<T>(_ reply: Reply, _ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T? {
        let node = nodes[reply.node]
        guard node.kind == REDIS_REPLY_STRING else { return nil }
        return try withText(of: node, body)
    }

    /// The element as a `RedisValue`.
    public func value(_ reply: Reply) -> RedisValue {
        var at = reply.node
        return value(at: &at)
    }

    /// Every reply as a `RedisValue`, in order.
    public var values: [RedisValue] {
        starts.map { value(Reply(node: $0)) }
    }

    // MARK: Filling

    /// Appends a copy of a reply read into a connection's flat buffer.
    mutating func append(_ flat: FlatReply) {
        flat.withNodes { source, text in
            guard !source.isEmpty else {
                starts.append(nodes.count)
                nodes.append(Node(kind: REDIS_REPLY_NIL, integer: 0, offset: 0, length: 0, next: nodes.count + 1))
                return
            }
            let base = bytes.count
            bytes.append(contentsOf: text)
            let first = nodes.count
            starts.append(first)
            for node in source {
                nodes.append(
                    Node(
                        kind: node.type, integer: node.integer, offset: base + node.offset, length: node.length, next: 0
                    ))
            }
            _ = linkSiblings(at: first)
        }
    }

    /// Appends a copy of `other`'s reply `reply` (a whole reply, as its subscript gives).
    mutating func append(_ reply: Reply, of other: RedisReplies) {
        let first = reply.node
        let end = other.nodes[first].next
        let shift = nodes.count - first
        let base = bytes.count
        var low = Int.max
        var high = 0
        for at in first..<end where other.nodes[at].length > 0 {
            low = min(low, other.nodes[at].offset)
            high = max(high, other.nodes[at].offset + other.nodes[at].length)
        }
        if low < high { bytes.append(contentsOf: other.bytes[low..<high]) }
        starts.append(nodes.count)
        for at in first..<end {
            var node = other.nodes[at]
            node.offset = node.offset - (low < high ? low : 0) + base
            node.next += shift
            nodes.append(node)
        }
    }

    /// Sets `next` for the node at `at` and everything under it; returns the index after its last element.
    private mutating func linkSiblings(at: Int) -> Int {
        guard at < nodes.count else { return at }
        var next = at + 1
        if Self.isAggregate(nodes[at].kind) {
            for _ in 0..<max(0, Int(nodes[at].integer)) { next = linkSiblings(at: next) }
        }
        nodes[at].next = next
        return next
    }

    // MARK: Helpers

    private func value(at: inout Int) -> RedisValue {
        guard at < nodes.count else { return .null }
        let node = nodes[at]
        at += 1
        var position = at
        let result = withText(of: node) { text in
            RedisValue.decoded(kind: node.kind, integer: node.integer, text: text) {
                value(at: &position)
            }
        }
        at = position
        return result
    }

    private func withText<T>(of node: Node, _ body: (UnsafeRawBufferPointer) throws -> T) rethrows -> T {
        try bytes.withUnsafeBytes { all in
            guard node.length > 0 else { return try body(UnsafeRawBufferPointer(start: nil, count: 0)) }
            return try body(UnsafeRawBufferPointer(rebasing: all[node.offset..<(node.offset + node.length)]))
        }
    }

    static func isAggregate(_ kind: Int32) -> Bool {
        kind == REDIS_REPLY_ARRAY || kind == REDIS_REPLY_MAP || kind == REDIS_REPLY_SET || kind == REDIS_REPLY_PUSH
            || kind == REDIS_REPLY_ATTR
    }

    /// A decimal integer of 1 to 19 digits with an optional `-`; nil for anything else.
    static func decimal(_ text: UnsafeRawBufferPointer) -> Int64? {
        var index = 0
        var negative = false
        if text.first == UInt8(ascii: "-") {
            negative = true
            index = 1
        }
        guard index < text.count, text.count - index <= 19 else { return nil }
        var value: Int64 = 0
        while index < text.count {
            let digit = text[index] &- 48
            guard digit < 10 else { return nil }
            let (times, overflowTimes) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflowSum) = times.addingReportingOverflow(Int64(digit))
            guard !overflowTimes, !overflowSum else { return nil }
            value = sum
            index += 1
        }
        return negative ? -value : value
    }
}

extension RedisValue {
    /// One element of a flat reply as a `RedisValue`; `element` decodes the next element (for an aggregate's,
    /// in order). RESP3 kinds, which Herald never asks for, come as the RESP2 form Redis would send.
    static func decoded(
        kind: Int32, integer: Int64, text: UnsafeRawBufferPointer, element: () -> RedisValue
    ) -> RedisValue {
        switch kind {
        case REDIS_REPLY_STRING, REDIS_REPLY_DOUBLE, REDIS_REPLY_BIGNUM:
            return .string(Data(text))
        case REDIS_REPLY_VERB:
            // A verbatim string starts with its three-letter format and a colon (`txt:`), which RESP2 has not.
            return .string(Data(text.count >= 4 ? UnsafeRawBufferPointer(rebasing: text[4...]) : text))
        case REDIS_REPLY_INTEGER:
            return .integer(integer)
        case REDIS_REPLY_BOOL:
            return .integer(integer == 0 ? 0 : 1)
        case REDIS_REPLY_NIL:
            return .null
        case REDIS_REPLY_STATUS:
            return .status(String(decoding: text, as: UTF8.self))
        case REDIS_REPLY_ERROR:
            return .error(String(decoding: text, as: UTF8.self))
        case REDIS_REPLY_ARRAY, REDIS_REPLY_MAP, REDIS_REPLY_SET, REDIS_REPLY_PUSH, REDIS_REPLY_ATTR:
            var values: [RedisValue] = []
            values.reserveCapacity(Int(integer))
            for _ in 0..<max(0, Int(integer)) { values.append(element()) }
            return .array(values)
        default:
            return .error("unknown hiredis reply type \(kind)")
        }
    }
}
