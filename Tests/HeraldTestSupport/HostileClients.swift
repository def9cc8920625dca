// Clients that misbehave on purpose, for the HTTP limits tests: a connection that sends half a request head and
// stalls, and a crowd of connections that each send a request head and a large body, driven by one poll loop.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

public enum HostileClients {
    /// Raises this process's soft limit of open files to `wanted` (at most the hard limit); returns the limit now.
    @discardableResult
    public static func raiseOpenFileLimit(to wanted: Int) -> Int {
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        if limit.rlim_cur < rlim_t(wanted) {
            limit.rlim_cur = min(rlim_t(wanted), limit.rlim_max)
            setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
            getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
        return Int(limit.rlim_cur)
    }

    /// Sends all of `bytes` on a blocking descriptor.
    public static func send(_ fd: Int32, _ bytes: [UInt8]) throws {
        var sent = 0
        while sent < bytes.count {
            let n = bytes.withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress! + sent, $0.count - sent, Int32(MSG_NOSIGNAL))
            }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw TestSupportError("send failed (errno \(errno))") }
            sent += n
        }
    }

    /// Reads until the server closes the connection (or resets it). Runs on a thread of its own. `guardSeconds`
    /// only keeps a server that never closes from hanging the test run: `closed` is then false.
    public static func readUntilClosed(
        _ fd: Int32, guardSeconds: Int = 300
    ) async throws -> (
        bytes: [UInt8], closed: Bool
    ) {
        try await offPool {
            var timeout = timeval(tv_sec: guardSeconds, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var received: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n > 0 {
                    received += buffer[0..<n]
                    continue
                }
                if n == 0 || errno == ECONNRESET { return (received, true) }
                if errno == EINTR { continue }
                return (received, false)
            }
        }
    }

    /// The status code of an HTTP/1.1 answer's first line, if `bytes` start with one.
    public static func status(_ bytes: [UInt8]) -> Int? {
        let text = String(decoding: bytes.prefix(64), as: UTF8.self)
        let parts = text.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1.") else { return nil }
        return Int(parts[1])
    }

    /// What each connection of a flood saw.
    public struct FloodResult: Sendable {
        /// The status of each connection's answer (nil: none arrived).
        public var statuses: [Int?]
        /// Connections that received their answer before they had sent any body byte.
        public var answeredBeforeBody: Int
        /// Body bytes sent over all connections.
        public var bodyBytesSent: Int
    }

    /// Opens `count` connections to 127.0.0.1:`port`; each sends `head` as it opens and then up to `bodyBytes` of
    /// body, while reading its answer, until the server closes it. One thread drives them all
    /// with poll(2). Returns when every connection is closed by the server (or `guardSeconds` passed without
    /// any progress, which keeps a broken server from hanging the test).
    public static func flood(
        port: Int, count: Int, head: String, bodyBytes: Int, guardSeconds: Int = 300
    ) async throws -> FloodResult {
        try await offPool {
            struct Conn {
                var fd: Int32
                var headSent = 0
                var bodySent = 0
                var received: [UInt8] = []
                var answeredBeforeBody = false
                var done = false
            }
            let headBytes = Array(head.utf8)
            let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 65536)
            var conns: [Conn] = []
            conns.reserveCapacity(count)
            for _ in 0..<count {
                // The head goes out at once: a connection that sent nothing for the read timeout (opening 1,000
                // of them on a loaded machine takes a while) would rightly be closed unanswered.
                let fd = try TestHTTP.connectLoopback(port: port)
                try send(fd, headBytes)
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
                conns.append(Conn(fd: fd, headSent: headBytes.count))
            }
            defer { for c in conns where c.fd >= 0 { close(c.fd) } }
            var buffer = [UInt8](repeating: 0, count: 16384)
            var lastProgress = ContinuousClock.now
            var open = count
            while open > 0 {
                var fds = conns.map { c -> pollfd in
                    var events = Int16(POLLIN)
                    if !c.done && (c.headSent < headBytes.count || c.bodySent < bodyBytes) { events |= Int16(POLLOUT) }
                    return pollfd(fd: c.done ? -1 : c.fd, events: events, revents: 0)
                }
                let ready = poll(&fds, nfds_t(fds.count), 1000)
                if ready < 0 && errno != EINTR { throw TestSupportError("poll failed (errno \(errno))") }
                if ready <= 0 {
                    if ContinuousClock.now - lastProgress > .seconds(guardSeconds) { break }
                    continue
                }
                lastProgress = ContinuousClock.now
                for i in conns.indices where !conns[i].done && fds[i].revents != 0 {
                    let revents = Int32(fds[i].revents)
                    if revents & Int32(POLLIN | POLLHUP | POLLERR) != 0 {
                        let n = buffer.withUnsafeMutableBytes { recv(conns[i].fd, $0.baseAddress, $0.count, 0) }
                        if n > 0 {
                            if conns[i].received.isEmpty && conns[i].bodySent == 0 {
                                conns[i].answeredBeforeBody = true
                            }
                            conns[i].received += buffer[0..<n]
                        } else if n == 0 || (errno != EAGAIN && errno != EINTR) {
                            // The server closed its side: close ours, as a client does.
                            close(conns[i].fd)
                            conns[i].fd = -1
                            conns[i].done = true
                            open -= 1
                            continue
                        }
                    }
                    if revents & Int32(POLLOUT) != 0 {
                        if conns[i].headSent < headBytes.count {
                            let n = headBytes.withUnsafeBytes {
                                Glibc.send(
                                    conns[i].fd, $0.baseAddress! + conns[i].headSent, $0.count - conns[i].headSent,
                                    Int32(MSG_NOSIGNAL))
                            }
                            if n > 0 { conns[i].headSent += n }
                        } else if conns[i].bodySent < bodyBytes {
                            let n = chunk.withUnsafeBytes {
                                Glibc.send(
                                    conns[i].fd, $0.baseAddress!, min($0.count, bodyBytes - conns[i].bodySent),
                                    Int32(MSG_NOSIGNAL))
                            }
                            if n > 0 {
                                conns[i].bodySent += n
                            } else if errno != EAGAIN && errno != EINTR {
                                // The server stopped reading and reset: what was answered stays in `received`.
                                conns[i].bodySent = bodyBytes
                            }
                        }
                    }
                }
            }
            return FloodResult(
                statuses: conns.map { status($0.received) },
                answeredBeforeBody: conns.filter(\.answeredBeforeBody).count,
                bodyBytesSent: conns.reduce(0) { $0 + $1.bodySent })
        }
    }

    /// A process's resident set and its peak (`VmRSS`, `VmHWM` of /proc/<pid>/status), bytes.
    public static func memory(pid: Int32) -> (rss: Int, peak: Int)? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        func kilobytes(_ key: String) -> Int? {
            guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix(key + ":") }) else { return nil }
            return line.split(separator: " ").compactMap { Int($0) }.first
        }
        guard let rss = kilobytes("VmRSS"), let peak = kilobytes("VmHWM") else { return nil }
        return (rss * 1024, peak * 1024)
    }
}
