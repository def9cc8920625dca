import Foundation
import HeraldCore
import Logging
import ServiceLifecycle
import UnixSignals

/// Runs a stage's services in a `ServiceGroup` with Herald's shutdown rules:
///
/// - SIGTERM and SIGINT start a graceful shutdown (`gracefulShutdownSignals`). `/readyz` turns 503 at once.
/// - Services stop in reverse order of `services`: list the consumer last (it stops pulling first), the producer
///   before it (it flushes after the consumer handed back its work); the HTTP endpoint is always first, so
///   `/metrics` and `/healthz` answer until the end.
/// - Services get `deadline - grace` to finish gracefully (`grace` is 1 s, or a fifth of the deadline when that is
///   shorter); then the group cancels them. At `deadline` after the signal the process exits with status 0
///   whatever is still running: uncommitted input is redelivered to the group (at-least-once, and `send`'s
///   idempotency records stop double wake-ups).
/// - `run()` returns 0 after a clean stop, 1 when a service failed (logged).
public final class StageRuntime: Sendable {
    private let group: ServiceGroup
    private let logger: Logger

    /// - Parameters:
    ///   - http: the stage's HTTP endpoint (served first, stopped last).
    ///   - services: the stage's own services in dependency order (e.g. producer, then consumer loop).
    ///   - readiness: turned to `shutting_down` when shutdown begins.
    ///   - shutdownDeadline: `HERALD_SHUTDOWN_DEADLINE_MS`.
    ///   - signals: the signals that start a graceful shutdown.
    ///   - onDeadline: what happens when the deadline passes; exits the process with status 0 by default.
    public init(
        http: StageHTTPServer, services: [any Service], readiness: ReadinessChecks, shutdownDeadline: Duration,
        logger: Logger, signals: [UnixSignal] = [.sigterm, .sigint],
        onDeadline: @escaping @Sendable () -> Void = { StageProcess.exit(0) }
    ) {
        let grace = min(Duration.seconds(1), shutdownDeadline / 5)
        let watch = ShutdownWatch(
            readiness: readiness, deadline: shutdownDeadline, logger: logger, onDeadline: onDeadline)
        var configured = [ServiceGroupConfiguration.ServiceConfiguration(service: http)]
        configured += services.map { ServiceGroupConfiguration.ServiceConfiguration(service: $0) }
        configured.append(.init(service: watch))
        var configuration = ServiceGroupConfiguration(
            services: configured, gracefulShutdownSignals: signals,
            cancellationSignals: [], logger: logger)
        configuration.maximumGracefulShutdownDuration = shutdownDeadline - grace
        self.group = ServiceGroup(configuration: configuration)
        self.logger = logger
    }

    /// Runs until every service stopped. Returns the process exit status.
    public func run() async -> Int32 {
        do {
            try await group.run()
            logger.info("stopped")
            return 0
        } catch {
            logger.error("stopped with an error", metadata: [LogKey.error: "\(error)"])
            return 1
        }
    }

    /// Starts a graceful shutdown as SIGTERM would.
    public func triggerGracefulShutdown() async {
        await group.triggerGracefulShutdown()
    }
}

/// Last in the group, so the first to hear of a graceful shutdown: flips readiness and arms the deadline.
final class ShutdownWatch: Service, Sendable {
    private let readiness: ReadinessChecks
    private let deadline: Duration
    private let logger: Logger
    private let onDeadline: @Sendable () -> Void

    init(readiness: ReadinessChecks, deadline: Duration, logger: Logger, onDeadline: @escaping @Sendable () -> Void) {
        self.readiness = readiness
        self.deadline = deadline
        self.logger = logger
        self.onDeadline = onDeadline
    }

    func run() async throws {
        // Returns when graceful shutdown starts; throws when the group is cancelled instead (a service failed),
        // and then there is nothing to arm: run() returns at once with status 1.
        do {
            try await gracefulShutdown()
        } catch {
            return
        }
        readiness.beginShutdown()
        logger.info("shutdown started", metadata: ["deadline_ms": "\(deadline.milliseconds)"])
        let deadline = self.deadline
        let logger = self.logger
        let onDeadline = self.onDeadline
        // A plain thread, not a task: it must fire even if every cooperative thread is stuck.
        let thread = Thread {
            Thread.sleep(forTimeInterval: deadline.timeInterval)
            logger.error("shutdown deadline passed; exiting with unfinished work (it is redelivered)")
            onDeadline()
        }
        thread.name = "herald-shutdown-deadline"
        thread.start()
    }
}

/// How a stage's process ends.
public enum StageProcess {
    /// Ends the process with `status` without running the C libraries' exit handlers: flushes stdout and stderr,
    /// then `_exit`.
    ///
    /// By the time a stage calls this its services have stopped: offsets are committed, producers flushed, the
    /// APNs and FCM clients closed. What `exit` would still do is run the libraries' `atexit` handlers (OpenSSL's
    /// `OPENSSL_cleanup`, among others), which free their global state while threads those libraries serve may still
    /// be finishing (an HTTP/2 client's I/O thread ending, librdkafka's threads of a destroyed handle). In one of five
    /// clean-clone CI runs glibc aborted `herald-send` in `exit` ("double free or corruption") right after it logged
    /// `stopped`, so a clean stop looked like a crash. Nothing is lost by skipping the handlers; the kernel frees the
    /// memory.
    public static func exit(_ status: Int32) -> Never {
        fflush(nil)
        _exit(status)
    }
}
