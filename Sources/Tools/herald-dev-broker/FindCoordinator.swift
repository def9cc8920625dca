// One Kafka FindCoordinator request (v0) over a plain socket: the mock API can set a group's coordinator but not
// read it, so the control server asks the cluster the way a client does.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

enum FindCoordinator {
    /// The node id that 127.0.0.1:`port` names as `group`'s coordinator; nil on any failure (refused, timed out,
    /// an error code in the answer).
    static func ask(port: Int, group: String, timeoutSeconds: Int = 2) -> Int32? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = loopbackAddress(port: port)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { return nil }
        // Request header v1 (api key 10, version 0, correlation id, client id), then the group id.
        var body: [UInt8] = []
        body.appendBigEndian(Int16(10))
        body.appendBigEndian(Int16(0))
        body.appendBigEndian(Int32(1))
        body.appendKafkaString("herald-dev-broker")
        body.appendKafkaString(group)
        var frame: [UInt8] = []
        frame.appendBigEndian(Int32(body.count))
        frame += body
        guard writeAll(fd, frame), let size = readAll(fd, count: 4).map(Self.int32), size >= 10, size < 1 << 20,
            let answer = readAll(fd, count: Int(size))
        else { return nil }
        // Answer v0: correlation id, error code, node id, host, port.
        guard int32(answer[0..<4]) == 1, int16(answer[4..<6]) == 0 else { return nil }
        return int32(answer[6..<10])
    }

    private static func writeAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return false }
            sent += n
        }
        return true
    }

    private static func readAll(_ fd: Int32, count: Int) -> [UInt8]? {
        var bytes = [UInt8](repeating: 0, count: count)
        var got = 0
        while got < count {
            let n = bytes.withUnsafeMutableBytes { recv(fd, $0.baseAddress! + got, count - got, 0) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return nil }
            got += n
        }
        return bytes
    }

    private static func int32<C: Collection>(_ bytes: C) -> Int32 where C.Element == UInt8 {
        Int32(bitPattern: bytes.reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
    }

    private static func int16<C: Collection>(_ bytes: C) -> Int16 where C.Element == UInt8 {
        Int16(bitPattern: bytes.reduce(UInt16(0)) { $0 << 8 | UInt16($1) })
    }
}

extension [UInt8] {
    fileprivate mutating func appendBigEndian<T: FixedWidthInteger>(_ value: T) {
        Swift.withUnsafeBytes(of: value.bigEndian) { append(contentsOf: $0) }
    }

    fileprivate mutating func appendKafkaString(_ s: String) {
        let utf8 = Array(s.utf8)
        appendBigEndian(Int16(utf8.count))
        append(contentsOf: utf8)
    }
}
