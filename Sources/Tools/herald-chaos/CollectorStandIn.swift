// A stand-in OTLP/HTTP collector inside herald-chaos for the trace-collector scenarios: it answers every export
// request with 200, and on the scenario's word it stops listening (the port refuses connections) or keeps accepting
// connections and reading requests without ever answering them.
import Foundation
import Glibc
import HeraldBenchSupport
import Synchronization

/// A loopback HTTP listener standing in for an OpenTelemetry collector (OTLP/HTTP, `POST /v1/traces`).
///
/// It starts answering: each request is read whole (headers and `Content-Length` body) and answered `200` with an
/// empty `application/x-protobuf` body, a full success for an OTLP exporter. `refuse()` closes the listener and
/// every connection, so the port has nothing listening and a connect is refused; `hold()` keeps accepting
/// connections and reading their requests but answers none, on new connections and on those already open (an
/// exporter's kept-alive connection gets no answer either).
final class CollectorStandIn: @unchecked Sendable {
    enum Mode { case answer, hold, refuse }

    private struct State {
        var mode = Mode.answer
        var answered = 0
        var held = 0
        var connections: Set<Int32> = []
    }

    let port: Int
    private let listener: Int32
    private let state = Mutex(State())

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw BenchError("collector stand-in: no socket") }
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
        guard bound == 0, listen(fd, 128) == 0 else {
            close(fd)
            throw BenchError("collector stand-in: bind/listen failed")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        listener = fd
        Thread { [self] in self.acceptLoop() }.start()
    }

    /// The base URL to give as `OTEL_EXPORTER_OTLP_ENDPOINT`.
    var endpoint: String { "http://127.0.0.1:\(port)" }

    /// Export requests answered with 200 so far.
    var answered: Int { state.withLock { $0.answered } }
    /// Export requests read and left without an answer so far (in `hold`).
    var held: Int { state.withLock { $0.held } }
    /// Connections open now.
    var openConnections: Int { state.withLock { $0.connections.count } }

    /// From now on every request is read and never answered; connections are accepted and kept open.
    func hold() { state.withLock { $0.mode = .hold } }

    /// Stops listening and closes every connection: a connect to the port is refused from now on.
    func refuse() {
        state.withLock { s in
            if s.mode != .refuse { shutdown(listener, Int32(SHUT_RDWR)) }
            s.mode = .refuse
            // Under the lock: a connection thread takes its socket out of the set before it closes it, so every
            // descriptor here is still that connection's. The threads see end-of-file and close their sockets.
            for fd in s.connections { shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    /// Closes everything (the listener and every connection, held ones included).
    func stop() { refuse() }

    private func acceptLoop() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                break
            }
            let admitted = state.withLock { s -> Bool in
                guard s.mode != .refuse else { return false }
                s.connections.insert(client)
                return true
            }
            guard admitted else {
                close(client)
                break
            }
            Thread { [self] in self.serve(client) }.start()
        }
        close(listener)
    }

    /// Reads requests off one connection until it ends, answering each unless the stand-in holds.
    private func serve(_ fd: Int32) {
        defer {
            state.withLock { _ = $0.connections.remove(fd) }
            close(fd)
        }
        var pending: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        let separator: [UInt8] = Array("\r\n\r\n".utf8)
        while true {
            // One request: the head, then Content-Length bytes of body.
            var headEnd: Int?
            while headEnd == nil {
                headEnd = Self.find(separator, in: pending)
                if headEnd != nil { break }
                let n = read(fd, &buffer, buffer.count)
                if n <= 0 { return }
                pending.append(contentsOf: buffer[0..<n])
            }
            let bodyStart = headEnd! + separator.count
            let head = String(decoding: pending[0..<headEnd!], as: UTF8.self).lowercased()
            let contentLength =
                head.split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
            while pending.count < bodyStart + contentLength {
                let n = read(fd, &buffer, buffer.count)
                if n <= 0 { return }
                pending.append(contentsOf: buffer[0..<n])
            }
            pending.removeFirst(bodyStart + contentLength)
            let answer = state.withLock { s -> Bool in
                switch s.mode {
                case .answer: s.answered += 1; return true
                case .hold: s.held += 1; return false
                case .refuse: return false
                }
            }
            guard answer else { continue }
            let response = Array(
                "HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n".utf8)
            var sent = 0
            while sent < response.count {
                let n = response[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if n <= 0 { return }
                sent += n
            }
        }
    }

    private static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for i in 0...(haystack.count - needle.count) where haystack[i] == needle[0] {
            if Array(haystack[i..<(i + needle.count)]) == needle { return i }
        }
        return nil
    }
}
