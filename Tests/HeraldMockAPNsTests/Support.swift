// Test support of the stand-in's tests: provider tokens made by Python, the stand-in binary on an ephemeral
// port, and what `nghttp -v` reports. Processes and TLS material come from HeraldTestSupport.
import Foundation
import HeraldTestSupport
import Testing

enum TestError: Error, CustomStringConvertible {
    case failed(String)
    var description: String { if case .failed(let s) = self { return s }; return "" }
}

/// Runs a program to completion, stdout and stderr captured together (HeraldTestSupport's `runTool`).
@discardableResult
func runProcess(_ executable: String, _ arguments: [String]) async throws -> ToolResult {
    try await runToolAsync(executable, arguments)
}

extension TestPKI {
    var jwtScript: String { dir + "/jwt.py" }

    /// An ES256 provider token made by Python's `cryptography`, independently of the server's code.
    func jwt(key: String? = nil, kid: String, iss: String, iat: Int) async throws -> String {
        if !FileManager.default.fileExists(atPath: jwtScript) {
            try Self.jwtSource.write(toFile: jwtScript, atomically: true, encoding: .utf8)
        }
        let r = try await runProcess("python3", [jwtScript, key ?? providerKey, kid, iss, String(iat)])
        guard r.status == 0 else { throw TestError.failed("jwt.py: \(r.output)") }
        return r.output.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static let jwtSource = """
        import base64, json, sys
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
        key = serialization.load_pem_private_key(open(sys.argv[1], "rb").read(), None)
        b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
        header = b64(json.dumps({"alg": "ES256", "kid": sys.argv[2]}).encode())
        claims = b64(json.dumps({"iss": sys.argv[3], "iat": int(sys.argv[4])}).encode())
        r, s = decode_dss_signature(key.sign(f"{header}.{claims}".encode(), ec.ECDSA(hashes.SHA256())))
        print(f"{header}.{claims}.{b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}")
        """
}

/// The herald-mock-apns binary running on an ephemeral port; stopped with SIGTERM.
final class MockProcess: Sendable {
    let process: SpawnedProcess
    let port: Int
    let metricsPort: Int?
    let stderrFile: URL

    /// Starts the stand-in on a thread of its own (reading its first line blocks).
    static func start(pki: TestPKI, _ arguments: [String]) async throws -> MockProcess {
        try await offPool { try MockProcess(pki: pki, arguments) }
    }

    init(pki: TestPKI, _ arguments: [String]) throws {
        let exe = Paths.binDirectory + "/herald-mock-apns"
        guard FileManager.default.isExecutableFile(atPath: exe) else {
            throw TestError.failed("\(exe) not built (run swift build, or set HERALD_BIN_DIR)")
        }
        let portFile = pki.dir + "/port-\(UUID().uuidString)"
        stderrFile = URL(fileURLWithPath: pki.dir + "/stderr-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: stderrFile.path, contents: nil) else {
            throw TestError.failed("cannot create \(stderrFile.path)")
        }
        process = try SpawnedProcess(
            exe,
            ["--port", "0", "--cert", pki.serverCert, "--key", pki.serverKey, "--port-file", portFile] + arguments,
            stdout: .pipe, stderr: .file(stderrFile.path))
        // The first stdout line says where it listens.
        let text = process.readLine() ?? ""
        guard let m = text.firstMatch(of: /listening on 127\.0\.0\.1:(\d+)/), let p = Int(m.1) else {
            let err = (try? String(contentsOf: stderrFile, encoding: .utf8)) ?? ""
            process.signal(SIGTERM)
            process.waitForExit()
            throw TestError.failed("no 'listening on' line: \(text) \(err)")
        }
        port = p
        metricsPort = text.firstMatch(of: /metrics on 127\.0\.0\.1:(\d+)/).flatMap { Int($0.1) }
        let written = try String(contentsOfFile: portFile, encoding: .utf8).trimmingCharacters(
            in: .whitespacesAndNewlines)
        guard written == String(p) else { throw TestError.failed("--port-file holds \(written), stdout said \(p)") }
    }

    var url: String { "https://127.0.0.1:\(port)" }

    /// SIGTERM, then the exit status.
    func stop() -> Int32 {
        process.signal(SIGTERM)
        return process.waitForExit()
    }

    deinit {
        process.signal(SIGTERM)
        process.waitForExit()
    }

    func metrics() async throws -> String {
        guard let metricsPort else { throw TestError.failed("no metrics port") }
        return try await runProcess("curl", ["-s", "http://127.0.0.1:\(metricsPort)/metrics"]).output
    }
}

/// One response as `nghttp -v` printed it.
struct H2Answer {
    var streamID: Int
    var status: Int
    var apnsID: String?
    var reason: String?
    var timestamp: Int64?
}

/// What `nghttp -v` showed of one connection.
struct H2Transcript {
    var output: String
    var answers: [H2Answer]
    /// SETTINGS_MAX_CONCURRENT_STREAMS values the server sent, in order.
    var serverMaxConcurrentStreams: [Int]
    var goawayLastStreamID: Int?
    var refusedStreams: [Int]
}

/// Sends POSTs (one per path) on one connection with nghttp and parses its verbose output.
func nghttp(
    _ base: String, paths: [String], headers: [String: String] = [:], body: String? = nil,
    method: String = "POST", extra: [String] = [], pki: TestPKI
) async throws -> H2Transcript {
    var args = ["-v", "-t", "10"]
    if method != "GET" { args += ["-H", ":method: \(method)"] }
    for (k, v) in headers.sorted(by: { $0.key < $1.key }) { args += ["-H", "\(k): \(v)"] }
    if let body { args += ["-d", try pki.write("body-\(UUID().uuidString).json", body)] }
    args += extra
    args += paths.map { base + $0 }
    let r = try await runProcess("nghttp", args)
    return parseNghttp(r.output)
}

func parseNghttp(_ out: String) -> H2Transcript {
    var byStream: [Int: H2Answer] = [:]
    var order: [Int] = []
    var settings: [Int] = []
    var goaway: Int?
    var refused: [Int] = []
    var inServerSettings = false
    var lastRSTStream: Int?
    var previousLineWasGoaway = false
    for line in out.split(separator: "\n", omittingEmptySubsequences: false) {
        if line.contains("recv SETTINGS frame") { inServerSettings = true; continue }
        if line.contains("send ") || (line.contains("recv ") && !line.contains("SETTINGS")) { inServerSettings = false }
        if inServerSettings, let m = line.firstMatch(of: /SETTINGS_MAX_CONCURRENT_STREAMS\(0x03\):(\d+)/) {
            settings.append(Int(m.1)!)
        }
        if let m = line.firstMatch(of: /recv \(stream_id=(\d+)\) :status: (\d+)/) {
            let id = Int(m.1)!
            byStream[id] = H2Answer(streamID: id, status: Int(m.2)!)
            order.append(id)
        }
        if let m = line.firstMatch(of: /recv \(stream_id=(\d+)\) apns-id: ([0-9a-fA-F-]+)/) {
            byStream[Int(m.1)!]?.apnsID = String(m.2)
        }
        if previousLineWasGoaway, let m = line.firstMatch(of: /last_stream_id=(\d+)/) { goaway = Int(m.1)! }
        defer { previousLineWasGoaway = line.contains("recv GOAWAY") }
        if let m = line.firstMatch(of: /recv RST_STREAM frame <length=4, flags=0x00, stream_id=(\d+)>/) {
            lastRSTStream = Int(m.1)!
        }
        if line.contains("REFUSED_STREAM"), let id = lastRSTStream { refused.append(id); lastRSTStream = nil }
    }
    // Bodies are printed raw just before the DATA frame line of their stream.
    for m in out.matches(
        of:
            /\{"reason":"(\w+)"(?:,"timestamp":(\d+))?\}\[[ 0-9.]+\] recv DATA frame <length=\d+, flags=0x01, stream_id=(\d+)>/
    ) {
        let id = Int(m.3)!
        byStream[id]?.reason = String(m.1)
        byStream[id]?.timestamp = m.2.flatMap { Int64($0) }
    }
    return H2Transcript(
        output: out, answers: order.compactMap { byStream[$0] }, serverMaxConcurrentStreams: settings,
        goawayLastStreamID: goaway, refusedStreams: refused)
}

/// Runs h2load and returns (2xx, 4xx, 5xx, succeeded, req/s).
func h2load(
    _ url: String, n: Int, c: Int = 1, m: Int, headers: [String: String], bodyFile: String
) async throws
    -> (ok: Int, c4: Int, c5: Int, succeeded: Int, rate: Double, output: String)
{
    var args = ["-n", String(n), "-c", String(c), "-m", String(m), "-d", bodyFile]
    for (k, v) in headers.sorted(by: { $0.key < $1.key }) { args += ["-H", "\(k): \(v)"] }
    args.append(url)
    let r = try await runProcess("h2load", args)
    let codes = r.output.firstMatch(of: /status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx/)
    let done = r.output.firstMatch(of: /(\d+) succeeded/)
    let rate = r.output.firstMatch(of: /finished in [0-9.]+m?s, ([0-9.]+) req\/s/)
    return (
        Int(codes?.1 ?? "0")!, Int(codes?.3 ?? "0")!, Int(codes?.4 ?? "0")!, Int(done?.1 ?? "0")!,
        Double(rate?.1 ?? "0")!, r.output
    )
}

/// Reads a Prometheus counter value from /metrics text.
func metricValue(_ text: String, _ series: String) -> Int {
    for line in text.split(separator: "\n") where line.hasPrefix(series + " ") {
        return Int(line.dropFirst(series.count + 1)) ?? -1
    }
    return 0
}

/// A misbehaving HTTP/2 client (python3's ssl, raw frames): sends the preface, an empty SETTINGS,
/// optionally an ACK of the server's SETTINGS (SETTINGS_MAX_CONCURRENT_STREAMS = 1 on a token
/// connection) and then two requests at once on streams 1 and 3. Returns the GOAWAY error code
/// and the RST_STREAM codes by stream id the server sent back.
func twoStreamsAtOnce(
    port: Int, path: String, acknowledgeSettings: Bool, pki: TestPKI
) async throws
    -> (goaway: Int?, resets: [Int: Int])
{
    let script = #"""
        import socket, ssl, struct, sys
        port, path, ack = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "ack"
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=5))
        def frame(t, flags, sid, payload=b""):
            return struct.pack(">I", len(payload))[1:] + bytes([t, flags]) + struct.pack(">I", sid) + payload
        def lit(n, v):
            return b"\x00" + bytes([len(n)]) + n.encode() + bytes([len(v)]) + v.encode()
        block = lit(":method", "POST") + lit(":scheme", "https") + lit(":path", path) + lit(":authority", "localhost")
        out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + (frame(4, 1, 0) if ack else b"")
        s.sendall(out + frame(1, 5, 1, block) + frame(1, 5, 3, block))
        data, i, done = b"", 0, False
        while not done:
            chunk = s.recv(65536)
            if not chunk: break
            data += chunk
            while i + 9 <= len(data):
                n = int.from_bytes(data[i:i+3], "big")
                if i + 9 + n > len(data): break
                t, sid, p = data[i+3], int.from_bytes(data[i+5:i+9], "big") & 0x7fffffff, data[i+9:i+9+n]
                if t == 7: print("goaway", int.from_bytes(p[4:8], "big")); done = True
                if t == 3: print("rst", sid, int.from_bytes(p[0:4], "big")); done = True
                i += 9 + n
        """#
    let file = try pki.write("two-streams-\(UUID().uuidString).py", script)
    let r = try await runProcess("python3", [file, String(port), path, acknowledgeSettings ? "ack" : "noack"])
    var goaway: Int?
    var resets: [Int: Int] = [:]
    for line in r.output.split(separator: "\n") {
        let f = line.split(separator: " ").map(String.init)
        if f.count == 2, f[0] == "goaway" { goaway = Int(f[1]) }
        if f.count == 3, f[0] == "rst", let id = Int(f[1]) { resets[id] = Int(f[2]) }
    }
    return (goaway, resets)
}
