import CHiredis
import Foundation
import HeraldCore
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A Redis pub/sub subscriber: one connection and one thread of its own, subscribed to `channels`, calling
/// `onMessage` with the channel of every message (on its thread: keep the handler short).
///
/// While nothing is published the thread sleeps in poll(2) on the socket and costs nothing; after
/// `keepAliveInterval` of silence it sends a PING (allowed on a subscribed connection) and drops the connection
/// when no answer came by the next interval. A dropped connection is opened again (with the configuration's backoff)
/// and subscribed again; messages published meanwhile are lost, as pub/sub always loses them: callers must not
/// depend on every message (Herald's doorbell only shortens a wait that a periodic probe also ends).
///
/// A Redis Cluster configuration subscribes on one node at a time, its seeds in turn: Redis Cluster forwards every
/// PUBLISH to every node, so any node sees every message.
public final class RedisSubscriber: Sendable {
    public let channels: [String]
    private let configuration: RedisConfiguration
    private let logger: Logger
    private let onMessage: @Sendable (String) -> Void
    private let keepAliveInterval: Duration
    /// A pipe whose read end is in every poll(2): `stop()` writes to it.
    private let wakeRead: Int32
    private let wakeWrite: Int32
    private let state = Mutex(State())

    private struct State {
        var started = false
        var stopped = false
        var subscribed = false
        var exited = false
    }

    /// Nothing connects before `start()`.
    public init(
        configuration: RedisConfiguration, channels: [String], keepAliveInterval: Duration = .seconds(30),
        logger: Logger = Logger(label: "herald.redis.subscriber"),
        onMessage: @escaping @Sendable (_ channel: String) -> Void
    ) {
        self.configuration = configuration
        self.channels = channels
        self.keepAliveInterval = keepAliveInterval
        self.logger = logger
        self.onMessage = onMessage
        var fds: [Int32] = [-1, -1]
        if pipe(&fds) != 0 { fds = [-1, -1] }
        self.wakeRead = fds[0]
        self.wakeWrite = fds[1]
    }

    deinit {
        stop()
        // The thread holds a strong reference while it runs: by now it has exited.
        if wakeRead >= 0 { Glibc.close(wakeRead) }
        if wakeWrite >= 0 { Glibc.close(wakeWrite) }
    }

    /// True while the subscription is in place (for readiness checks and tests).
    public var isSubscribed: Bool { state.withLock { $0.subscribed } }

    /// Starts the thread (once).
    public func start() {
        let first = state.withLock { s -> Bool in
            defer { s.started = true }
            return !s.started && !s.stopped
        }
        guard first, !channels.isEmpty else { return }
        let thread = Thread { [self] in self.run() }
        thread.name = "herald-redis-subscriber"
        thread.start()
    }

    /// Ends the subscription and the thread (at once when it is waiting; after the current connect attempt when it
    /// is connecting). Idempotent.
    public func stop() {
        let first = state.withLock { s -> Bool in
            defer { s.stopped = true }
            return !s.stopped
        }
        if first, wakeWrite >= 0 {
            var byte: UInt8 = 1
            _ = write(wakeWrite, &byte, 1)
        }
    }

    private var isStopped: Bool { state.withLock { $0.stopped } }

    private func nodeConfigurations() -> [RedisConfiguration] {
        configuration.isCluster ? configuration.clusterSeeds.map { configuration.node($0) } : [configuration]
    }

    private func run() {
        let nodes = nodeConfigurations()
        var index = 0
        var failures = 0
        while !isStopped {
            let session = HiredisSession(configuration: nodes[index % nodes.count], logger: logger)
            do {
                try subscribe(session)
                failures = 0
                state.withLock { $0.subscribed = true }
                try listen(session)
            } catch {
                if !isStopped {
                    logger.warning("redis subscription lost; subscribing again", metadata: ["error": "\(error)"])
                }
            }
            state.withLock { $0.subscribed = false }
            session.disconnect()
            guard !isStopped else { break }
            failures += 1
            index += 1
            // After a failure on every node, wait before the next round (a stop ends the wait).
            if failures % nodes.count == 0 {
                let delay = configuration.resubscribeBackoff.delay(afterAttempt: failures / nodes.count, unit: 0)
                _ = waitReadable(fd: nil, timeout: delay)
            }
        }
        state.withLock { $0.exited = true }
    }

    private func subscribe(_ session: HiredisSession) throws {
        try session.ensureConnected()
        try session.sendWithoutReply(RedisCommand("SUBSCRIBE", channels.map { $0 as any RedisArgument }))
        for _ in channels {
            let reply = try session.readReply()
            guard let parts = reply.array, parts.first?.text?.lowercased() == "subscribe" else {
                throw RedisError(.protocolError, "SUBSCRIBE answered \(reply)")
            }
        }
    }

    /// Hands every message to `onMessage` until the connection drops or `stop()`.
    private func listen(_ session: HiredisSession) throws {
        var pingSent = false
        var fromSocket = false
        while !isStopped {
            let replies = try session.readAvailable(fromSocket: fromSocket)
            // A message is a channel name and a short payload (a doorbell's is empty): one growing past the bound is
            // not read to its end (hiredis would hold all of it); the connection is dropped and made again.
            if session.unparsedBytes > Self.maxMessageBytes {
                throw RedisError(
                    .protocolError, "a pub/sub message larger than \(Self.maxMessageBytes) bytes; reconnecting")
            }
            for reply in replies {
                guard let parts = reply.array, let kind = parts.first?.text?.lowercased() else { continue }
                switch kind {
                case "message" where parts.count >= 2:
                    if let channel = parts[1].text { onMessage(channel) }
                case "pong":
                    pingSent = false
                default:
                    break
                }
            }
            guard let fd = session.fileDescriptor else { throw RedisError(.connectionBroken, "no connection") }
            switch waitReadable(fd: fd, timeout: keepAliveInterval) {
            case .socket:
                fromSocket = true
            case .stopped:
                return
            case .timedOut:
                if pingSent { throw RedisError(.timeout, "no answer to PING within \(keepAliveInterval)") }
                try session.sendWithoutReply(RedisCommand("PING"))
                pingSent = true
                fromSocket = false
            }
        }
    }

    private enum Readiness { case socket, stopped, timedOut }

    /// The largest pub/sub message read whole (channel name and payload).
    public static let maxMessageBytes = 64 * 1024

    /// Waits until `fd` is readable, `stop()` was called, or `timeout` passed.
    private func waitReadable(fd: Int32?, timeout: Duration) -> Readiness {
        if isStopped { return .stopped }
        let woken = pollReadable(socket: fd, wake: wakeRead, until: .now + timeout)
        if woken.rung || isStopped { return .stopped }
        return woken.socket ? .socket : .timedOut
    }
}
