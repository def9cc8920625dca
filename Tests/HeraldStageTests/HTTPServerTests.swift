import Foundation
import HeraldStage
import HeraldTestSupport
import Logging
import Prometheus
import ServiceLifecycle
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Stage HTTP endpoint: /metrics, /healthz, /readyz")
struct HTTPServerTests {
    @Test("a counter incremented through StageMetrics shows in /metrics; /healthz answers 200")
    func metricsAndHealth() async throws {
        let registry = PrometheusCollectorRegistry()
        let metrics = StageMetrics(stage: "resolve", factory: HeraldMetrics.makeFactory(registry: registry))
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: ReadinessChecks())
        #expect(server.port > 0)
        let serving = Task { try await server.run() }
        defer { serving.cancel() }

        metrics.consumed(topic: "herald.ingested", count: 3)
        metrics.suppressed(reason: "dnd")
        metrics.suppressed(reason: "dnd")
        metrics.apnsResponse(status: 410, reason: "Unregistered")
        metrics.deadLettered(reason: "invalid")
        metrics.recordLatency(.milliseconds(7))
        metrics.setConsumerLag(topic: "herald.ingested", partition: 2, lag: 42)
        metrics.inFlightIncrement(by: 5)
        metrics.inFlightDecrement(by: 2)

        let answer = try await RawHTTP.get(port: server.port, path: "/metrics")
        #expect(answer.status == 200)
        #expect(answer.headers["content-type"]?.hasPrefix("text/plain") == true)
        let body = answer.body
        #expect(body.contains(#"herald_consumed_total{stage="resolve",topic="herald.ingested"} 3"#), "\(body)")
        #expect(body.contains(#"herald_suppressed_total{stage="resolve",reason="dnd"} 2"#))
        #expect(body.contains(#"herald_apns_responses_total{stage="resolve",status="410",reason="Unregistered"} 1"#))
        #expect(body.contains(#"herald_dlq_total{stage="resolve",reason="invalid"} 1"#))
        #expect(body.contains(#"herald_stage_latency_seconds_count{stage="resolve"} 1"#))
        #expect(body.contains(#"herald_stage_latency_seconds_bucket{stage="resolve",le="0.01"} 1"#))
        #expect(body.contains(#"herald_stage_latency_seconds_bucket{stage="resolve",le="0.005"} 0"#))
        #expect(body.contains(#"herald_consumer_lag{stage="resolve",topic="herald.ingested",partition="2"} 42"#))
        #expect(body.contains(#"herald_in_flight{stage="resolve"} 3"#))

        // Counting is live: a second scrape sees a new increment.
        metrics.consumed(topic: "herald.ingested")
        #expect(
            try await RawHTTP.get(port: server.port, path: "/metrics").body
                .contains(#"herald_consumed_total{stage="resolve",topic="herald.ingested"} 4"#))

        let health = try await RawHTTP.get(port: server.port, path: "/healthz")
        #expect(health.status == 200)
        #expect(try JSONSerialization.jsonObject(with: Data(health.body.utf8)) as? [String: String] == ["status": "ok"])

        #expect(try await RawHTTP.get(port: server.port, path: "/nope").status == 404)
    }

    @Test("/readyz is 503 naming the failing checks until every check passes, then 200; 503 again on shutdown")
    func readinessFlips() async throws {
        let registry = PrometheusCollectorRegistry()
        let readiness = ReadinessChecks()
        let redisUp = LockedFlag()
        readiness.set("broker", ready: false)
        readiness.register("redis") { redisUp.value }
        readiness.register("apns", timeout: .milliseconds(100)) {
            try? await Task.sleep(for: .seconds(10))  // never answers in time: failing
            return true
        }
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: readiness,
            readinessLabels: [("stage", "send")])
        let serving = Task { try await server.run() }
        defer { serving.cancel() }

        var answer = try await RawHTTP.get(port: server.port, path: "/readyz")
        #expect(answer.status == 503)
        // /metrics carries the same verdict, for alerts: herald_ready and one herald_readiness_check per check.
        var metrics = try await RawHTTP.get(port: server.port, path: "/metrics").body
        #expect(metrics.contains(#"herald_ready{stage="send"} 0.0"#), "\(metrics)")
        #expect(metrics.contains(#"herald_readiness_check{stage="send",check="broker"} 0.0"#), "\(metrics)")
        var json = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
        #expect(json["status"] as? String == "not_ready")
        #expect(json["failing"] as? [String] == ["apns", "broker", "redis"])

        readiness.set("broker", ready: true)
        redisUp.value = true
        readiness.remove("apns")
        readiness.register("apns") { true }
        answer = try await RawHTTP.get(port: server.port, path: "/readyz")
        #expect(answer.status == 200, "\(answer.body)")
        json = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
        #expect(json["status"] as? String == "ready")
        #expect(json["checks"] as? [String: Bool] == ["apns": true, "broker": true, "redis": true])
        metrics = try await RawHTTP.get(port: server.port, path: "/metrics").body
        #expect(metrics.contains(#"herald_ready{stage="send"} 1.0"#), "\(metrics)")
        #expect(metrics.contains(#"herald_readiness_check{stage="send",check="broker"} 1.0"#), "\(metrics)")

        readiness.beginShutdown()
        answer = try await RawHTTP.get(port: server.port, path: "/readyz")
        #expect(answer.status == 503)
        json = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [String: Any])
        #expect(json["failing"] as? [String] == ["shutting_down"])
    }

    @Test("StageRuntime: graceful shutdown stops services in reverse order, flips readiness and returns 0")
    func gracefulShutdown() async throws {
        let registry = PrometheusCollectorRegistry()
        let readiness = ReadinessChecks()
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: readiness)
        let order = OrderLog()
        let producer = RecordingService(name: "producer", order: order)
        let consumer = RecordingService(name: "consumer", order: order)
        let deadlineHit = LockedFlag()
        // A deadline no starved test process reaches (the suites run beside end-to-end stacks on 2 cores): a
        // graceful stop that waited for it would be the bug this test looks for.
        let runtime = StageRuntime(
            http: server, services: [producer, consumer], readiness: readiness,
            shutdownDeadline: .seconds(120), logger: Logger(label: "test"),
            signals: [], onDeadline: { deadlineHit.value = true })
        let running = Task { await runtime.run() }
        // Serving while running.
        try await waitUntil("/healthz answers 200", timeout: .seconds(60)) {
            (try? await RawHTTP.get(port: server.port, path: "/healthz").status) == 200
        }

        await runtime.triggerGracefulShutdown()
        let status = await running.value
        #expect(status == 0)
        #expect(order.names == ["consumer", "producer"])
        #expect(readiness.isShuttingDown)
        #expect(!deadlineHit.value)
    }

    @Test("StageRuntime: a signal from gracefulShutdownSignals starts the graceful shutdown and run() returns 0")
    func signalStartsShutdown() async throws {
        let registry = PrometheusCollectorRegistry()
        let readiness = ReadinessChecks()
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: readiness)
        let order = OrderLog()
        let consumer = RecordingService(name: "consumer", order: order)
        // SIGUSR2 stands in for SIGTERM so the test cannot stop anything else in this process.
        let runtime = StageRuntime(
            http: server, services: [consumer], readiness: readiness,
            shutdownDeadline: .seconds(5), logger: Logger(label: "test"),
            signals: [.sigusr2], onDeadline: {})
        let running = Task { await runtime.run() }
        // The group installs its signal handlers before it starts services; once /healthz answers they are in place.
        let healthy = await eventually(timeout: .seconds(60)) {
            (try? await RawHTTP.get(port: server.port, path: "/healthz").status) == 200
        }
        #expect(healthy)
        // The group starts its services after its signal handlers are in place.
        try await waitUntil("the service is running", timeout: .seconds(60)) { consumer.started.value }
        kill(getpid(), SIGUSR2)
        let status = await running.value
        #expect(status == 0)
        #expect(order.names == ["consumer"])
        #expect(readiness.isShuttingDown)
    }

    @Test("an idle keep-alive connection does not hold up the HTTP server's shutdown")
    func idleConnectionDoesNotBlockShutdown() async throws {
        let registry = PrometheusCollectorRegistry()
        let readiness = ReadinessChecks()
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: readiness)
        let deadlineHit = LockedFlag()
        // An idle connection that held the server up would hold it until the deadline (120 s); a stop well before
        // it, however loaded the machine, shows it did not.
        let runtime = StageRuntime(
            http: server, services: [], readiness: readiness, shutdownDeadline: .seconds(120),
            logger: Logger(label: "test"), signals: [], onDeadline: { deadlineHit.value = true })
        let running = Task { await runtime.run() }
        #expect(try await RawHTTP.get(port: server.port, path: "/healthz").status == 200)
        let idle = try RawHTTP.openIdleConnection(port: server.port)
        defer { close(idle) }
        // Connections are accepted in order: once a later one is answered, the idle one is open on the server.
        #expect(try await RawHTTP.get(port: server.port, path: "/healthz").status == 200)
        let started = ContinuousClock.now
        await runtime.triggerGracefulShutdown()
        #expect(await running.value == 0)
        #expect(ContinuousClock.now - started < .seconds(60))
        #expect(!deadlineHit.value)
    }

    @Test("StageRuntime: a service that ignores shutdown hits the deadline action")
    func deadline() async throws {
        let registry = PrometheusCollectorRegistry()
        let readiness = ReadinessChecks()
        let server = try await StageHTTPServer.bind(
            host: "127.0.0.1", port: 0, registry: registry, readiness: readiness)
        let deadlineHit = LockedFlag()
        let stubborn = StubbornService()
        let runtime = StageRuntime(
            http: server, services: [stubborn], readiness: readiness,
            shutdownDeadline: .milliseconds(500), logger: Logger(label: "test"),
            signals: [],
            onDeadline: {
                deadlineHit.value = true; stubborn.release()
            })
        let running = Task { await runtime.run() }
        try await waitUntil("the stubborn service is running", timeout: .seconds(60)) { stubborn.started.value }
        let started = ContinuousClock.now
        await runtime.triggerGracefulShutdown()
        _ = await running.value
        #expect(deadlineHit.value)
        #expect(ContinuousClock.now - started >= .milliseconds(450))
    }
}

final class LockedFlag: @unchecked Sendable {
    // @unchecked Sendable: `stored` is only accessed under `lock`.
    private let lock = NSLock()
    private var stored = false
    var value: Bool {
        get { lock.lock(); defer { lock.unlock() }; return stored }
        set { lock.lock(); stored = newValue; lock.unlock() }
    }
}

final class OrderLog: @unchecked Sendable {
    // @unchecked Sendable: `stored` is only accessed under `lock`.
    private let lock = NSLock()
    private var stored: [String] = []
    func append(_ name: String) { lock.lock(); stored.append(name); lock.unlock() }
    var names: [String] { lock.lock(); defer { lock.unlock() }; return stored }
}

struct RecordingService: Service {
    let name: String
    let order: OrderLog
    let started = LockedFlag()
    func run() async throws {
        started.value = true
        try? await ServiceLifecycle.gracefulShutdown()
        order.append(name)
    }
}

/// Ignores graceful shutdown and cancellation until released (by the deadline action).
final class StubbornService: Service, @unchecked Sendable {
    // @unchecked Sendable: `released` is only accessed under `lock`.
    private let lock = NSLock()
    private var released = false
    func release() { lock.lock(); released = true; lock.unlock() }
    private var isReleased: Bool { lock.lock(); defer { lock.unlock() }; return released }
    let started = LockedFlag()
    func run() async throws {
        started.value = true
        while !isReleased {
            // A blocking wait that does not observe cancellation.
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                Thread {
                    Thread.sleep(forTimeInterval: 0.02); continuation.resume()
                }.start()
            }
        }
    }
}
