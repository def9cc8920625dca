import CHeraldRESP
import CHiredis
import Foundation

/// A complete reply as hiredis's reader left it in a connection's flat reply buffer (`herald_resp_reply`): its
/// elements in depth-first order, each aggregate before its elements, and their bytes in one buffer.
///
/// Reading replies flat instead of as hiredis's tree of `redisReply` objects saves the two allocations per element
/// that the tree costs (for a recipient's state, about sixteen per recipient resolved). A `FlatReply` points into the
/// session's buffer: it is valid until the session reads its next reply, so it is decoded or checked at once.
struct FlatReply {
    private let storage: UnsafePointer<herald_resp_reply>

    init(_ storage: UnsafePointer<herald_resp_reply>) {
        self.storage = storage
    }

    /// True when the reply is an error reply (`-ERR ...`).
    var isError: Bool {
        storage.pointee.count > 0 && storage.pointee.nodes[0].type == REDIS_REPLY_ERROR
    }

    /// The text of an error or status reply (empty for the other kinds).
    var line: String {
        guard storage.pointee.count > 0 else { return "" }
        let node = storage.pointee.nodes[0]
        guard node.type == REDIS_REPLY_ERROR || node.type == REDIS_REPLY_STATUS else { return "" }
        return String(decoding: bytes(of: node), as: UTF8.self)
    }

    /// The reply as a `RedisValue` (RESP3 kinds, which Herald never asks for, as the RESP2 form Redis would send).
    func value() -> RedisValue {
        guard storage.pointee.count > 0 else { return .null }
        var at = 0
        return value(at: &at)
    }

    /// Calls `body` with the reply's nodes and the bytes they point into (offsets from the start of `text`).
    func withNodes(_ body: (UnsafeBufferPointer<herald_resp_node>, UnsafeRawBufferPointer) -> Void) {
        let reply = storage.pointee
        let text =
            reply.used > 0 && reply.bytes != nil
            ? UnsafeRawBufferPointer(start: reply.bytes, count: reply.used)
            : UnsafeRawBufferPointer(start: nil, count: 0)
        body(UnsafeBufferPointer(start: reply.nodes, count: reply.count), text)
    }

    private func value(at: inout Int) -> RedisValue {
        let reply = storage.pointee
        guard at < reply.count else { return .null }
        let node = reply.nodes[at]
        at += 1
        var position = at
        let result = RedisValue.decoded(kind: node.type, integer: node.integer, text: bytes(of: node)) {
            value(at: &position)
        }
        at = position
        return result
    }

    private func bytes(of node: herald_resp_node) -> UnsafeRawBufferPointer {
        guard node.length > 0, let base = storage.pointee.bytes else {
            return UnsafeRawBufferPointer(start: nil, count: 0)
        }
        return UnsafeRawBufferPointer(start: base + node.offset, count: node.length)
    }
}
