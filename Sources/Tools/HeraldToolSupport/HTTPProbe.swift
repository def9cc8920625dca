import Foundation
import HeraldCore

/// One plain HTTP/1.1 request over a connection of its own: how the tools read a stage's `/metrics` and `/readyz`
/// (`heraldctl status`, the benchmarks) and drive the stand-ins' control endpoints.
package enum HTTPProbe {
    /// What an endpoint answered.
    package struct Answer: Sendable {
        package var status: Int
        package var body: String
    }

    /// Sends `method path` with an empty body and `Connection: close`, and reads the answer to its end. Nil when the
    /// endpoint cannot be reached or answers something that is not HTTP. `timeout` (seconds) bounds the connect and
    /// every send and receive.
    package static func request(
        _ endpoint: ServiceEndpoint, method: String = "GET", path: String, timeout: Int
    ) -> Answer? {
        guard case .success(let fd) = TCPConnect.open(host: endpoint.host, port: endpoint.port, timeout: timeout)
        else { return nil }
        defer { close(fd) }
        let request = Array(
            "\(method) \(path) HTTP/1.1\r\nHost: \(endpoint)\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8)
        let sent = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        guard sent == request.count else { return nil }
        var response: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            response += buffer[0..<n]
        }
        return answer(String(decoding: response, as: UTF8.self))
    }

    /// The status and body of a whole HTTP/1.x response; nil when `text` is not one.
    package static func answer(_ text: String) -> Answer? {
        guard let split = text.range(of: "\r\n\r\n") else { return nil }
        let statusLine = text[..<split.lowerBound].split(separator: "\r\n").first ?? ""
        let parts = statusLine.split(separator: " ")
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/"), let status = Int(parts[1]) else { return nil }
        return Answer(status: status, body: String(text[split.upperBound...]))
    }
}
