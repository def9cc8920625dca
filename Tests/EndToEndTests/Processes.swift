// What the end-to-end suite adds to HeraldTestSupport (child processes, ports, waits): a shared value for test
// bookkeeping and a plain HTTP status probe for the stages' endpoints.
import Foundation
import HeraldTestSupport
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A value shared between tasks of a test, behind a `Mutex` (a class, so a struct suite can hold it).
final class Guarded<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    func withLock<R: Sendable>(_ body: (inout Value) throws -> R) rethrows -> R {
        try value.withLock { try body(&$0) }
    }
}

typealias HarnessError = TestSupportError

/// GET http://127.0.0.1:port/path over a plain socket; returns the status code (nil when unreachable).
func httpStatus(port: Int, path: String) -> Int? {
    guard let fd = try? TestHTTP.connectLoopback(port: port, receiveTimeoutSeconds: 2) else { return nil }
    defer { close(fd) }
    let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8)
    _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
    var buffer = [UInt8](repeating: 0, count: 256)
    let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
    guard n > 12 else { return nil }
    let head = String(decoding: buffer[0..<n], as: UTF8.self)
    let parts = head.split(separator: " ")
    guard parts.count > 1 else { return nil }
    return Int(parts[1])
}

/// GET http://127.0.0.1:port/path and the whole body (nil when unreachable or not a 200).
func httpBody(port: Int, path: String) -> String? {
    guard let fd = try? TestHTTP.connectLoopback(port: port, receiveTimeoutSeconds: 2) else { return nil }
    defer { close(fd) }
    let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8)
    _ = request.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
    var response: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n < 0, errno == EINTR { continue }  // a receive timeout makes recv return EINTR on a signal
        if n <= 0 { break }
        response += buffer[0..<n]
    }
    let text = String(decoding: response, as: UTF8.self)
    guard text.hasPrefix("HTTP/1.1 200"), let split = text.range(of: "\r\n\r\n") else { return nil }
    return String(text[split.upperBound...])
}
