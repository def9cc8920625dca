// The stand-in's second listener, plain HTTP/1.1 on the same loop: GET /metrics, GET /healthz and /readyz,
// POST /pause?ms=N and POST /resume. One small request per connection, answered and closed.
import CHeraldMockTLS
import Glibc

extension MockAPNsServer {
    func acceptHTTPClients() {
        while true {
            let fd = hmt_accept(metricsFD, 0)
            if fd < 0 { return }
            httpClients[fd] = []
            addToEpoll(fd)
        }
    }

    func handleHTTPClient(_ fd: Int32) {
        var buf = httpClients[fd] ?? []
        while true {
            let n = read(fd, readBuffer, 4096)
            if n > 0 {
                buf.append(contentsOf: UnsafeBufferPointer(start: readBuffer, count: n))
                if buf.count > 16384 { closeHTTPClient(fd); return }
            } else if n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) {
                break
            } else {
                closeHTTPClient(fd)
                return
            }
        }
        httpClients[fd] = buf
        guard let end = Self.find(Array("\r\n\r\n".utf8), in: buf) else { return }
        let requestLine = String(decoding: buf[0..<end].prefix { $0 != 0x0D }, as: UTF8.self)
        let parts = requestLine.split(separator: " ")
        let status: String
        let body: String
        let contentType: String
        if parts.count >= 2, parts[0] == "GET", parts[1] == "/metrics" {
            status = "200 OK"
            body = metrics.render()
            contentType = "text/plain; version=0.0.4; charset=utf-8"
        } else if parts.count >= 2, parts[0] == "POST", parts[1].hasPrefix("/pause") {
            // POST /pause?ms=N: hold every answer back for N milliseconds (default 30000).
            var ms = 30_000
            if let q = parts[1].split(separator: "?", maxSplits: 1).dropFirst().first {
                for kv in q.split(separator: "&") where kv.hasPrefix("ms=") { ms = Int(kv.dropFirst(3)) ?? -1 }
            }
            if ms >= 0 {
                pause(milliseconds: ms)
                status = "200 OK"
                body = "paused for \(ms) ms\n"
            } else {
                status = "400 Bad Request"
                body = "ms must be a non-negative integer\n"
            }
            contentType = "text/plain; charset=utf-8"
        } else if parts.count >= 2, parts[0] == "POST", parts[1] == "/resume" {
            resume()
            status = "200 OK"
            body = "resumed\n"
            contentType = "text/plain; charset=utf-8"
        } else if parts.count >= 2, parts[0] == "GET", parts[1] == "/healthz" || parts[1] == "/readyz" {
            status = "200 OK"
            body = "ok\n"
            contentType = "text/plain; charset=utf-8"
        } else {
            status = "404 Not Found"
            body = "not found\n"
            contentType = "text/plain; charset=utf-8"
        }
        let response = Array(
            "HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
                .utf8)
        // Small answer to a local scraper: send it in blocking mode with a short timeout.
        var flags = fcntl(fd, F_GETFL)
        flags &= ~Int32(O_NONBLOCK)
        _ = fcntl(fd, F_SETFL, flags)
        var tv = timeval(tv_sec: 1, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        response.withUnsafeBytes { raw in
            var off = 0
            while off < raw.count {
                let w = send(fd, raw.baseAddress! + off, raw.count - off, Int32(MSG_NOSIGNAL))
                if w <= 0 { break }
                off += w
            }
        }
        closeHTTPClient(fd)
    }

    func closeHTTPClient(_ fd: Int32) {
        hmt_epoll_ctl(epollFD, 2, fd, 0)
        Glibc.close(fd)
        httpClients.removeValue(forKey: fd)
    }

    static func find(_ needle: [UInt8], in hay: [UInt8]) -> Int? {
        guard hay.count >= needle.count else { return nil }
        for i in 0...(hay.count - needle.count) where hay[i] == needle[0] {
            if Array(hay[i..<(i + needle.count)]) == needle { return i }
        }
        return nil
    }
}
