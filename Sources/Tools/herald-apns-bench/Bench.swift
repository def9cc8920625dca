import ArgumentParser
import Foundation
import HeraldCore
import HeraldPushProviders
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Benchmarks the APNs transport against nghttpd (and h2load, nghttp2's own load generator,
/// against the same server in the same run, the two alternating round by round), and against
/// herald-mock-apns with and without injected latency. Prints figures and writes them to REPORT.md
/// and REPORT.json; asserts nothing.
@main
struct APNsBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-apns-bench",
        abstract: "Throughput and CPU of Herald's APNs transport vs h2load on the same server.")

    static func main() async {
        // Process-wide, once: a write to a TLS connection the server reset fails with EPIPE instead of killing
        // the process with SIGPIPE (OpenSSL writes with write(2)).
        signal(SIGPIPE, SIG_IGN)
        await main(nil)
    }

    @Option(
        help:
            "Notifications per run (a few seconds at these rates: a run of under a second measures the start more than the steady rate)."
    )
    var requests = 1_000_000
    @Option(help: "Streams per connection (h2load -m).") var streams = 100
    @Option(help: "Connection counts to run, comma separated.") var connections = "1,2"
    @Option(help: "Targets: nghttpd, mock, latency (comma separated).") var targets = "nghttpd"
    @Option(help: "Path of the herald-mock-apns binary.") var mockPath = ".build/release/herald-mock-apns"
    @Option(help: "Latency the stand-in injects in the latency run (ms).") var latencyMs = 50
    @Option(help: "Notifications per latency run.") var latencyRequests = 20_000
    @Option(help: "Payload size in bytes.") var payloadBytes = 300
    @Option(help: "The client's in-flight bound (herald-send's default, HERALD_SEND_MAX_IN_FLIGHT).")
    var maxInFlight = 2000
    @Option(help: "Rounds per connection count: Herald and h2load alternate, each round gives a rate and a CPU ratio.")
    var rounds = 3
    @Option(help: "Directory for REPORT.md and REPORT.json (default run/apns-bench-reports/<time>).") var out: String?

    func run() async throws {
        let dir = try Workdir()
        defer { try? FileManager.default.removeItem(atPath: dir.path) }
        let counts = connections.split(separator: ",").compactMap { Int($0) }
        let payload = Self.payload(size: payloadBytes)
        try Data(payload).write(to: URL(fileURLWithPath: dir.path + "/body.json"))
        let token = String(repeating: "ab", count: 32)
        var report = BenchReport(
            requests: requests, streams: streams, payloadBytes: payload.count, rounds: max(1, rounds),
            loadAverage: BenchReport.loadAverage(), cores: ProcessInfo.processInfo.activeProcessorCount)
        for target in targets.split(separator: ",").map(String.init) {
            switch target {
            case "nghttpd":
                try FileManager.default.createDirectory(
                    atPath: dir.path + "/www/3/device", withIntermediateDirectories: true)
                guard
                    FileManager.default.createFile(
                        atPath: dir.path + "/www/3/device/\(token)", contents: Data("ok".utf8))
                else { throw ValidationError("cannot write nghttpd's document under \(dir.path)") }
                let port = try freePort()
                let server = try Server.start(
                    "/usr/sbin/nghttpd",
                    [
                        "-d", dir.path + "/www", "--address=127.0.0.1",
                        "--max-concurrent-streams=1000", String(port), dir.key, dir.cert,
                    ])
                defer { server.stop() }
                try waitForPort(port)
                print("== nghttpd on 127.0.0.1:\(port), \(requests) notifications of \(payload.count) bytes")
                for c in counts {
                    report.comparisons.append(
                        try await compare(
                            target: "nghttpd", server: server, dir: dir, port: port, connections: c, token: token,
                            payload: payload,
                            n: requests))
                }
            case "mock", "latency":
                guard FileManager.default.isExecutableFile(atPath: mockPath) else {
                    print(
                        "== \(target): \(mockPath) not found (build it: swift build -c release --product herald-mock-apns)"
                    )
                    continue
                }
                let latency = target == "latency" ? latencyMs : 0
                let portFile = dir.path + "/mock-port-\(target)"
                var args = [
                    "--port", "0", "--port-file", portFile, "--cert", dir.cert, "--key", dir.key,
                    "--auth-key", "\(dir.keyID):\(dir.teamID):\(dir.authPublic)", "--topic", "com.example.chat",
                    "--max-streams", "1000",
                ]
                if latency > 0 { args += ["--latency-ms", String(latency)] }
                let server = try Server.start(mockPath, args)
                defer { server.stop() }
                let port = try waitForPortFile(portFile)
                let n = latency > 0 ? latencyRequests : requests
                print(
                    "== herald-mock-apns on 127.0.0.1:\(port)\(latency > 0 ? ", \(latency) ms latency" : ""), \(n) notifications"
                )
                for c in counts {
                    if latency > 0 {
                        let ours = try await runOurs(
                            dir: dir, port: port, connections: c, token: token, payload: payload, n: n)
                        let ideal = Double(c * streams) / (Double(latency) / 1000)
                        report.latencyRuns.append(
                            .init(
                                connections: c, streams: streams, latencyMs: latency, notifications: n,
                                rate: ours.rate, ideal: ideal, ok: ours.ok))
                        print(
                            String(
                                format:
                                    "  %d x %d  herald %8.0f req/s = %.0f%% of conns x streams / latency (%.0f)  [200s: %d]",
                                c, streams, ours.rate, 100 * ours.rate / ideal, ideal, ours.ok))
                    } else {
                        report.comparisons.append(
                            try await compare(
                                target: "herald-mock-apns", server: server, dir: dir, port: port, connections: c,
                                token: token,
                                payload: payload, n: n))
                    }
                }
            default:
                print("unknown target \(target)")
            }
        }
        let outDir = out ?? FileManager.default.currentDirectoryPath + "/run/apns-bench-reports/" + BenchReport.stamp()
        try FileManager.default.createDirectory(atPath: outDir, withIntermediateDirectories: true)
        try report.markdown().write(toFile: outDir + "/REPORT.md", atomically: true, encoding: .utf8)
        try report.json().write(toFile: outDir + "/REPORT.json", atomically: true, encoding: .utf8)
        print("report: \(outDir)/REPORT.md (data REPORT.json)")
    }

    struct Figures {
        var rate: Double
        var cpuPer100k: Double
        var ok: Int
        /// The server's CPU per 100k requests while this client ran (how much work its traffic made there).
        var serverCPUPer100k = 0.0
    }

    /// Runs `client` and adds the server's CPU per request over the run.
    func measured(_ server: Server, n: Int, _ client: () async throws -> Figures) async throws -> Figures {
        let before = server.cpuSeconds()
        var figures = try await client()
        figures.serverCPUPer100k = (server.cpuSeconds() - before) * 100_000 / Double(n)
        return figures
    }

    /// Herald's client and h2load on the same server, `rounds` times, alternating which goes first; prints each
    /// round and the median ratios.
    func compare(
        target: String, server: Server, dir: Workdir, port: Int, connections c: Int, token: String,
        payload: [UInt8], n: Int
    ) async throws -> Comparison {
        var comparison = Comparison(target: target, connections: c, streams: streams)
        for round in 0..<max(1, rounds) {
            func herald() async throws -> Figures {
                try await measured(server, n: n) {
                    try await runOurs(dir: dir, port: port, connections: c, token: token, payload: payload, n: n)
                }
            }
            func h2load() async throws -> Figures {
                try await measured(server, n: n) {
                    try runH2load(dir: dir, port: port, connections: c, token: token, n: n)
                }
            }
            let ours: Figures
            let theirs: Figures
            if round % 2 == 0 {
                ours = try await herald()
                theirs = try await h2load()
            } else {
                theirs = try await h2load()
                ours = try await herald()
            }
            let pair = Comparison.Round(herald: ours, h2load: theirs)
            comparison.rounds.append(pair)
            print(
                String(
                    format:
                        "  %d x %d  herald %8.0f req/s %5.2f CPU-s/100k [200s: %d] | h2load %8.0f req/s %5.2f CPU-s/100k [2xx: %d] | rate ratio %.2f, CPU ratio %.2f | server %.2f / %.2f CPU-s/100k",
                    c, streams, ours.rate, ours.cpuPer100k, ours.ok, theirs.rate, theirs.cpuPer100k, theirs.ok,
                    pair.rateRatio, pair.cpuRatio, ours.serverCPUPer100k, theirs.serverCPUPer100k))
        }
        let rate = comparison.summary(\.rateRatio)
        let cpu = comparison.summary(\.cpuRatio)
        print(
            String(
                format: "  %d x %d  median of %d rounds: rate ratio %.2f (%.2f-%.2f), CPU ratio %.2f (%.2f-%.2f)",
                c, streams, comparison.rounds.count, rate.median, rate.min, rate.max, cpu.median, cpu.min, cpu.max))
        return comparison
    }

    /// The headers both clients send (h2load adds :method etc. and content-length itself).
    func headers(jwt: String) -> [(String, String)] {
        [
            ("authorization", "bearer " + jwt), ("apns-topic", "com.example.chat"), ("apns-push-type", "alert"),
            ("apns-priority", "10"), ("apns-expiration", "0"),
        ]
    }

    func runOurs(
        dir: Workdir, port: Int, connections c: Int, token: String, payload: [UInt8], n: Int
    ) async throws -> Figures {
        let config = APNsClientConfiguration(
            credential: .token(
                keyID: dir.keyID, teamID: dir.teamID, p8PEM: try String(contentsOfFile: dir.authKey, encoding: .utf8)),
            endpoint: ServiceEndpoint(host: "127.0.0.1", port: port), trustedCAFile: dir.cert, connections: c,
            maxStreamsPerConnection: streams, maxInFlight: maxInFlight,
            retry: BackoffPolicy(maxAttempts: 1))
        let client = try APNsClient(configuration: config)
        let requests = (0..<n).map { i in
            PushDelivery(
                deviceToken: token, topic: "com.example.chat", pushType: .alert, priority: .immediately,
                expiration: 0, payload: payload, timeout: .seconds(300), tag: UInt64(i))
        }
        // Warm up: every connection open and past its first answer.
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<(c * 8) { group.addTask { _ = await client.send(requests[0]) } }
        }
        let ok = Counter()
        let left = Counter()
        left.set(n)
        let start = ContinuousClock.now
        let before = cpuSeconds(RUSAGE_SELF)
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Task {
                await client.submit(requests) { response in
                    if response.status == 200 { ok.add(1) }
                    if left.add(-1) == 0 { done.resume() }
                }
            }
        }
        let elapsed = ContinuousClock.now - start
        let cpu = cpuSeconds(RUSAGE_SELF) - before
        await client.shutdown()
        let seconds = elapsed.timeInterval
        return Figures(rate: Double(n) / seconds, cpuPer100k: cpu * 100_000 / Double(n), ok: ok.value)
    }

    func runH2load(dir: Workdir, port: Int, connections c: Int, token: String, n: Int) throws -> Figures {
        var args = ["-n", String(n), "-c", String(c), "-m", String(streams), "-t", "1", "-d", dir.path + "/body.json"]
        for (name, value) in headers(jwt: dir.jwt) { args += ["-H", "\(name): \(value)"] }
        args.append("https://127.0.0.1:\(port)/3/device/\(token)")
        let before = cpuSeconds(RUSAGE_CHILDREN)
        let output = try runTool("/usr/bin/h2load", args)
        let cpu = cpuSeconds(RUSAGE_CHILDREN) - before
        var rate = 0.0
        var ok = 0
        for line in output.split(separator: "\n") {
            if line.hasPrefix("finished in"), let r = line.split(separator: ",").dropFirst().first {
                rate = Double(r.trimmingCharacters(in: .whitespaces).split(separator: " ").first ?? "") ?? 0
            }
            if line.hasPrefix("status codes:") {
                ok = Int(line.split(separator: " ").dropFirst(2).first ?? "") ?? 0
            }
        }
        return Figures(rate: rate, cpuPer100k: cpu * 100_000 / Double(n), ok: ok)
    }

    static func payload(size: Int) -> [UInt8] {
        var text = #"{"aps":{"alert":{"title":"Cindy","body":""#
        let tail = #""},"sound":"default","mutable-content":1},"channel":"c1"}"#
        text += String(repeating: "x", count: max(0, size - text.utf8.count - tail.utf8.count)) + tail
        return Array(text.utf8)
    }
}

/// A temporary folder with a self-signed P-256 server certificate, an ES256 provider key and a JWT.
struct Workdir {
    let path: String
    var cert: String { path + "/cert.pem" }
    var key: String { path + "/key.pem" }
    var authKey: String { path + "/AuthKey.p8" }
    var authPublic: String { path + "/auth-pub.pem" }
    let keyID = "BENCHKEY01"
    let teamID = "TEAM000001"
    let jwt: String

    init() throws {
        path = NSTemporaryDirectory() + "herald-apns-bench-\(getpid())"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        _ = try runTool(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", path + "/key.pem", "-out", path + "/cert.pem", "-days", "2",
                "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            ])
        _ = try runTool(
            "/usr/bin/openssl",
            [
                "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-out", path + "/AuthKey.p8",
            ])
        _ = try runTool(
            "/usr/bin/openssl", ["pkey", "-in", path + "/AuthKey.p8", "-pubout", "-out", path + "/auth-pub.pem"])
        let jwtMaker = try APNsJWT(
            keyID: keyID, teamID: teamID,
            p8PEM: try String(contentsOfFile: path + "/AuthKey.p8", encoding: .utf8))
        jwt = try jwtMaker.token(issuedAt: Date())
    }
}

/// A counter the completion callbacks share (an atomic: the client's I/O thread bumps it per answer).
final class Counter: Sendable {
    private let n = Atomic<Int>(0)
    func set(_ v: Int) { n.store(v, ordering: .relaxed) }
    @discardableResult func add(_ d: Int) -> Int { n.add(d, ordering: .acquiringAndReleasing).newValue }
    var value: Int { n.load(ordering: .acquiring) }
}

final class Server {
    let process: Process
    static func start(_ path: String, _ args: [String]) throws -> Server {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path)
        p.arguments = args
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        return Server(process: p)
    }
    init(process: Process) { self.process = process }
    /// The server's CPU seconds so far (user + system, from /proc).
    func cpuSeconds() -> Double {
        let pid = process.processIdentifier
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let ticks = ProcStat(text)?.cpuTicks
        else { return 0 }
        return ticks / Double(sysconf(Int32(_SC_CLK_TCK)))
    }
    func stop() {
        let pid = process.processIdentifier
        kill(pid, SIGTERM)
        for _ in 0..<100 where process.isRunning { usleep(20_000) }
        if process.isRunning { kill(pid, SIGKILL) }
    }
}

func runTool(_ path: String, _ args: [String]) throws -> String {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = args
    let pipe = Pipe()
    p.standardOutput = pipe
    p.standardError = FileHandle.nullDevice
    try p.run()
    let data = pipe.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return String(decoding: data, as: UTF8.self)
}

func cpuSeconds(_ who: __rusage_who) -> Double {
    var u = rusage()
    getrusage(Int32(who.rawValue), &u)
    return Double(u.ru_utime.tv_sec) + Double(u.ru_utime.tv_usec) / 1e6
        + Double(u.ru_stime.tv_sec) + Double(u.ru_stime.tv_usec) / 1e6
}

func freePort() throws -> Int {
    let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(s) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = 0
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, len) }
    }
    _ = withUnsafeMutablePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(s, $0, &len) }
    }
    return Int(UInt16(bigEndian: addr.sin_port))
}

func waitForPort(_ port: Int) throws {
    for _ in 0..<100 {
        let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = UInt16(port).bigEndian
        let rc = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        close(s)
        if rc == 0 { return }
        usleep(50_000)
    }
    throw ValidationError("server did not listen on \(port)")
}

func waitForPortFile(_ path: String) throws -> Int {
    for _ in 0..<200 {
        if let text = try? String(contentsOfFile: path, encoding: .utf8),
            let port = Int(text.trimmingCharacters(in: .whitespacesAndNewlines))
        {
            return port
        }
        usleep(50_000)
    }
    throw ValidationError("herald-mock-apns did not write \(path)")
}
