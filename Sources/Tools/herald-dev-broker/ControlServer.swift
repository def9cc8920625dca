// The control port: HTTP/1.1 on loopback, one connection at a time on a thread of its own (blocking sockets), one
// request per connection (`Connection: close`), one log line per request.
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

final class ControlServer: Sendable {
    let port: Int
    private let listener: Int32
    private let api: ControlAPI
    private let log: JSONLog
    private let stopping = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    /// How long a client may take to send its request head before the connection is dropped.
    private static let readTimeoutSeconds = 5
    private static let maxHeadBytes = 64 * 1024

    init(port: Int, api: ControlAPI, log: JSONLog) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw DevBrokerError("control socket: \(String(cString: strerror(errno)))") }
        var on: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, socklen_t(MemoryLayout<Int32>.size))
        var address = loopbackAddress(port: port)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 16) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw DevBrokerError("control port \(port): \(reason)")
        }
        self.port = port
        self.listener = fd
        self.api = api
        self.log = log
    }

    func start() {
        let thread = Thread { [self] in
            serve()
            finished.signal()
        }
        thread.name = "herald-dev-broker-control"
        thread.start()
    }

    /// Stops accepting, lets a request being served finish (at most the read timeout), and returns.
    func stop() {
        stopping.store(true, ordering: .sequentiallyConsistent)
        shutdown(listener, Int32(SHUT_RDWR))
        _ = finished.wait(timeout: .now() + .seconds(Self.readTimeoutSeconds + 1))
        close(listener)
    }

    private func serve() {
        while !stopping.load(ordering: .sequentiallyConsistent) {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                if stopping.load(ordering: .sequentiallyConsistent) { return }
                log.write("warning", "accept failed", ["error": String(cString: strerror(errno))])
                usleep(100_000)
                continue
            }
            serveConnection(fd)
            close(fd)
        }
    }

    private func serveConnection(_ fd: Int32) {
        let started = ContinuousClock.now
        var timeout = timeval(tv_sec: Self.readTimeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        guard let request = readRequest(fd) else {
            write(fd, ControlAnswer.error(400, "could not read an HTTP/1.1 request head"))
            log.write("info", "request", ["status": "400", "error": "unreadable head"])
            return
        }
        let answer = api.handle(method: request.method, path: request.path, query: request.query)
        write(fd, answer)
        let elapsed = ContinuousClock.now - started
        log.write(
            "info", "request",
            [
                "method": request.method, "target": request.target, "status": String(answer.status),
                "ms": String(format: "%.1f", elapsed / .milliseconds(1)),
            ])
    }

    private struct Request {
        var method: String
        var target: String
        var path: String
        var query: [String: String]
    }

    /// Reads the head (and discards a `Content-Length` body: the routes take their arguments from the query).
    private func readRequest(_ fd: Int32) -> Request? {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        let end: Int
        while true {
            if let range = received.firstRange(of: [13, 10, 13, 10]) {
                end = range.upperBound
                break
            }
            guard received.count < Self.maxHeadBytes else { return nil }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return nil }
            received.append(contentsOf: buffer[0..<n])
        }
        let head = String(decoding: received[..<end], as: UTF8.self)
        let lines = head.components(separatedBy: "\r\n")
        let words = lines[0].split(separator: " ")
        guard words.count == 3, words[2].hasPrefix("HTTP/1.") else { return nil }
        var bodyLength = 0
        for line in lines.dropFirst() {
            let pair = line.split(separator: ":", maxSplits: 1)
            if pair.count == 2, pair[0].lowercased() == "content-length" {
                bodyLength = Int(pair[1].trimmingCharacters(in: .whitespaces)) ?? 0
            }
        }
        var remaining = min(bodyLength, 1 << 20) - (received.count - end)
        while remaining > 0 {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, min($0.count, remaining), 0) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            remaining -= n
        }
        let target = String(words[1])
        let pieces = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        var query: [String: String] = [:]
        if pieces.count == 2 {
            for item in pieces[1].split(separator: "&") {
                let kv = item.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let key = Self.percentDecoded(kv[0])
                query[key] = kv.count == 2 ? Self.percentDecoded(kv[1]) : ""
            }
        }
        return Request(
            method: String(words[0]), target: target, path: Self.percentDecoded(pieces[0]), query: query)
    }

    private static func percentDecoded(_ s: Substring) -> String {
        let plus = s.replacingOccurrences(of: "+", with: " ")
        return plus.removingPercentEncoding ?? plus
    }

    private func write(_ fd: Int32, _ answer: ControlAnswer) {
        let body = Array(answer.body.utf8)
        let head =
            "HTTP/1.1 \(answer.status) \(Self.reason(answer.status))\r\nContent-Type: \(answer.contentType)\r\n"
            + "Content-Length: \(body.count)\r\nConnection: close\r\n\r\n"
        let bytes = Array(head.utf8) + body
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { return }
            sent += n
        }
    }

    private static func reason(_ status: Int) -> String {
        switch status {
        case 200: "OK"
        case 400: "Bad Request"
        case 404: "Not Found"
        case 409: "Conflict"
        case 503: "Service Unavailable"
        default: "Internal Server Error"
        }
    }
}
