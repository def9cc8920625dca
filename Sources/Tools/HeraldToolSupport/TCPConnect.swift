import Foundation

/// A TCP connection opened with a deadline: `HTTPProbe` reads the stages' and the stand-ins' endpoints through it,
/// and heraldctl's Kafka commands use it to fail at once when no broker accepts connections (librdkafka would retry
/// until its own timeout).
package enum TCPConnect {
    /// A connected socket (the caller closes it), or the reason none could be opened to any address of `host`.
    /// `timeout` (seconds) bounds the connect and every later send and receive on the socket.
    package static func open(host: String, port: Int, timeout: Int) -> Result<Int32, TCPConnectError> {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let looked = getaddrinfo(host, String(port), &hints, &list)
        guard looked == 0, let first = list else {
            return .failure(TCPConnectError(reason: "cannot resolve \(host): \(String(cString: gai_strerror(looked)))"))
        }
        defer { freeaddrinfo(list) }
        var reason = "no address"
        var candidate: UnsafeMutablePointer<addrinfo>? = first
        while let a = candidate {
            let s = socket(a.pointee.ai_family, a.pointee.ai_socktype, a.pointee.ai_protocol)
            if s >= 0 {
                var tv = timeval(tv_sec: timeout, tv_usec: 0)
                setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
                setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
                if connect(s, a.pointee.ai_addr, a.pointee.ai_addrlen) == 0 { return .success(s) }
                reason = String(cString: strerror(errno))
                close(s)
            }
            candidate = a.pointee.ai_next
        }
        return .failure(TCPConnectError(reason: reason))
    }
}

package struct TCPConnectError: Error, CustomStringConvertible {
    package var reason: String
    package var description: String { reason }
}
