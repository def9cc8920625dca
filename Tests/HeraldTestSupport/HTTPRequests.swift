// A small blocking HTTP/1.1 client for tests (one request per connection, `Connection: close`), run on a thread
// of its own so it never holds a cooperative thread. Enough for JSON APIs on loopback.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

public enum TestHTTP {
    public struct Answer: Sendable {
        public var status: Int
        public var headers: [String: String]
        public var body: String

        /// The body parsed as a JSON object (nil when it is not one).
        public var json: [String: Any]? {
            (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any]
        }
    }

    /// Sends one request to 127.0.0.1:`port` and reads the whole answer.
    public static func request(
        port: Int, method: String, path: String, headers: [String: String] = [:],
        body: String? = nil
    ) async throws -> Answer {
        try await offPool { try blocking(port: port, method: method, path: path, headers: headers, body: body) }
    }

    /// A TCP connection to 127.0.0.1:`port` with a receive timeout (0: none); the caller closes the descriptor.
    public static func connectLoopback(port: Int, receiveTimeoutSeconds: Int = 0) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError("socket() failed") }
        if receiveTimeoutSeconds > 0 {
            var timeout = timeval(tv_sec: receiveTimeoutSeconds, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            close(fd)
            throw TestSupportError("connect to \(port) failed")
        }
        return fd
    }

    private static func blocking(
        port: Int, method: String, path: String, headers: [String: String],
        body: String?
    ) throws -> Answer {
        // As long as the slowest answer a test allows (60 s on a starved machine), so that a slow answer fails the
        // test's own check instead of cutting the read short.
        let fd = try connectLoopback(port: port, receiveTimeoutSeconds: 60)
        defer { close(fd) }
        let payload = Array((body ?? "").utf8)
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if body != nil { head += "Content-Type: application/json\r\nContent-Length: \(payload.count)\r\n" }
        head += "\r\n"
        let request = Array(head.utf8) + payload
        var sent = 0
        while sent < request.count {
            let n = request.withUnsafeBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw TestSupportError("send failed (errno \(errno))") }
            sent += n
        }
        var received = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            // A socket with a receive timeout is not restarted after a signal (the test process's children exit
            // and raise SIGCHLD): EINTR is no answer, read again.
            if count < 0, errno == EINTR { continue }
            if count <= 0 { break }
            received.append(contentsOf: buffer[0..<count])
        }
        let text = String(decoding: received, as: UTF8.self)
        guard let split = text.range(of: "\r\n\r\n") else { throw TestSupportError("no HTTP header end in: \(text)") }
        let lines = text[..<split.lowerBound].components(separatedBy: "\r\n")
        let statusParts = lines.first?.split(separator: " ") ?? []
        guard statusParts.count >= 2, let status = Int(statusParts[1]) else {
            throw TestSupportError("bad status line")
        }
        var answerHeaders: [String: String] = [:]
        for line in lines.dropFirst() {
            if let colon = line.firstIndex(of: ":") {
                answerHeaders[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                    in: .whitespaces)
            }
        }
        return Answer(status: status, headers: answerHeaders, body: String(text[split.upperBound...]))
    }
}
