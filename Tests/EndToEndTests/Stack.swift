// The whole Herald stack on loopback for the end-to-end suite: redis-server, herald-dev-broker, herald-mock-apns and the
// six stage executables as separate processes, started once per suite and stopped at the end (even on failure).
import Foundation
import HeraldConfig
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldTestSupport
import Logging
import Testing

/// Starts the stack around a whole suite; tests reach it through `E2EStack.current`.
struct E2EStackTrait: SuiteTrait, TestScoping {
    /// Tracing on at ratio 1, exporting to herald-mock-otlp (`E2EStack.otlpPort`).
    var tracing = false
    var isRecursive: Bool { false }

    func provideScope(
        for test: Test, testCase: Test.Case?,
        performing function: @Sendable () async throws -> Void
    ) async throws {
        let stack = E2EStack(tracing: tracing)
        do {
            try await stack.start()
        } catch {
            await stack.stop()
            throw error
        }
        do {
            try await E2EStack.$current.withValue(stack) { try await function() }
        } catch {
            await stack.stop()
            throw error
        }
        // docs/behaviour.md §11: on SIGTERM every stage finishes, commits and exits 0 within its deadline.
        for stage in await stack.stop() {
            Issue.record("\(stage) did not exit 0 within 8 s of SIGTERM")
        }
    }
}

extension Trait where Self == E2EStackTrait {
    /// The shared end-to-end stack.
    static var e2eStack: Self { E2EStackTrait() }
    /// The end-to-end stack with tracing on at ratio 1 and an OTLP receiver (herald-mock-otlp).
    static var e2eTracingStack: Self { E2EStackTrait(tracing: true) }
}

/// One line of the stand-in's record file.
struct RecordedRequest: Sendable {
    var token: String
    var topic: String
    var pushType: String
    var priority: Int
    var apnsID: String
    var collapseID: String?
    var payload: Data?
    var status: Int
    var reason: String?
    /// When the stand-in answered, epoch milliseconds.
    var at: Int64

    init?(line: Substring) {
        guard let data = line.data(using: .utf8),
            let o = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
            let token = o["token"] as? String, let status = o["status"] as? Int
        else { return nil }
        self.token = token
        topic = o["topic"] as? String ?? ""
        pushType = o["push_type"] as? String ?? ""
        priority = (o["priority"] as? Int) ?? Int(o["priority"] as? String ?? "") ?? 0
        apnsID = (o["apns_id"] as? String ?? "").lowercased()
        collapseID = o["collapse_id"] as? String
        if let p = o["payload"], !(p is NSNull) {
            payload = try? JSONSerialization.data(withJSONObject: p, options: [.sortedKeys])
        }
        self.status = status
        reason = o["reason"] as? String
        at = (o["at"] as? NSNumber)?.int64Value ?? 0
    }
}

/// The stack. `@unchecked Sendable`: the suite is `.serialized`, so one test at a time calls into it; the
/// mutable bookkeeping (`mockGeneration`) is only touched from those calls.
final class E2EStack: @unchecked Sendable {
    @TaskLocal static var current: E2EStack?

    /// The stack of the running suite, or a failure naming the missing trait.
    static func shared() throws -> E2EStack {
        guard let current else { throw HarnessError("no end-to-end stack: the suite needs the .e2eStack trait") }
        return current
    }

    static let stages = ["ingest", "resolve", "suppress", "render", "send", "registry"]
    static let topics: [String] = [
        "chat.events", "herald.ingested", "herald.resolved", "herald.deliverable", "herald.outbound",
        "herald.retry", "herald.dlq", "herald.token-feedback", "herald.registry", "herald.ingested.priority",
        "herald.resolved.priority", "herald.deliverable.priority", "herald.outbound.priority", "herald.retry.priority",
    ]
    static let keyID = "E2EKEY0001"
    static let keyID2 = "E2EKEY0002"
    static let teamID = "E2ETEAM001"
    /// A token the stand-in always answers 410 Unregistered.
    static let deadToken = String(repeating: "de", count: 32)
    // FCM and webhook providers (herald-mock-fcm).
    static let fcmProject = "herald-e2e"
    static let fcmClientEmail = "herald-e2e@herald-e2e.iam.gserviceaccount.com"
    /// An FCM registration token the stand-in answers 404 UNREGISTERED.
    static let fcmDeadToken = "dead-fcm:APA91b" + String(repeating: "Dd_", count: 40)
    /// The registry API's bearer token (herald-registry serves the API on `apiPort`).
    static let apiToken = "e2e-backend-token-0123456789abcdef"
    static let webhookUser = "herald"
    static let webhookPassword = "e2e-hook-secret"
    /// The API key herald-mock-fcm's /translate requires; app9's translator has it, app10's another one (403).
    static let translatorKey = "e2e-translator-key"

    let packageRoot: String
    let binDir: String
    let runDir: String
    let redisPort: Int
    let apnsPort: Int
    let fcmPort: Int
    /// A Web Push service without HTTP/2 (a second herald-mock-fcm, `--no-http2`, that its test starts).
    let webpushHTTP1Port: Int
    let apiPort: Int
    /// herald-mock-otlp's port when the stack traces (`tracing`), else 0.
    let otlpPort: Int
    let tracing: Bool
    let logger: Logger

    private(set) var redis: ChildProcess!
    /// herald-dev-broker: librdkafka's mock cluster, three brokers (docs/kafka.md, "The local and test broker").
    private(set) var broker: DevBroker!
    private(set) var mock: ChildProcess!
    private(set) var mockFCM: ChildProcess!
    private(set) var mockOTLP: ChildProcess?
    private(set) var stageProcesses: [String: ChildProcess] = [:]
    private(set) var mockGeneration = 0
    private(set) var store: StateStore!
    private var redisConnection: RedisConnection!
    private(set) var apps = AppDirectory()
    let startedAt = ContinuousClock.now

    var brokers: String { broker.bootstrap }
    var redisURL: String { "redis://127.0.0.1:\(redisPort)" }
    var pipelinePath: String { runDir + "/pipeline.yaml" }

    init(tracing: Bool = false) {
        self.tracing = tracing
        otlpPort = tracing ? ((try? freePort()) ?? 24318) : 0
        packageRoot = Paths.packageRoot
        binDir = Paths.binDirectory
        runDir = NSTemporaryDirectory() + "herald-e2e-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        redisPort = (try? freePort()) ?? 26379
        apnsPort = (try? freePort()) ?? 28443
        fcmPort = (try? freePort()) ?? 28444
        webpushHTTP1Port = (try? freePort()) ?? 28446
        apiPort = (try? freePort()) ?? 28445
        var l = Logger(label: "e2e")
        l.logLevel = .critical
        logger = l
    }

    // MARK: Start and stop

    func start() async throws {
        TestProcess.prepare()
        try FileManager.default.createDirectory(atPath: runDir + "/redis", withIntermediateDirectories: true)
        log("run dir \(runDir); redis \(redisPort), apns \(apnsPort)")
        for tool in ["heraldctl", "herald-mock-apns", "herald-mock-fcm", "herald-dev-broker"]
            + (tracing ? ["herald-mock-otlp"] : []) + Self.stages.map({ "herald-\($0)" })
        {
            guard FileManager.default.isExecutableFile(atPath: binDir + "/" + tool) else {
                throw HarnessError("missing \(binDir)/\(tool): run `swift build` first (or set HERALD_BIN_DIR)")
            }
        }
        broker = try await DevBroker.start(
            topics: Self.topics.map { ($0, 4) },
            extraArguments: Self.stages.flatMap { ["--group", "herald-\($0)", "--group", "herald-\($0)-priority"] })
        log("kafka \(broker.bootstrap)")
        try await offPool { [self] in try self.makeCredentials() }  // openssl runs off the cooperative pool
        try writePipeline()
        apps = try PipelineLoader.load(path: pipelinePath).config.apps

        // Redis, with an append-only file so a restart keeps the state.
        redis = ChildProcess(
            name: "redis", executable: try Paths.tool("redis-server"),
            arguments: [
                "--port", "\(redisPort)", "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
                "--appendfsync", "always", "--dir", runDir + "/redis", "--daemonize", "no",
            ], logPath: runDir + "/redis.log")
        try redis.start()

        guard await eventually(timeout: .seconds(60), { portAcceptsConnections(redisPort) }) else {
            throw HarnessError("redis did not start: \(redis.logTail())")
        }
        redisConnection = RedisConnection(configuration: try RedisConfiguration(url: redisURL), logger: logger)
        try await redisConnection.connect()
        store = StateStore(connection: redisConnection, logger: logger)

        try await startMock()
        try await startMockFCM()
        if tracing { try await startMockOTLP() }
        for stage in Self.stages { try startStage(stage) }
        // Every stage answers /readyz (broker, Redis and APNs reachable).
        for stage in Self.stages {
            let port = stagePorts[stage] ?? 0
            let ready = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
                guard stageProcesses[stage]?.isRunning == true else { return true }
                return httpStatus(port: port, path: "/readyz") == 200
            }
            guard ready, stageProcesses[stage]?.isRunning == true else {
                throw HarnessError("herald-\(stage) did not become ready: \(stageProcesses[stage]?.logTail() ?? "")")
            }
        }
        log("stack up after \(ContinuousClock.now - startedAt)")
    }

    /// Stops everything; returns the stages that did not exit 0 on SIGTERM within the grace period.
    @discardableResult
    func stop() async -> [String] {
        // Stages stop in parallel (each leaves its group and flushes on SIGTERM), then the servers.
        let begin = ContinuousClock.now
        let statuses = Guarded<[String: Int32?]>([:])
        await withTaskGroup(of: Void.self) { group in
            for (stage, p) in stageProcesses {
                group.addTask {
                    let status = await p.stop(grace: .seconds(8))
                    statuses.withLock { $0[stage] = status }
                }
            }
        }
        let stagesDone = ContinuousClock.now
        redisConnection?.close()
        var servers: [String] = []
        for p in [mock, mockFCM, mockOTLP, broker?.process, redis].compactMap({ $0 }) {
            let t0 = ContinuousClock.now
            let status = await p.stop(grace: .seconds(3))
            servers.append("\(p.name) \(ContinuousClock.now - t0) exit \(status.map { "\($0)" } ?? "killed")")
        }
        log("servers: \(servers.joined(separator: ", "))")
        let exits = statuses.withLock { $0 }.sorted { $0.key < $1.key }.map {
            "\($0.key)=\($0.value.map { "\($0)" } ?? "killed")"
        }
        log(
            "stages stopped in \(stagesDone - begin) (exit: \(exits.joined(separator: " "))), servers in \(ContinuousClock.now - stagesDone); logs in \(runDir)"
        )
        return statuses.withLock { $0 }.filter { $0.value != 0 }.map { "herald-\($0.key)" }.sorted()
    }

    // MARK: Stages

    /// Each stage's /metrics port.
    private(set) var stagePorts: [String: Int] = [:]

    func stageEnvironment(_ stage: String) throws -> [String: String] {
        let port = try stagePorts[stage] ?? freePort()
        stagePorts[stage] = port
        var env = [
            "HERALD_PIPELINE": pipelinePath,
            "HERALD_KAFKA_SESSION_TIMEOUT_MS": "4000",
            "HERALD_BATCH_TIMEOUT_MS": "20",
            "HERALD_KAFKA_BROKERS": brokers,
            "HERALD_REDIS_URL": redisURL,
            "HERALD_METRICS_HOST": "127.0.0.1",
            "HERALD_METRICS_PORT": "\(port)",
            "HERALD_SHUTDOWN_DEADLINE_MS": "8000",
            "HERALD_LOG_LEVEL": "info",
            "HERALD_INSTANCE": "e2e-\(stage)",
        ]
        if tracing {
            // Every event is traced; spans go to herald-mock-otlp (the pipeline file's `tracing:` exports often).
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:\(otlpPort)"
            env["OTEL_TRACES_SAMPLER_ARG"] = "1"
        }
        if stage == "render" {
            // render reloads the pipeline file on SIGHUP only (the reload test sends it); send watches the file.
            env["HERALD_PIPELINE_WATCH_MS"] = "0"
        }
        if stage == "suppress" {
            env["HERALD_TRANSLATOR_CA_FILE"] = runDir + "/server-cert.pem"
            env["HERALD_E2E_TRANSLATOR_KEY"] = Self.translatorKey
            env["HERALD_E2E_TRANSLATOR_WRONG_KEY"] = "not-" + Self.translatorKey
        }
        if stage == "registry" {
            env["HERALD_API_PORT"] = "\(apiPort)"
            env["HERALD_API_TOKENS"] = "e2e=\(Self.apiToken)"
        }
        if stage == "send" {
            env["HERALD_APNS_HOST"] = "127.0.0.1:\(apnsPort)"
            env["HERALD_APNS_CA_FILE"] = runDir + "/server-cert.pem"
            env["HERALD_APNS_TIMEOUT_MS"] = "5000"
            // Short retry delays keep the fault tests fast.
            env["HERALD_SEND_RETRY_INITIAL_MS"] = "200"
            env["HERALD_SEND_RETRY_MAX_MS"] = "1000"
            env["HERALD_SEND_MAX_ATTEMPTS"] = "10"
            env["HERALD_FCM_HOST"] = "127.0.0.1:\(fcmPort)"
            env["HERALD_FCM_CA_FILE"] = runDir + "/server-cert.pem"
            env["HERALD_WEBHOOK_CA_FILE"] = runDir + "/server-cert.pem"
            env["HERALD_WEBPUSH_CA_FILE"] = runDir + "/server-cert.pem"
            env["HERALD_E2E_WEBHOOK_PASSWORD"] = Self.webhookPassword
        }
        return env
    }

    func startStage(_ stage: String) throws {
        let p = ChildProcess(
            name: "herald-\(stage)", executable: binDir + "/herald-\(stage)", arguments: [],
            environment: try stageEnvironment(stage), logPath: runDir + "/\(stage).log")
        try p.start()
        stageProcesses[stage] = p
    }

    /// Starts one more process of `stage` (same consumer group) under the name `stage-<n>`; it is stopped with
    /// the rest at the end, or earlier with `stopStage`.
    func startExtraStage(_ stage: String, instance: Int, environment overrides: [String: String] = [:]) throws -> String
    {
        let name = "\(stage)-\(instance)"
        var env = try stageEnvironment(name)
        if stage == "send" { env.merge(try stageEnvironment("send")) { _, send in send } }
        env.merge(overrides) { _, override in override }
        env["HERALD_METRICS_PORT"] = "\(stagePorts[name] ?? 0)"
        env["HERALD_INSTANCE"] = "e2e-\(name)"
        let p = ChildProcess(
            name: "herald-\(name)", executable: binDir + "/herald-\(stage)", arguments: [],
            environment: env, logPath: runDir + "/\(name).log")
        try p.start()
        stageProcesses[name] = p
        return name
    }

    /// SIGTERM a stage process and return its exit status (nil when it had to be killed after `grace`).
    func stopStage(_ name: String, grace: Duration = .seconds(10)) async -> Int32? {
        await stageProcesses[name]?.stop(grace: grace)
    }

    /// SIGKILL a stage (no shutdown, no commit).
    func killStage(_ stage: String) async {
        await stageProcesses[stage]?.kill9()
    }

    /// Waits until `stage`'s process answers /readyz (false when it exited or did not within `timeout`).
    func awaitReady(_ stage: String, timeout: Duration = .seconds(120)) async -> Bool {
        let port = stagePorts[stage] ?? 0
        return await eventually(timeout: timeout, interval: .milliseconds(200)) {
            stageProcesses[stage]?.isRunning == true && httpStatus(port: port, path: "/readyz") == 200
        }
    }

    func restartStage(_ stage: String) throws {
        guard let p = stageProcesses[stage] else { throw HarnessError("no stage \(stage)") }
        try p.start()
    }

    /// Stops Redis (SIGTERM: the append-only file is flushed), waits `down`, starts it again on the same port.
    func restartRedis(down: Duration) async throws {
        await redis.stop(grace: .seconds(5))
        try await Task.sleep(for: down)
        try redis.start()
        guard await eventually(timeout: .seconds(60), { portAcceptsConnections(redisPort) }) else {
            throw HarnessError("redis did not restart: \(redis.logTail())")
        }
    }

    // MARK: Idle

    /// Whether every running stage is idle now, by its own /metrics: nothing in flight (`herald_in_flight` 0) and
    /// its consumer group's lag 0 on every partition (`herald_consumer_lag`). False when a stage does not
    /// answer.
    func pipelineIdleNow() -> Bool { idleBlockers().isEmpty }

    /// What keeps the pipeline from being idle now: the stages that do not answer, and every non-zero
    /// `herald_in_flight` and `herald_consumer_lag` line (empty when idle; for failure messages too).
    func idleBlockers() -> [String] {
        var blockers: [String] = []
        for (name, process) in stageProcesses.sorted(by: { $0.key < $1.key }) where process.isRunning {
            guard let port = stagePorts[name], let text = httpBody(port: port, path: "/metrics"),
                text.contains("herald_in_flight{")
            else {
                blockers.append("\(name): no metrics")
                continue
            }
            for line in text.split(separator: "\n")
            where line.hasPrefix("herald_in_flight{") || line.hasPrefix("herald_consumer_lag{") {
                guard let value = line.split(separator: " ").last.flatMap({ Double($0) }), value == 0 else {
                    blockers.append(String(line))
                    continue
                }
            }
        }
        return blockers
    }

    /// What the stages say about their explain writes (for failure messages): every
    /// `herald_explain_dropped_total` line and every log line about the trail.
    func explainDiagnostics() -> String {
        var out: [String] = []
        for (name, process) in stageProcesses.sorted(by: { $0.key < $1.key }) {
            if let port = stagePorts[name], let text = httpBody(port: port, path: "/metrics") {
                out += text.split(separator: "\n").filter { $0.hasPrefix("herald_explain_dropped_total") }
                    .map { "\(name): \($0)" }
            }
            let log = (try? String(contentsOfFile: process.logPath, encoding: .utf8)) ?? ""
            out += log.split(separator: "\n").filter { $0.contains("explain") }.suffix(5).map { "\(name): \($0)" }
        }
        return out.isEmpty ? "(no explain drops or trail messages)" : out.joined(separator: "\n")
    }

    /// Waits until the pipeline is idle and stays idle for `quiet`, or `timeout` passes; returns whether it did.
    /// The consumers refresh their lag every 5 s and the stages export it every second, so `quiet` is longer than
    /// both together: a lag reading taken before the
    /// last records arrived cannot pass as idle.
    @discardableResult
    func awaitIdle(quiet: Duration = .seconds(7), timeout: Duration = .seconds(90)) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        var idleSince: ContinuousClock.Instant?
        while ContinuousClock.now < deadline {
            if pipelineIdleNow() {
                let since = idleSince ?? ContinuousClock.now
                idleSince = since
                if ContinuousClock.now - since >= quiet { return true }
            } else {
                idleSince = nil
            }
            try? await Task.sleep(for: .milliseconds(250))
        }
        return false
    }

    // MARK: The APNs stand-in

    var recordPaths: [String] { (0...mockGeneration).map { runDir + "/apns-\($0).jsonl" } }

    /// (Re)starts herald-mock-apns on the same port with `extra` options (faults); a new record file each time.
    func startMock(extra: [String] = []) async throws {
        if let mock {
            await mock.stop(grace: .seconds(3))
            mockGeneration += 1
        }
        let portFile = runDir + "/apns.port"
        try? FileManager.default.removeItem(atPath: portFile)
        var arguments = [
            "--port", "\(apnsPort)", "--port-file", portFile,
            "--cert", runDir + "/server-cert.pem", "--key", runDir + "/server-key.pem",
            "--auth-key", "\(Self.keyID):\(Self.teamID):\(runDir)/auth-pub.pem",
            // A second key the reload test rotates to (a third one, auth3.p8, is known to no one).
            "--auth-key", "\(Self.keyID2):\(Self.teamID):\(runDir)/auth2-pub.pem",
            "--topic", "com.example.chat", "--topic", "com.example.messenger", "--topic", "com.example.calls",
            "--dead-token", Self.deadToken,
            "--record", runDir + "/apns-\(mockGeneration).jsonl",
            "--max-streams", "100",
        ]
        arguments += extra
        let p = ChildProcess(
            name: "herald-mock-apns", executable: binDir + "/herald-mock-apns", arguments: arguments,
            logPath: runDir + "/mock-apns.log")
        try p.start()
        mock = p
        guard await eventually(timeout: .seconds(60), { FileManager.default.fileExists(atPath: portFile) }) else {
            throw HarnessError("herald-mock-apns did not start: \(p.logTail())")
        }
    }

    /// Starts herald-mock-otlp, the OTLP/HTTP receiver the traced stack's stages export to.
    func startMockOTLP() async throws {
        let p = ChildProcess(
            name: "herald-mock-otlp", executable: binDir + "/herald-mock-otlp",
            arguments: ["--host", "127.0.0.1", "--port", "\(otlpPort)"], logPath: runDir + "/mock-otlp.log")
        try p.start()
        mockOTLP = p
        guard await eventually(timeout: .seconds(60), { httpStatus(port: otlpPort, path: "/healthz") == 200 }) else {
            throw HarnessError("herald-mock-otlp did not start: \(p.logTail())")
        }
    }

    /// Starts herald-mock-fcm (FCM token endpoint + messages:send, webhook receivers, LibreTranslate's /translate
    /// with an API key): the receiver `flaky` answers 503 to its first two requests.
    func startMockFCM() async throws {
        let portFile = runDir + "/fcm.port"
        let p = ChildProcess(
            name: "herald-mock-fcm", executable: binDir + "/herald-mock-fcm",
            arguments: [
                "--port", "\(fcmPort)", "--port-file", portFile,
                "--cert", runDir + "/server-cert.pem", "--key", runDir + "/server-key.pem",
                "--project", Self.fcmProject, "--client-email", Self.fcmClientEmail,
                "--service-public-key", runDir + "/fcm-sa.key", "--unregistered", Self.fcmDeadToken,
                "--webhook-user", Self.webhookUser, "--webhook-password", Self.webhookPassword,
                "--webhook-fault", "flaky=503*2", "--record", runDir + "/fcm.jsonl",
                "--webpush-keys", runDir + "/webpush",
                "--translate-api-key", Self.translatorKey,
            ], logPath: runDir + "/mock-fcm.log")
        try p.start()
        mockFCM = p
        guard await eventually(timeout: .seconds(60), { FileManager.default.fileExists(atPath: portFile) }) else {
            throw HarnessError("herald-mock-fcm did not start: \(p.logTail())")
        }
    }

    /// Every answer herald-mock-fcm gave so far (endpoint token / send / webhook, status, reason, target, body).
    func recordedProviders() -> [[String: Any]] {
        guard let text = try? String(contentsOfFile: runDir + "/fcm.jsonl", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// Every request the stand-in answered so far (all generations, or one).
    func recorded(generation: Int? = nil) -> [RecordedRequest] {
        var out: [RecordedRequest] = []
        let paths = generation.map { [runDir + "/apns-\($0).jsonl"] } ?? recordPaths
        for path in paths {
            guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { continue }
            // A line being written may be incomplete: only lines ending in a newline count.
            let complete =
                text.hasSuffix("\n") ? Substring(text) : text[..<(text.lastIndex(of: "\n") ?? text.startIndex)]
            for line in complete.split(separator: "\n") {
                if let r = RecordedRequest(line: line) { out.append(r) }
            }
        }
        return out
    }

    /// Answers with status 200, counted per (token, apns-id).
    func deliveredCounts() -> [String: Int] {
        var counts: [String: Int] = [:]
        for r in recorded() where r.status == 200 { counts[r.token + "/" + r.apnsID, default: 0] += 1 }
        return counts
    }

    // MARK: Kafka helpers

    var producerConfiguration: KafkaProducerConfiguration {
        var c = KafkaProducerConfiguration(brokers: [brokers], clientID: "e2e")
        c.linger = .milliseconds(1)
        return c
    }

    func produce(_ records: [ProducerRecord]) async throws {
        let producer = try KafkaProducer(configuration: producerConfiguration, logger: logger)
        try await producer.sendAll(records)
        try await producer.shutdown(timeout: .seconds(5))
    }

    /// Publishes events to chat.events keyed by conversation id.
    func publish(_ events: [String]) async throws {
        var records: [ProducerRecord] = []
        for e in events {
            let bytes = Array(e.utf8)
            let key = (try? ChatEvent.decode(bytes))?.conversation.id
            records.append(ProducerRecord(topic: "chat.events", key: key, value: bytes))
        }
        try await produce(records)
    }

    func readTopic(_ topic: String) async throws -> [ConsumerRecord] {
        try await KafkaTopicReader.readAll(
            topic: topic, configuration: KafkaClientConfiguration(brokers: [brokers], clientID: "e2e"),
            logger: logger)
    }

    func dlqEntries() async throws -> [(record: ConsumerRecord, dlq: DLQRecord)] {
        try await readTopic("herald.dlq").compactMap { r in
            guard let v = r.value, let d = try? StageCodec.decode(DLQRecord.self, from: v) else { return nil }
            return (r, d)
        }
    }

    // MARK: The registry API

    /// One request to the registry API with the stack's token.
    func api(_ method: String, _ path: String, body: String? = nil) async throws -> TestHTTP.Answer {
        try await TestHTTP.request(
            port: apiPort, method: method, path: path,
            headers: ["Authorization": "Bearer \(Self.apiToken)"], body: body)
    }

    // MARK: heraldctl

    struct ToolResult {
        var status: Int32
        var stdout: String
        var stderr: String
        var lines: [[String: Any]] {
            stdout.split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
            }
        }
    }

    /// Runs heraldctl with the stack's brokers and Redis in its environment.
    func heraldctl(_ arguments: [String]) async throws -> ToolResult {
        let p = try SpawnedProcess(
            binDir + "/heraldctl", arguments,
            environment: ["HERALD_KAFKA_BROKERS": brokers, "HERALD_REDIS_URL": redisURL], stdout: .pipe,
            stderr: .pipe)
        // Read both pipes off the cooperative pool.
        let (o, e) = try await offPool { p.readToEnd() }
        return ToolResult(
            status: p.waitForExit(), stdout: String(decoding: o, as: UTF8.self),
            stderr: String(decoding: e, as: UTF8.self))
    }

    // MARK: Files

    func write(_ name: String, _ text: String) throws -> String {
        let path = runDir + "/" + name
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    private func makeCredentials() throws {
        let openssl = try Paths.tool("openssl")
        try runToolChecked(
            openssl,
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "server-key.pem", "-out", "server-cert.pem", "-days", "2", "-subj", "/CN=localhost",
                "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            ], cwd: runDir)
        try runToolChecked(
            openssl, ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "auth.p8"],
            cwd: runDir)
        try runToolChecked(openssl, ["pkey", "-in", "auth.p8", "-pubout", "-out", "auth-pub.pem"], cwd: runDir)
        for n in [2, 3] {
            try runToolChecked(
                openssl, ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "auth\(n).p8"],
                cwd: runDir)
            try runToolChecked(
                openssl, ["pkey", "-in", "auth\(n).p8", "-pubout", "-out", "auth\(n)-pub.pem"], cwd: runDir)
        }
        // The FCM service account: an RSA key and its JSON file, whose token endpoint is herald-mock-fcm.
        try runToolChecked(
            openssl, ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "fcm-sa.key"],
            cwd: runDir)
        let account: [String: Any] = [
            "type": "service_account", "project_id": Self.fcmProject, "private_key_id": "e2e-key",
            "private_key": try String(contentsOfFile: runDir + "/fcm-sa.key", encoding: .utf8),
            "client_email": Self.fcmClientEmail, "token_uri": "https://127.0.0.1:\(fcmPort)/token",
        ]
        try JSONSerialization.data(withJSONObject: account).write(to: URL(fileURLWithPath: runDir + "/fcm-sa.json"))
        // Web Push: app4's VAPID key, and the directory the stand-in reads subscriptions' keys from.
        try runToolChecked(
            openssl, ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "vapid.pem"],
            cwd: runDir)
        try FileManager.default.createDirectory(atPath: runDir + "/webpush", withIntermediateDirectories: true)
    }

    private func writePipeline() throws {
        let key = runDir + "/auth.p8"
        let yaml = """
            defaults:
              payload:
                profile: compact
            apps:
              app1:
                payload: {profile: compact}
                multi_device: all_offline
                badge: true
                templates:
                  default:     {text: "{sender_name}: {message}", file: "{filename}"}
                  alternative: {text: "New message arrived", file: "New file arrived"}
                  custom_types:
                    support: {text: "[{channel_name}] {sender_name}: {message}", file: "[{channel_name}] {file_type_friendly}: {filename}"}
                credentials:
                  - {bundle_id: com.example.chat, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app5:
                payload: {profile: sendbird, key: sendbird}
                sendbird: {mentioned_users: true}
                counts: true
                credentials:
                  - {bundle_id: com.example.chat, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app6:
                payload: {profile: compact}
                templates:
                  default: {text: "REL-V1 {message}", file: "{filename}"}
                credentials:
                  - {bundle_id: com.example.chat, team_id: \(Self.teamID), environment: production, key_id: \(Self.keyID), key_file: \(key)}
              app7:
                payload: {profile: compact}
                coalesce: {window_seconds: 10, update_seconds: 4}
                credentials:
                  - {bundle_id: com.example.chat, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app8:
                payload: {profile: compact}
                flood_guard: {per_minute: 3}
                credentials:
                  - {bundle_id: com.example.chat, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app9:
                payload: {profile: compact}
                translator: {url: "https://127.0.0.1:\(fcmPort)", api_key_env: HERALD_E2E_TRANSLATOR_KEY, deadline_ms: 2000}
                credentials:
                  - {bundle_id: com.example.chat, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app10:
                payload: {profile: compact}
                translator: {url: "https://127.0.0.1:\(fcmPort)", api_key_env: HERALD_E2E_TRANSLATOR_WRONG_KEY}
                credentials:
                  - {bundle_id: com.example.chat, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app11:
                payload: {profile: compact}
                counts: true
                digest: {conversations_named: 3, sound: false, deadline_seconds: 3600}
                credentials:
                  - {bundle_id: com.example.chat, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app2:
                payload: {profile: sendbird, key: sendbird}
                multi_device: any_offline
                credentials:
                  - {bundle_id: com.example.messenger, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app3:
                payload: {profile: cometchat}
                credentials:
                  - {bundle_id: com.example.calls, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
              app4:
                payload: {profile: cometchat}
                multi_device: any_offline
                credentials:
                  - {bundle_id: com.example.calls, environment: production, team_id: \(Self.teamID), key_id: \(Self.keyID), key_file: \(key)}
                fcm_credentials:
                  - {provider_id: fcm-provider-1, service_account_file: \(runDir)/fcm-sa.json, include_notification: true}
                webhooks:
                  - {provider_id: custom-1, url: "https://127.0.0.1:\(fcmPort)/webhook/custom-1", username: \(Self.webhookUser), password_env: HERALD_E2E_WEBHOOK_PASSWORD, region: eu}
                  - {provider_id: flaky, url: "https://127.0.0.1:\(fcmPort)/webhook/flaky", username: \(Self.webhookUser), password_env: HERALD_E2E_WEBHOOK_PASSWORD}
                webpush:
                  vapid_key_file: \(runDir)/vapid.pem
                  subject: "mailto:e2e@example.com"
                  allowed_origins: ["https://127.0.0.1:\(fcmPort)", "https://127.0.0.1:\(webpushHTTP1Port)"]
            kafka:
              brokers: \(brokers)
              client_id: herald-e2e
              session_timeout_ms: 4000
              profile: local
            redis:
              host: 127.0.0.1
              port: \(redisPort)
            explain:
              full_trail: {apps: [app3]}
            stages:
              ingest:   {group_id: e2e-ingest,   batch_size: 200, batch_timeout_ms: 20}
              resolve:  {group_id: e2e-resolve,  batch_size: 200, batch_timeout_ms: 20}
              suppress: {group_id: e2e-suppress, batch_size: 200, batch_timeout_ms: 20}
              render:   {group_id: e2e-render,   batch_size: 200, batch_timeout_ms: 20}
              send:     {group_id: e2e-send,     batch_size: 200, batch_timeout_ms: 20}
              registry: {group_id: e2e-registry, batch_size: 200, batch_timeout_ms: 20}
            tracing:
              export_interval_ms: 200

            """
        _ = try write("pipeline.yaml", yaml)
    }

    func log(_ line: String) {
        FileHandle.standardError.write(Data("[e2e] \(line)\n".utf8))
    }
}
