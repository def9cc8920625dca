// herald-mock-apns: a local APNs stand-in (HTTP/2 over TLS) for tests, demos and benchmarks.
// Reads options, builds the server, serves until SIGTERM/SIGINT, flushes and exits 0.
import ArgumentParser
import Glibc
import HeraldMockAPNs

struct MockAPNsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-mock-apns",
        abstract: "A local APNs stand-in: HTTP/2 over TLS that checks what APNs checks and answers what APNs answers.")

    @Option(help: "Address to listen on.") var host = "127.0.0.1"
    @Option(help: "TCP port (0 picks a free one).") var port = 0
    @Option(name: .customLong("port-file"), help: "Write the bound port to this file once ready.") var portFile: String?
    @Option(help: "PEM server certificate.") var cert: String
    @Option(help: "PEM private key of the server certificate.") var key: String
    @Option(
        name: .customLong("auth-key"),
        help: "KEYID:TEAMID:PUBKEY.pem (repeatable). JWTs are verified against these; none: token auth is not checked.")
    var authKeys: [String] = []
    @Option(name: .customLong("client-ca"), help: "CA for client certificates (enables certificate auth).")
    var clientCA: String?
    @Option(
        name: .customLong("topic"),
        help: "Accepted bundle id (repeatable; BUNDLE.voip follows for voip). None: any topic passes.")
    var topics: [String] = []
    @Option(
        name: .customLong("dead-token"),
        help: "TOKEN[:MILLIS] answered 410 Unregistered (repeatable; timestamp defaults to now).")
    var deadTokens: [String] = []
    @Option(
        name: .customLong("environment"),
        help: "The APNs environment played: production (default) or sandbox.")
    var environment: String = "production"
    @Option(
        name: .customLong("registered-token"),
        help:
            "TOKEN:BUNDLE:production|sandbox, what a token was issued for (repeatable): another environment is BadDeviceToken, another topic DeviceTokenNotForTopic."
    )
    var registeredTokens: [String] = []
    @Option(help: "Seed of fault injection and generated apns-ids.") var seed: UInt64 = 1
    @Option(name: .customLong("rate-429"), help: "Rate of 429 TooManyRequests.") var rate429 = 0.0
    @Option(name: .customLong("rate-500"), help: "Rate of 500 InternalServerError.") var rate500 = 0.0
    @Option(name: .customLong("rate-503"), help: "Rate of 503 ServiceUnavailable.") var rate503 = 0.0
    @Option(name: .customLong("rate-410"), help: "Rate of 410 Unregistered.") var rate410 = 0.0
    @Option(name: .customLong("rate-bad-token"), help: "Rate of 400 BadDeviceToken.") var rateBadToken = 0.0
    @Option(name: .customLong("latency-ms"), help: "Answer each request this many milliseconds late.") var latencyMs = 0
    @Option(name: .customLong("goaway-every"), help: "GOAWAY (NO_ERROR) after N streams on a connection.")
    var goawayEvery = 0
    @Option(name: .customLong("reset-every"), help: "Drop the TCP connection (RST) when its Nth stream arrives.")
    var resetEvery = 0
    @Option(
        name: .customLong("rate-reset"),
        help: "Rate at which a new stream drops its TCP connection (RST) instead of being served.")
    var rateReset = 0.0
    @Option(
        name: .customLong("pause-ms"),
        help:
            "Hold every answer back for this many milliseconds after start-up (later: POST /pause?ms=N and POST /resume on the metrics port)."
    )
    var pauseMs = 0
    @Option(
        name: .customLong("reject-token-every"),
        help:
            "Fault injection: on token-auth connections, answer every Nth otherwise valid request 403 InvalidProviderToken (0 = off)."
    )
    var rejectTokenEvery = 0
    @Option(
        name: .customLong("max-streams"),
        help:
            "SETTINGS_MAX_CONCURRENT_STREAMS of a token-auth connection after a success (of a certificate one from the start)."
    ) var maxStreams = 1000
    @Option(
        name: .customLong("initial-streams"),
        help:
            "SETTINGS_MAX_CONCURRENT_STREAMS a token-auth connection starts with and is lowered back to after a provider-token rejection."
    ) var initialStreams = 1
    @Option(
        name: .customLong("min-token-update-interval"),
        help:
            "Seconds: a key's newer JWT within this of its current one gets 429 TooManyProviderTokenUpdates (APNs: 1200; 0 = off)."
    )
    var minTokenUpdateInterval: Int64 = 0
    @Option(name: .customLong("record"), help: "JSON-lines file, one line per answered request.") var record: String?
    @Option(name: .customLong("metrics-port"), help: "Serve GET /metrics (HTTP/1.1, cleartext) on this port.")
    var metricsPort: Int?

    func validate() throws {
        for (name, rate) in [
            ("--rate-429", rate429), ("--rate-500", rate500), ("--rate-503", rate503),
            ("--rate-410", rate410), ("--rate-bad-token", rateBadToken),
        ] {
            guard rate >= 0, rate <= 1 else { throw ValidationError("\(name) must be in [0, 1]") }
        }
        guard rate429 + rate500 + rate503 + rate410 + rateBadToken <= 1.000001 else {
            throw ValidationError("the fault rates add up to more than 1")
        }
        guard rateReset >= 0, rateReset <= 1 else { throw ValidationError("--rate-reset must be in [0, 1]") }
        guard pauseMs >= 0 else { throw ValidationError("--pause-ms must not be negative") }
        guard (0...65535).contains(port) else { throw ValidationError("--port must be 0...65535") }
        guard latencyMs >= 0, goawayEvery >= 0, resetEvery >= 0, rejectTokenEvery >= 0 else {
            throw ValidationError(
                "--latency-ms, --goaway-every, --reset-every and --reject-token-every must not be negative")
        }
        guard maxStreams >= 1, initialStreams >= 1 else {
            throw ValidationError("--max-streams and --initial-streams must be at least 1")
        }
        for k in authKeys where MockProviderKey(argument: k) == nil {
            throw ValidationError("--auth-key must be KEYID:TEAMID:PUBKEY.pem, got \(k)")
        }
        for t in deadTokens where Self.parseDeadToken(t) == nil {
            throw ValidationError("--dead-token must be TOKEN or TOKEN:MILLIS")
        }
    }

    static func parseDeadToken(_ s: String) -> (String, Int64?)? {
        let parts = s.split(separator: ":", omittingEmptySubsequences: false)
        if parts.count == 1, !parts[0].isEmpty { return (String(parts[0]), nil) }
        if parts.count == 2, !parts[0].isEmpty, let ms = Int64(parts[1]), ms >= 0 { return (String(parts[0]), ms) }
        return nil
    }

    func run() throws {
        var config = MockAPNsConfiguration(certificatePath: cert, privateKeyPath: key)
        config.host = host
        config.port = port
        config.clientCAPath = clientCA
        config.providerKeys = authKeys.compactMap(MockProviderKey.init(argument:))
        config.topics = topics
        for t in deadTokens { if let (token, ms) = Self.parseDeadToken(t) { config.deadTokens[token] = ms } }
        guard let env = MockEnvironment(rawValue: environment) else {
            throw ValidationError("--environment: expected production or sandbox, got \(environment)")
        }
        config.environment = env
        for t in registeredTokens {
            guard let (token, registration) = MockTokenRegistration.parse(t) else {
                throw ValidationError("--registered-token: expected TOKEN:BUNDLE:production|sandbox, got \(t)")
            }
            config.registeredTokens[token] = registration
        }
        config.seed = seed
        config.faults.tooManyRequests = rate429
        config.faults.internalServerError = rate500
        config.faults.serviceUnavailable = rate503
        config.faults.unregistered = rate410
        config.faults.badDeviceToken = rateBadToken
        config.latencyMilliseconds = latencyMs
        config.goawayEvery = goawayEvery
        config.resetEvery = resetEvery
        config.resetRate = rateReset
        config.initialPauseMilliseconds = pauseMs
        config.rejectTokenEvery = rejectTokenEvery
        config.maxConcurrentStreams = maxStreams
        config.initialConcurrentStreams = initialStreams
        config.recordPath = record
        config.minimumTokenUpdateIntervalSeconds = minTokenUpdateInterval
        config.metricsPort = metricsPort

        // Signals are taken by a thread of their own (sigwait), never by async handlers.
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        // Process-wide, once: a write to a connection the client reset fails with EPIPE instead of killing the
        // stand-in with SIGPIPE.
        signal(SIGPIPE, SIG_IGN)

        let server: MockAPNsServer
        do {
            server = try MockAPNsServer(configuration: config)
        } catch {
            throw ValidationError("\(error)")
        }
        try SignalWatcher.start(set: set, server: server)

        if let portFile {
            let tmp = portFile + ".tmp"
            guard let f = fopen(tmp, "w") else { throw ValidationError("cannot write --port-file \(portFile)") }
            fputs("\(server.port)\n", f)
            fclose(f)
            rename(tmp, portFile)
        }
        var line = "listening on \(host):\(server.port)"
        if let mp = server.metricsPort { line += " (metrics on \(host):\(mp))" }
        print(line)
        fflush(nil)
        server.run()
        fflush(nil)
    }
}

/// Waits for SIGTERM/SIGINT on a POSIX thread and stops the server.
enum SignalWatcher {
    final class Context {
        let set: sigset_t
        let server: MockAPNsServer
        init(set: sigset_t, server: MockAPNsServer) { self.set = set; self.server = server }
    }

    static func start(set: sigset_t, server: MockAPNsServer) throws {
        let ctx = Unmanaged.passRetained(Context(set: set, server: server)).toOpaque()
        var t = pthread_t()
        let rc = pthread_create(
            &t, nil,
            { raw in
                guard let raw else { return nil }
                let ctx = Unmanaged<Context>.fromOpaque(raw).takeRetainedValue()
                var set = ctx.set
                var sig: Int32 = 0
                while sigwait(&set, &sig) != 0 {}
                ctx.server.stop()
                return nil
            }, ctx)
        if rc != 0 {
            Unmanaged<Context>.fromOpaque(ctx).release()
            throw ValidationError("cannot start the signal thread")
        }
        pthread_detach(t)
    }
}

MockAPNsCommand.main()
