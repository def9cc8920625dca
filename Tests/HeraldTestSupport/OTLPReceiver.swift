import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// An OTLP/HTTP receiver stand-in on loopback that only keeps bodies: accepts `POST /v1/traces` (HTTP/1.1,
/// keep-alive), keeps each request's body and answers 200. The bodies are OTLP protobuf, as the stages export them.
/// Made with `answering: false` it is a collector that hangs: it accepts connections and never reads or answers.
public final class OTLPReceiver: Sendable {
    public let port: Int
    private let listener: Int32
    private let bodies = Mutex<[[UInt8]]>([])
    private let answering: Bool
    /// The connections a receiver that does not answer holds open (closed by `stop()`).
    private let held = Mutex<[Int32]>([])
    private let acceptedCount = Mutex(0)

    public init(answering: Bool = true) throws {
        self.answering = answering
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 16) == 0 else {
            close(fd)
            throw POSIXError(.EADDRINUSE)
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        listener = fd
        port = Int(UInt16(bigEndian: address.sin_port))
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "otlp-receiver-accept"
        thread.start()
    }

    /// The bodies received so far.
    public var received: [[UInt8]] { bodies.withLock { $0 } }

    /// Connections accepted so far.
    public var accepted: Int { acceptedCount.withLock { $0 } }

    /// Stops accepting (connections already open end with their peer; the held ones of a receiver that does not
    /// answer are closed).
    public func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        for connection in held.withLock({ $0 }) { close(connection) }
    }

    private func acceptLoop() {
        while true {
            let connection = accept(listener, nil, nil)
            if connection < 0 { return }
            acceptedCount.withLock { $0 += 1 }
            guard answering else {
                held.withLock { $0.append(connection) }
                continue
            }
            let thread = Thread { [self] in serve(connection) }
            thread.name = "otlp-receiver-conn"
            thread.start()
        }
    }

    private func serve(_ connection: Int32) {
        defer { close(connection) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            // A request: its head up to an empty line, then Content-Length bytes of body.
            let separator: [UInt8] = Array("\r\n\r\n".utf8)
            var headEnd: Int?
            while headEnd == nil {
                if let found = Self.find(separator, in: buffer) {
                    headEnd = found
                    break
                }
                let n = read(connection, &chunk, chunk.count)
                if n <= 0 { return }
                buffer += chunk[0..<n]
            }
            guard let end = headEnd else { return }
            let head = String(decoding: buffer[0..<end], as: UTF8.self).lowercased()
            let contentLength =
                head.split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
            let bodyStart = end + separator.count
            while buffer.count < bodyStart + contentLength {
                let n = read(connection, &chunk, chunk.count)
                if n <= 0 { return }
                buffer += chunk[0..<n]
            }
            let body = Array(buffer[bodyStart..<bodyStart + contentLength])
            buffer.removeFirst(bodyStart + contentLength)
            if head.hasPrefix("post /v1/traces") { bodies.withLock { $0.append(body) } }
            let answer = Array(
                "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n".utf8)
            _ = answer.withUnsafeBytes { write(connection, $0.baseAddress, $0.count) }
        }
    }

    /// Where `needle` first occurs in `haystack`.
    public static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for start in 0...(haystack.count - needle.count)
        where haystack[start..<start + needle.count].elementsEqual(needle) {
            return start
        }
        return nil
    }
}
