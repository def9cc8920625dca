// herald-bench spans: what one exported span costs a stage's process.
import ArgumentParser
import Foundation
import Glibc
import HeraldBenchSupport
import HeraldConfig
import HeraldCore
import HeraldToolSupport
import HeraldTracing
import Logging
import ServiceLifecycle

struct SpansBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "spans",
        abstract: "CPU per span of a stage's span exporter, exporting to herald-mock-otlp.",
        discussion: """
            Starts herald-mock-otlp (beside this executable) on a free port and a stage's span exporter in this
            process, then records --spans spans the way a stage records a traced event's span (a parent context,
            the messaging and Herald attributes, a "processing" event) and a `POST` child span for every
            --requests-every'th of them, in rounds of --round spans with --pause-ms between rounds (a stage's batches).
            It stops the exporter, which sends what is left, and checks that herald-mock-otlp received every span.
            Prints this process's CPU (user + system, all threads, from getrusage) per span, and what that adds to a
            notification at the tracing ratio given (--ratio, spans per event --spans-per-event, notifications per
            event --notifications-per-event, the figures of the groups-of-5 pipeline run).
            """)

    @Option(help: "Spans to record.") var spans = 20_000
    @Option(help: "Spans recorded together, as one stage batch's traced events.") var round = 20
    @Option(help: "Pause between rounds, in milliseconds (0: none).") var pauseMs = 2
    @Option(help: "Every n-th span gets a POST child span, as send's provider requests (0: none).")
    var requestsEvery = 6
    @Option(help: "Tracing ratio to translate the cost per span into a cost per notification.") var ratio = 0.01
    @Option(help: "Spans per traced event (stage spans and provider requests).") var spansPerEvent = 5.2
    @Option(help: "Notifications delivered per event.") var notificationsPerEvent = 2.8

    func run() async throws {
        let directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path
        let portFile = NSTemporaryDirectory() + "herald-bench-spans-\(getpid()).port"
        let receiver = Process()
        receiver.executableURL = URL(fileURLWithPath: directory + "/herald-mock-otlp")
        receiver.arguments = ["--port", "0", "--port-file", portFile, "--max-spans", String(spans * 2 + 10)]
        receiver.standardOutput = FileHandle.nullDevice
        try receiver.run()
        defer {
            receiver.terminate()
            receiver.waitUntilExit()
            unlink(portFile)
        }
        var port: Int?
        for _ in 0..<500 where port == nil {
            port = (try? String(contentsOfFile: portFile, encoding: .utf8)).flatMap { Int($0) }
            if port == nil { try await Task.sleep(for: .milliseconds(10)) }
        }
        guard let port else { throw BenchError("herald-mock-otlp did not start") }

        var file = TracingConfig()
        file.enabled = true
        file.endpoint = "http://127.0.0.1:\(port)"
        let settings = try TracingSettings(file: file, environment: [:], stage: "herald-bench-spans")
        var logger = Logger(label: "herald-bench")
        logger.logLevel = .warning
        let dropped = DropCount()
        let export = try SpanExport(settings: settings, logger: logger) { _, count in dropped.add(count) }
        let group = ServiceGroup(services: [export.service], logger: logger)

        /// Runs the rounds; with `export`, records the spans. Returns the number of POST child spans.
        @Sendable func paced(record export: SpanExport?) async throws -> Int {
            var made = 0
            var requests = 0
            while made < spans {
                let now = Self.nanoseconds()
                for _ in 0..<min(round, spans - made) {
                    made += 1
                    let withRequest = requestsEvery > 0 && made % requestsEvery == 0 && made < spans
                    guard let export else {
                        if withRequest { made += 1 }
                        continue
                    }
                    let span = export.startSpan(
                        "herald-bench process", continuing: parent, kind: .consumer,
                        startNanoseconds: now - 3_000_000)
                    span.setAttribute("messaging.system", "kafka")
                    span.setAttribute("messaging.operation.type", "process")
                    span.setAttribute("messaging.destination.name", "herald.recipients")
                    span.setAttribute("messaging.destination.partition.id", "3")
                    span.setAttribute("messaging.kafka.offset", Int64(made))
                    span.setAttribute("herald.wait_in_topic_ms", 3)
                    span.addEvent("processing", atNanoseconds: now)
                    span.setAttribute("herald.event_id", "bench-event-\(made)")
                    span.setAttribute("herald.app_id", "bench")
                    span.setAttribute("herald.outputs", 5)
                    if withRequest {
                        let request = export.startChildSpan("POST", of: span, kind: .client, startNanoseconds: now)
                        request.setAttribute("herald.provider", "apns")
                        request.setAttribute("http.request.method", "POST")
                        request.setAttribute("server.address", "127.0.0.1")
                        request.setAttribute("server.port", 443)
                        request.setAttribute("http.response.status_code", 200)
                        request.setAttribute("herald.reason", "")
                        request.setAttribute("herald.apns_id", "6D3F0E52-6C8B-4F6A-9D2E-3C1B2A4F5E6D")
                        request.setAttribute("herald.attempt", 1)
                        request.end(atNanoseconds: Self.nanoseconds())
                        made += 1
                        requests += 1
                    }
                    span.end(atNanoseconds: Self.nanoseconds())
                }
                if pauseMs > 0 { try await Task.sleep(for: .milliseconds(pauseMs)) }
            }
            return requests
        }

        let parent = TraceContext(
            traceIDHigh: 0x0af7_6519_16cd_43dd, traceIDLow: 0x8448_eb21_1c80_319c,
            spanID: 0xb7ad_6b71_6920_3331, flags: 1)
        // The same rounds and pauses without a span first: what the pacing itself costs, taken off below.
        let pacing = try await Self.measure { try await paced(record: nil) }
        var requests = 0
        let traced = try await Self.measure {
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await group.run() }
                requests = try await paced(record: export)
                await group.triggerGracefulShutdown()
                try await tasks.waitForAll()
            }
        }
        let cpu = traced.cpu - pacing.cpu
        let received = try Self.receivedSpans(port: port)
        let perSpan = cpu / Double(spans) * 1e6
        let perNotification = perSpan * ratio * spansPerEvent / notificationsPerEvent
        print(
            String(
                format:
                    "%d spans (%d of them POST children) in %.2f s: %.3f CPU-s (%.3f with the spans, %.3f without), %.2f µs of CPU per span",
                spans, requests, traced.seconds, cpu, traced.cpu, pacing.cpu, perSpan))
        print("received by herald-mock-otlp: \(received); dropped (counted): \(dropped.value)")
        print(
            String(
                format:
                    "at ratio %.3f (%.1f spans per traced event, %.1f notifications per event): %.3f µs per notification",
                ratio, spansPerEvent, notificationsPerEvent, perNotification))
        guard received + dropped.value == spans else {
            throw BenchError("\(spans) spans made, \(received) received and \(dropped.value) counted as dropped")
        }
    }

    /// The CPU time and the wall-clock time `body` took.
    static func measure(_ body: () async throws -> Void) async throws -> (cpu: Double, seconds: Double) {
        let cpu = cpuSeconds()
        let start = monotonicSeconds()
        try await body()
        return (cpuSeconds() - cpu, monotonicSeconds() - start)
    }

    /// This process's CPU time so far, every thread, user and system.
    static func cpuSeconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
            + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }

    static func nanoseconds() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    /// The spans herald-mock-otlp holds (`GET /v1/spans` with no filter answers them all as a JSON array).
    static func receivedSpans(port: Int) throws -> Int {
        guard
            let answer = HTTPProbe.request(
                ServiceEndpoint(host: "127.0.0.1", port: port), path: "/v1/spans", timeout: 30),
            answer.status == 200, let json = try? JSONSerialization.jsonObject(with: Data(answer.body.utf8)),
            let list = (json as? [String: Any])?["spans"] as? [Any] ?? json as? [Any]
        else { throw BenchError("herald-mock-otlp's /v1/spans did not answer a span list") }
        return list.count
    }
}

/// Spans the exporter reported dropped.
final class DropCount: @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    func add(_ n: Int) { lock.withLock { count += n } }
    var value: Int { lock.withLock { count } }
}
