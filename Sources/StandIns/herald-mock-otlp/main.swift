// herald-mock-otlp: an OTLP/HTTP trace receiver stand-in (the local stack, the demo, tests). Plain HTTP/1.1 with
// keep-alive on one port: `POST /v1/traces` (protobuf) keeps the spans, `GET /v1/spans?trace_id=|event_id=` answers
// them as JSON, `GET /healthz`. It decodes with HeraldToolSupport's OTLP reader, written from the OTLP definitions
// apart from the writer the stages export with (HeraldTracing).
import ArgumentParser
import Foundation
import Glibc
import HeraldToolSupport
import Synchronization

@main
struct MockOTLP: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-mock-otlp",
        abstract: "OTLP/HTTP trace receiver stand-in: keeps the spans it is sent and answers them as JSON.",
        discussion: """
            POST /v1/traces (application/x-protobuf): 200 with an empty ExportTraceServiceResponse, 400 for a body \
            that is not an OTLP trace request, 415 for another content type or an encoded (compressed) body. \
            GET /v1/spans?trace_id=HEX or ?event_id=ID: {"spans": [...]}, every span of the trace, or of each trace \
            in which a span carries herald.event_id = ID, by start time; GET /v1/spans: every span kept, oldest \
            first. GET /healthz: ok.
            """)

    @Option(help: "Address to listen on.") var host = "127.0.0.1"
    @Option(help: "Port (0: the kernel picks; the chosen port is printed).") var port = 4318
    @Option(name: .customLong("max-spans"), help: "Spans kept; beyond it the oldest are dropped.") var maxSpans =
        50_000
    @Option(name: .customLong("port-file"), help: "Write the bound port to this file once listening.") var portFile:
        String?

    func validate() throws {
        guard maxSpans > 0 else { throw ValidationError("--max-spans: a positive number") }
        guard (0...65535).contains(port) else { throw ValidationError("--port: 0 to 65535") }
    }

    func run() throws {
        // SIGTERM and SIGINT are blocked in every thread (the server's threads inherit the mask) and taken here by
        // sigwait; a write to a connection the client reset fails with EPIPE instead of raising SIGPIPE.
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        signal(SIGPIPE, SIG_IGN)
        let server = try OTLPServer(host: host, port: port, maxSpans: maxSpans)
        server.start()
        FileHandle.standardOutput.write(Data("herald-mock-otlp listening on \(host):\(server.port)\n".utf8))
        if let portFile { try String(server.port).write(toFile: portFile, atomically: true, encoding: .utf8) }
        var signalNumber: Int32 = 0
        while sigwait(&set, &signalNumber) != 0 {}
        fflush(nil)
        _exit(0)
    }
}

struct ServerError: Error, CustomStringConvertible {
    var description: String
}

/// The listener and a thread per connection; the spans live in one store under a lock.
final class OTLPServer: Sendable {
    let port: Int
    private let listener: Int32
    private let store: Mutex<OTLPSpanStore>
    /// The largest request body accepted (413 beyond it).
    static let maxBody = 32 << 20

    init(host: String, port: Int, maxSpans: Int) throws {
        store = Mutex(OTLPSpanStore(maxSpans: maxSpans))
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw ServerError(description: "socket: \(String(cString: strerror(errno)))") }
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else {
            close(fd)
            throw ServerError(description: "--host: not an IPv4 address: \(host)")
        }
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw ServerError(description: "cannot listen on \(host):\(port): \(reason)")
        }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        listener = fd
        self.port = Int(UInt16(bigEndian: address.sin_port))
    }

    func start() {
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "otlp-accept"
        thread.start()
    }

    private func acceptLoop() {
        while true {
            let connection = accept(listener, nil, nil)
            if connection < 0 {
                if errno == EINTR || errno == ECONNABORTED || errno == EMFILE { continue }
                return
            }
            let thread = Thread { [self] in serve(connection) }
            thread.name = "otlp-conn"
            thread.start()
        }
    }

    /// One request as read off a connection.
    struct Request {
        var method: String
        var target: String
        var headers: [String: String]
        var body: [UInt8]
    }

    /// An answer: status, content type and body.
    struct Answer {
        var status: Int
        var contentType: String
        var body: [UInt8]

        static func text(_ status: Int, _ message: String) -> Answer {
            Answer(status: status, contentType: "text/plain; charset=utf-8", body: Array((message + "\n").utf8))
        }
    }

    /// Requests one after another on the connection (keep-alive) until the peer closes, asks to close, or sends
    /// something that is not a request this server can frame.
    private func serve(_ connection: Int32) {
        defer { close(connection) }
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let separator = Array("\r\n\r\n".utf8)
        while true {
            var headEnd = Self.find(separator, in: buffer)
            while headEnd == nil {
                if buffer.count > 64 << 10 { return }
                let n = read(connection, &chunk, chunk.count)
                if n <= 0 { return }
                buffer += chunk[0..<n]
                headEnd = Self.find(separator, in: buffer)
            }
            guard let end = headEnd else { return }
            let headLines = String(decoding: buffer[0..<end], as: UTF8.self).components(separatedBy: "\r\n")
            let requestLine = headLines[0].split(separator: " ")
            guard requestLine.count == 3 else {
                respond(connection, .text(400, "not an HTTP request line"), close: true)
                return
            }
            var headers: [String: String] = [:]
            for line in headLines.dropFirst() {
                guard let colon = line.firstIndex(of: ":") else { continue }
                headers[line[..<colon].lowercased()] = line[line.index(after: colon)...]
                    .trimmingCharacters(in: .whitespaces)
            }
            if headers["transfer-encoding"] != nil {
                respond(connection, .text(411, "a Content-Length is required (no chunked bodies)"), close: true)
                return
            }
            let length = Int(headers["content-length"] ?? "0") ?? -1
            guard length >= 0, length <= Self.maxBody else {
                respond(connection, .text(413, "body too large or Content-Length unreadable"), close: true)
                return
            }
            let bodyStart = end + separator.count
            while buffer.count < bodyStart + length {
                let n = read(connection, &chunk, chunk.count)
                if n <= 0 { return }
                buffer += chunk[0..<n]
            }
            let request = Request(
                method: String(requestLine[0]), target: String(requestLine[1]), headers: headers,
                body: Array(buffer[bodyStart..<bodyStart + length]))
            buffer.removeFirst(bodyStart + length)
            let closing =
                headers["connection"]?.lowercased() == "close" || requestLine[2].uppercased() == "HTTP/1.0"
            respond(connection, handle(request), close: closing)
            if closing { return }
        }
    }

    /// The routes.
    func handle(_ request: Request) -> Answer {
        let parts = request.target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let path = String(parts[0])
        let query = parts.count > 1 ? Self.query(String(parts[1])) : [:]
        switch (request.method, path) {
        case ("POST", "/v1/traces"):
            let type = (request.headers["content-type"] ?? "").split(separator: ";").first.map {
                $0.trimmingCharacters(in: .whitespaces).lowercased()
            }
            guard type == "application/x-protobuf" else {
                return .text(415, "expected Content-Type application/x-protobuf (OTLP/HTTP protobuf)")
            }
            if let encoding = request.headers["content-encoding"], encoding.lowercased() != "identity" {
                return .text(415, "Content-Encoding \(encoding) is not supported; send the request uncompressed")
            }
            do {
                let spans = try OTLPTraces.decodeExportRequest(request.body)
                store.withLock { $0.add(spans) }
                return Answer(
                    status: 200, contentType: "application/x-protobuf", body: OTLPTraces.emptyExportResponse)
            } catch {
                return .text(400, "not an OTLP ExportTraceServiceRequest: \(error)")
            }
        case ("GET", "/v1/spans"):
            let spans: [OTLPSpan]
            if let traceID = query["trace_id"], !traceID.isEmpty {
                spans = store.withLock { $0.spans(traceID: traceID) }
            } else if let eventID = query["event_id"], !eventID.isEmpty {
                spans = store.withLock { $0.spans(eventID: eventID) }
            } else if query.isEmpty {
                spans = store.withLock { $0.all }
            } else {
                return .text(400, "give trace_id=HEX or event_id=ID, or nothing for every span kept")
            }
            return Answer(status: 200, contentType: "application/json", body: OTLPSpanStore.json(spans))
        case ("GET", "/healthz"):
            return .text(200, "ok")
        case (_, "/v1/traces"), (_, "/v1/spans"), (_, "/healthz"):
            return .text(405, "method not allowed")
        default:
            return .text(404, "not found")
        }
    }

    private func respond(_ connection: Int32, _ answer: Answer, close: Bool) {
        let reasons = [
            200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
            413: "Content Too Large", 415: "Unsupported Media Type",
        ]
        let head =
            "HTTP/1.1 \(answer.status) \(reasons[answer.status] ?? "Error")\r\ncontent-type: \(answer.contentType)\r\n"
            + "content-length: \(answer.body.count)\r\n\(close ? "connection: close\r\n" : "")\r\n"
        let bytes = Array(head.utf8) + answer.body
        var sent = 0
        while sent < bytes.count {
            let n = bytes[sent...].withUnsafeBytes { send(connection, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            sent += n
        }
    }

    /// `a=1&b=2` with percent-encoding and `+` for space undone.
    static func query(_ text: String) -> [String: String] {
        var values: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ s: Substring) -> String {
                let spaced = s.replacingOccurrences(of: "+", with: " ")
                return spaced.removingPercentEncoding ?? spaced
            }
            values[decode(kv[0])] = kv.count > 1 ? decode(kv[1]) : ""
        }
        return values
    }

    static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for start in 0...(haystack.count - needle.count)
        where haystack[start..<start + needle.count].elementsEqual(needle) {
            return start
        }
        return nil
    }
}
