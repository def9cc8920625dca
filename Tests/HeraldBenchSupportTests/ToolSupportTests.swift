// What the tools share (HeraldToolSupport): the Prometheus text reader heraldctl status and the benchmarks read
// /metrics with, the one HTTP request they send, and the JSON their reports are written in.
import Foundation
import HeraldCore
import Testing

@testable import HeraldToolSupport

@Suite("Prometheus text")
struct PrometheusTextTests {
    @Test("names, labels and values are read; comments, blank lines and lines without a number are passed over")
    func readsSamples() {
        let text = """
            # HELP herald_consumed_total Records consumed.
            # TYPE herald_consumed_total counter
            herald_consumed_total{stage="render",topic="herald.deliverable"} 12

            herald_consumed_total{stage="render",topic="herald.retry"} 3
            herald_in_flight 7
            herald_broken{stage="render"} not-a-number
            """
        let samples = MetricSamples(text).samples
        #expect(
            samples == [
                MetricSample(
                    name: "herald_consumed_total", labels: ["stage": "render", "topic": "herald.deliverable"],
                    value: 12),
                MetricSample(
                    name: "herald_consumed_total", labels: ["stage": "render", "topic": "herald.retry"], value: 3),
                MetricSample(name: "herald_in_flight", labels: [:], value: 7),
            ])
        #expect(MetricSamples(text).sum("herald_consumed_total") == 15)
        #expect(MetricSamples(text).sum("herald_dlq_total") == nil)
    }

    @Test("label values keep escaped quotes, backslashes, newlines, commas, braces and spaces")
    func readsEscapedLabelValues() {
        let line = #"herald_x{reason="a \"quoted\" word, {braced}",path="C:\\dir",text="two\nlines"} 1.5"#
        let sample = MetricSamples(line).samples.first
        #expect(
            sample?.labels == ["reason": #"a "quoted" word, {braced}"#, "path": #"C:\dir"#, "text": "two\nlines"])
        #expect(sample?.value == 1.5)
    }

    @Test("a timestamp after the value is not taken for the value; +Inf and -Inf buckets are read")
    func readsTimestampsAndInfinities() {
        let text = """
            herald_stage_latency_seconds_bucket{le="+Inf"} 42 1700000000000
            herald_gauge -Inf
            """
        let samples = MetricSamples(text).samples
        #expect(samples.map(\.value) == [42, -.infinity])
        #expect(samples.first?.labels["le"] == "+Inf")
    }
}

@Suite("HTTP probe")
struct HTTPProbeTests {
    @Test("a response's status and body are read; text that is not HTTP is refused")
    func readsAnswers() {
        let answer = HTTPProbe.answer("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno")
        #expect(answer?.status == 503)
        #expect(answer?.body == "no")
        #expect(HTTPProbe.answer("HTTP/1.0 200 OK\r\n\r\n")?.body == "")
        #expect(HTTPProbe.answer("SSH-2.0-OpenSSH\r\n\r\n") == nil)
        #expect(HTTPProbe.answer("HTTP/1.1 200 OK\r\n") == nil)
    }

    @Test("one request over loopback: method, path and Host go out, the whole answer comes back")
    func requestsOverLoopback() throws {
        let server = try OneShotServer(answer: "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nherald_in_flight 3\n")
        let answer = HTTPProbe.request(
            ServiceEndpoint(host: "127.0.0.1", port: server.port), method: "POST", path: "/pause?ms=5", timeout: 5)
        let head = server.received()
        #expect(answer?.status == 200)
        #expect(answer.map { MetricSamples($0.body).sum("herald_in_flight") } == 3)
        #expect(head.hasPrefix("POST /pause?ms=5 HTTP/1.1\r\n"))
        #expect(head.contains("\r\nHost: 127.0.0.1:\(server.port)\r\n"))
    }

    @Test("nothing listening: no answer")
    func nothingListening() throws {
        // A port bound but not listening: the connection is refused, and no one else can take the port meanwhile.
        let server = try OneShotServer(answer: "")
        defer { server.closeWithoutServing() }
        let answer = HTTPProbe.request(ServiceEndpoint(host: "127.0.0.1", port: server.port), path: "/", timeout: 2)
        #expect(answer == nil)
    }
}

@Suite("Report JSON")
struct ReportJSONTests {
    @Test("objects are written with their keys sorted, at every level")
    func sortsKeys() {
        let value = JSONValue.sorted([
            "b": .int(2), "a": .sorted(["z": .bool(true), "y": .null]), "c": .strings(["x"]),
        ])
        #expect(value.serialized == #"{"a":{"y":null,"z":true},"b":2,"c":["x"]}"#)
    }

    @Test("numbers: whole numbers as integers, fractions as they are, nil and non-finite as null")
    func writesNumbers() {
        #expect(JSONValue.double(12.0).serialized == "12")
        #expect(JSONValue.double(0.25).serialized == "0.25")
        #expect(JSONValue.double(-3.5).serialized == "-3.5")
        #expect(JSONValue.double(.nan) == .null)
        #expect(JSONValue.double(.infinity) == .null)
        #expect(JSONValue.double(nil) == .null)
        #expect(JSONValue.int(UInt64.max).serialized == "18446744073709551615")
        #expect(JSONValue.int(Int?.none) == .null)
        #expect(JSONValue.text(nil) == .null)
        #expect(JSONValue.text("a\"b").serialized == #""a\"b""#)
    }

    @Test("the pretty form has the layout of Foundation's pretty-printed, key-sorted JSON")
    func prettyMatchesFoundation() throws {
        let value = JSONValue.sorted([
            "scenario": .sorted(["mode": .string("rate"), "users": .int(2000), "mixed": .bool(false)]),
            "series": .array([.sorted(["second": .int(1), "p99_ms": .int(4)]), .sorted(["second": .int(2)])]),
            "problems": .strings(["1 lost", "a \"quoted\" one"]),
            "lost": .int(0),
            "redis": .null,
        ])
        let foundation = try JSONSerialization.data(
            withJSONObject: [
                "scenario": ["mode": "rate", "users": 2000, "mixed": false] as [String: Any],
                "series": [["second": 1, "p99_ms": 4], ["second": 2]],
                "problems": ["1 lost", "a \"quoted\" one"],
                "lost": 0,
                "redis": NSNull(),
            ] as [String: Any], options: [.prettyPrinted, .sortedKeys])
        #expect(value.prettyPrinted == String(decoding: foundation, as: UTF8.self))
        #expect(try JSONValue.parse(value.prettyPrinted) == value)
    }
}

/// A loopback listener that accepts one connection, reads the request head, writes `answer` and closes.
private final class OneShotServer: @unchecked Sendable {
    // `fd` is set once in init; the request text is handed over through the semaphore.
    let port: Int
    private let fd: Int32
    private var request = ""
    private let done = DispatchSemaphore(value: 0)

    init(answer: String) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.fd = fd
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) }
        }
        guard bound == 0 else { throw POSIXError(.EADDRINUSE) }
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        port = Int(UInt16(bigEndian: addr.sin_port))
        guard !answer.isEmpty else { return }
        guard listen(fd, 1) == 0 else { throw POSIXError(.EADDRINUSE) }
        let listener = fd
        Thread { [self] in
            let client = accept(listener, nil, nil)
            defer {
                close(client)
                close(listener)
                done.signal()
            }
            guard client >= 0 else { return }
            var received: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while !String(decoding: received, as: UTF8.self).contains("\r\n\r\n") {
                let n = buffer.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
                if n <= 0 { break }
                received += buffer[0..<n]
            }
            request = String(decoding: received, as: UTF8.self)
            let bytes = Array(answer.utf8)
            _ = bytes.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        }.start()
    }

    /// The request head the server read (after it answered).
    func received() -> String {
        done.wait()
        return request
    }

    /// Closes the socket of a server made with an empty answer (which never listens).
    func closeWithoutServing() { close(fd) }
}
