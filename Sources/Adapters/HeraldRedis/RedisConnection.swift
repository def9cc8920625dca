import CHeraldRESP
import CHiredis
import COpenSSL
import DequeModule
import Foundation
import HeraldCore
import HeraldTLS
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// One Redis connection over hiredis, or, for a Redis Cluster configuration (`clusterSeeds`), a router over one
/// such connection per master (`RedisClusterRouter`). Callers use both the same way.
///
/// Every hiredis call (connect, write, read) runs on the connection's own thread, never on Swift's cooperative
/// pool; callers `await` and get the answer through a continuation.
///
/// Pipelining, within a call and across calls: `pipeline(_:)` puts the whole batch in the output buffer and
/// writes it at once, so a batch of any size costs one round trip (in a cluster: one per node, all nodes at once).
/// The calls of concurrent callers are pipelined too: each call's commands are written as soon as the thread
/// takes it, while earlier calls still wait for their replies, and the replies are handed back in order as they
/// arrive. A call waits only for the replies ahead of its own, never for another caller's whole round trip.
///
/// Broken connections: an I/O error, EOF, protocol error or timeout (no reply within the command timeout of the
/// last bytes read) drops the hiredis context and fails every call on the wire with a retryable `RedisError`
/// (`isRetryable == true`). The next call reconnects (at once the first time, then with exponential backoff while
/// reconnects keep failing). Callers retry the batch; the adapter never retries on its own, because it cannot know
/// which commands of a broken batch the server ran.
/// (Cluster redirections are different: a redirected command did not run, and the router sends it on itself.)
///
/// The process must ignore SIGPIPE (executables do it at start-up, docs/architecture.md): hiredis writes with
/// write(2), and only then does a write to a connection the server reset fail with EPIPE (a retryable
/// `connectionBroken`) instead of killing the process.
public final class RedisConnection: Sendable {
    private enum Backend: Sendable {
        case node(Worker)
        case cluster(RedisClusterRouter)
    }

    private let backend: Backend
    public let configuration: RedisConfiguration

    /// Creates the connection and its thread (a cluster: the router, whose node connections come as the slot map
    /// names them). Nothing is opened until the first call (or `connect()`).
    public init(configuration: RedisConfiguration, logger: Logger = Logger(label: "herald.redis")) {
        self.configuration = configuration
        if configuration.isCluster {
            self.backend = .cluster(RedisClusterRouter(configuration: configuration, logger: logger))
        } else {
            self.backend = .node(
                Worker(
                    session: HiredisSession(configuration: configuration, logger: logger),
                    commandTimeout: configuration.commandTimeout))
        }
    }

    deinit {
        close()
    }

    /// Opens the connection now (otherwise the first command does); a cluster learns its slot map and connects to
    /// every master. Throws `connectFailed` (retryable).
    public func connect() async throws {
        switch backend {
        case .node(let worker): _ = try await worker.submit(.connect)
        case .cluster(let router): try await router.connect()
        }
    }

    /// Sends one command (`redisCommandArgv`) and returns its reply. An error reply is returned as
    /// `.error`, not thrown; use `RedisValue.orThrow()` when an error reply should be an error.
    public func send(_ command: RedisCommand) async throws -> RedisValue {
        switch backend {
        case .node(let worker): try await worker.submit(.list([command])).values[0]
        case .cluster(let router): try await router.send(command)
        }
    }

    /// `send(RedisCommand(name, arguments...))`.
    public func send(_ name: String, _ arguments: any RedisArgument...) async throws -> RedisValue {
        try await send(RedisCommand(name, arguments))
    }

    /// Sends the whole batch in one round trip and returns one reply per command, in order.
    /// Error replies of single commands are `.error` values in the result.
    public func pipeline(_ commands: [RedisCommand]) async throws -> [RedisValue] {
        if commands.isEmpty { return [] }
        switch backend {
        case .node(let worker): return try await worker.submit(.list(commands)).values
        case .cluster(let router): return try await router.pipeline(commands)
        }
    }

    /// Sends a `RedisBatch` in one round trip (its buffer as it is) and returns one reply per command, in order.
    public func pipeline(_ batch: RedisBatch) async throws -> [RedisValue] {
        if batch.isEmpty { return [] }
        switch backend {
        case .node(let worker): return try await worker.submit(.batch(batch)).values
        case .cluster(let router): return try await router.pipeline(batch)
        }
    }

    /// Sends a `RedisBatch` in one round trip and returns its replies flat (`RedisReplies`), one per command, in
    /// order: for callers that read many small replies in place.
    public func pipelineFlat(_ batch: RedisBatch) async throws -> RedisReplies {
        if batch.isEmpty { return RedisReplies() }
        switch backend {
        case .node(let worker): return try await worker.submit(.batch(batch), replies: .flat).flat
        case .cluster(let router): return try await router.pipelineFlat(batch)
        }
    }

    /// Sends a `RedisBatch` of writes in one round trip; the replies are only checked: the first error reply is
    /// thrown (`server_error`, naming `what`), the others are read and dropped without being decoded.
    public func write(_ batch: RedisBatch, what: String) async throws {
        if batch.isEmpty { return }
        switch backend {
        case .node(let worker): _ = try await worker.submit(.batch(batch), replies: .checked(what: what))
        case .cluster(let router): try await router.write(batch, what: what)
        }
    }

    /// Fails every queued call with `RedisError.Code.closed`, closes the socket(s) and ends the thread(s).
    public func close() {
        switch backend {
        case .node(let worker): worker.stop()
        case .cluster(let router): router.close()
        }
    }

    /// True while a hiredis context is open (a cluster: the slot map is known and every master's connection is
    /// open). For readiness checks; it does not ping.
    public var isConnected: Bool {
        switch backend {
        case .node(let worker): worker.connectedFlag
        case .cluster(let router): router.isConnected
        }
    }

    /// A readiness probe: `PING` answered with `PONG` (a cluster: by every master).
    public func ping() async -> Bool {
        switch backend {
        case .node: (try? await send(RedisCommand("PING")))?.text == "PONG"
        case .cluster(let router): await router.ping()
        }
    }

    /// A connection to each node that holds keys, for a keyless command each node answers for its own keys
    /// (`SCAN`): this connection itself, or a cluster's connection to each master (the slot map learnt afresh).
    func masterConnections() async throws -> [RedisConnection] {
        switch backend {
        case .node: [self]
        case .cluster(let router): try await router.masterConnections()
        }
    }

    /// The cluster router, when this connection is one (tests, tools).
    var clusterRouter: RedisClusterRouter? {
        if case .cluster(let router) = backend { return router }
        return nil
    }
}

// MARK: - The thread that owns the hiredis context

/// One call: its commands, and the caller waiting for their replies. The worker writes the commands as soon as it
/// takes the call and then hands it its replies, in order, as they arrive.
private final class Call {
    enum Commands {
        /// No command: connect if not connected (`RedisConnection.connect()`); also what a call holds once its
        /// commands were written.
        case connect
        case list([RedisCommand])
        case batch(RedisBatch)
    }

    enum Replies {
        /// Every reply decoded, in order.
        case values
        /// Every reply copied flat, in order (`RedisReplies`).
        case flat
        /// Only checked: the first error reply fails the call (`server_error`, naming `what`), nothing is decoded.
        case checked(what: String)
    }

    /// The commands until they are written (`written()`): hiredis has copied them then.
    private(set) var commands: Commands
    private let replies: Replies
    /// Replies still owed.
    private(set) var remaining: Int
    private var answer = Answer()
    private var firstError: String?
    private let resume: (Result<Answer, RedisError>) -> Void

    /// What a call's caller gets: its replies decoded (`Replies.values`) or flat (`Replies.flat`).
    struct Answer {
        var values: [RedisValue] = []
        var flat = RedisReplies()
    }

    init(
        _ commands: Commands, replies: Replies, resume: @escaping (Result<Answer, RedisError>) -> Void
    ) {
        self.commands = commands
        self.replies = replies
        self.resume = resume
        switch commands {
        case .connect: remaining = 0
        case .list(let list): remaining = list.count
        case .batch(let batch): remaining = batch.count
        }
        switch replies {
        case .values: answer.values.reserveCapacity(remaining)
        case .flat: answer.flat = RedisReplies(replies: remaining, nodes: remaining * 6, bytes: remaining * 128)
        case .checked: break
        }
    }

    /// Lets go of the commands once hiredis holds them (a batch of the explain trail can be megabytes).
    func written() { commands = .connect }

    func take(_ reply: FlatReply) {
        switch replies {
        case .values:
            answer.values.append(reply.value())
        case .flat:
            answer.flat.append(reply)
        case .checked:
            if firstError == nil, reply.isError { firstError = reply.line }
        }
        remaining -= 1
    }

    /// Resumes the caller with what the replies said.
    func finish() {
        if case .checked(let what) = replies, let firstError {
            resume(.failure(RedisError(.serverError, "\(what): \(firstError)")))
        } else {
            resume(.success(answer))
        }
    }

    func fail(_ error: RedisError) { resume(.failure(error)) }
}

/// The connection's thread and the calls waiting for it.
///
/// The connection is pipelined across callers: a call's commands are written as soon as the thread takes it, even
/// while earlier calls still wait for their replies, and replies are handed out in order as they arrive (Redis
/// answers a connection's commands in the order it received them). So a call never waits behind another caller's
/// round trip, only behind the replies sent before its own. While calls are on the wire the thread sleeps in
/// poll(2) on the socket and on a pipe that `submit` writes to when it hands over a call; with none on the wire
/// it sleeps on the condition.
///
/// A call whose replies do not all arrive within the command timeout of the last bytes read fails with a retryable
/// `timeout`; a broken connection fails every call on the wire (retryable: the caller cannot know which of their
/// commands ran), and the next call reconnects. `stop()` fails the calls not yet written with `closed` and lets the
/// calls on the wire take their replies first.
///
/// `@unchecked Sendable`: `queued`, `stopped`, `polling` and `connected` are only read or written while holding
/// `condition`; the session (and with it the hiredis context) and the calls on the wire are touched only by the
/// thread.
private final class Worker: @unchecked Sendable {
    private let condition = NSCondition()
    private var queued: Deque<Call> = []
    private var stopped = false
    private var connected = false
    /// The thread is in poll(2), or about to be: a new call must write to `wakeWrite`.
    private var polling = false
    private let commandTimeout: Duration
    private let wakeRead: Int32
    private let wakeWrite: Int32

    init(session: HiredisSession, commandTimeout: Duration) {
        self.commandTimeout = commandTimeout
        var fds: [Int32] = [-1, -1]
        if pipe(&fds) == 0 {
            for fd in fds { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        } else {
            fds = [-1, -1]
        }
        wakeRead = fds[0]
        wakeWrite = fds[1]
        let thread = Thread { [self] in self.run(session) }
        thread.name = "herald-redis"
        thread.start()
    }

    deinit {
        // The thread holds a strong reference while it runs: by now it has exited.
        if wakeRead >= 0 { Glibc.close(wakeRead) }
        if wakeWrite >= 0 { Glibc.close(wakeWrite) }
    }

    var connectedFlag: Bool {
        condition.lock()
        defer { condition.unlock() }
        return connected
    }

    private func setConnected(_ value: Bool) {
        condition.lock()
        connected = value
        condition.unlock()
    }

    func submit(_ commands: Call.Commands, replies: Call.Replies = .values) async throws -> Call.Answer {
        let result: Result<Call.Answer, RedisError> = await withCheckedContinuation { continuation in
            let call = Call(commands, replies: replies) { continuation.resume(returning: $0) }
            condition.lock()
            if stopped {
                condition.unlock()
                call.fail(RedisError(.closed, "the Redis connection was closed"))
                return
            }
            queued.append(call)
            let ring = polling
            polling = false
            condition.signal()
            condition.unlock()
            if ring { self.ring() }
        }
        return try result.get()
    }

    func stop() {
        condition.lock()
        stopped = true
        condition.broadcast()
        condition.unlock()
        ring()
    }

    private func ring() {
        var byte: UInt8 = 1
        _ = Glibc.write(wakeWrite, &byte, 1)
    }

    /// Empties the wake pipe (a ring per call handed over while the thread polled; more than 64 leave it readable,
    /// and the next poll(2) returns at once to take the rest).
    private func drainWake() {
        var bytes = (UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0), UInt64(0))
        _ = withUnsafeMutableBytes(of: &bytes) { Glibc.read(wakeRead, $0.baseAddress, $0.count) }
    }

    private func run(_ session: HiredisSession) {
        var onWire: Deque<Call> = []
        var lastProgress = ContinuousClock.now

        /// Resumes a call's caller, publishing the connection state first, so `isConnected` read right after a
        /// call reflects that call.
        func complete(_ call: Call, _ failure: RedisError? = nil) {
            setConnected(session.isConnected)
            if let failure { call.fail(failure) } else { call.finish() }
        }
        func failOnWire(_ error: RedisError) {
            while let call = onWire.popFirst() { complete(call, error) }
        }

        while true {
            condition.lock()
            while queued.isEmpty && onWire.isEmpty && !stopped {
                condition.wait()
            }
            let isStopped = stopped
            var taken = queued
            queued.removeAll()
            // Nothing new to write: wait on the socket, and be rung for the next call.
            if taken.isEmpty && !isStopped { polling = true }
            condition.unlock()

            if isStopped {
                while let call = taken.popFirst() {
                    complete(call, RedisError(.closed, "the Redis connection was closed"))
                }
                if onWire.isEmpty { break }
            }

            if !taken.isEmpty {
                if onWire.isEmpty { lastProgress = .now }
                while let call = taken.popFirst() {
                    do {
                        try session.ensureConnected()
                        switch call.commands {
                        case .connect: break
                        case .list(let commands): try session.append(commands)
                        case .batch(let batch): try session.append(batch)
                        }
                    } catch {
                        // Not written. An append that fails has dropped the connection, and with it the replies of
                        // the calls written before this one.
                        complete(call, RedisConnection.redisError(error))
                        if !session.isConnected { failOnWire(RedisError(.connectionBroken, "connection lost")) }
                        continue
                    }
                    call.written()
                    if call.remaining == 0 { complete(call) } else { onWire.append(call) }
                }
                do { try session.flush() } catch { failOnWire(RedisConnection.redisError(error)) }
                continue
            }

            // Calls are on the wire and none is queued: wait for replies (or a new call, or stop).
            var socketReady = true
            if !session.hasBufferedTLSData {
                if let fd = session.fileDescriptor {
                    let woken = pollReadable(socket: fd, wake: wakeRead, until: lastProgress + commandTimeout)
                    socketReady = woken.socket
                    if woken.rung { drainWake() }
                } else {
                    socketReady = false
                }
            }
            condition.lock()
            polling = false
            condition.unlock()
            if socketReady {
                do {
                    try session.fill()
                    lastProgress = .now
                    while let call = onWire.first, let reply = try session.bufferedReply() {
                        call.take(reply)
                        if call.remaining == 0 {
                            onWire.removeFirst()
                            complete(call)
                        }
                    }
                    if onWire.isEmpty, try session.bufferedReply() != nil {
                        failOnWire(session.drop(RedisError(.protocolError, "a reply no command asked for")))
                    }
                } catch {
                    failOnWire(RedisConnection.redisError(error))
                }
            } else if session.fileDescriptor == nil {
                // Not reached: a dropped connection fails the calls on the wire at once. Kept so that it never spins.
                failOnWire(RedisError(.connectionBroken, "connection lost"))
            } else if ContinuousClock.now >= lastProgress + commandTimeout, !onWire.isEmpty {
                failOnWire(
                    session.drop(RedisError(.timeout, "no answer within \(commandTimeout)")))
            }
        }
        session.disconnect()
        setConnected(false)
    }
}

extension RedisConnection {
    /// A thrown error as a `RedisError` (hiredis calls throw only those).
    fileprivate static func redisError(_ error: any Error) -> RedisError {
        error as? RedisError ?? RedisError(.unexpectedReply, "\(error)")
    }
}

/// Waits until `socket` (when given) or `wake` is readable, or `deadline` passed; says which of the two were
/// readable (neither: the deadline, or a poll(2) error). For the threads that sleep on a Redis socket and a wake pipe
/// (`RedisConnection`'s, `RedisSubscriber`'s).
func pollReadable(socket: Int32?, wake: Int32, until deadline: ContinuousClock.Instant) -> (socket: Bool, rung: Bool) {
    var fds = [pollfd(fd: wake, events: Int16(POLLIN), revents: 0)]
    if let socket { fds.append(pollfd(fd: socket, events: Int16(POLLIN), revents: 0)) }
    while true {
        let left = deadline - .now
        if left <= .zero { return (false, false) }
        // Rounded up, so a wait never ends just before the deadline and spins.
        let milliseconds = Int32(clamping: (left.microseconds + 999) / 1000)
        let n = poll(&fds, nfds_t(fds.count), milliseconds)
        if n < 0 {
            if errno == EINTR { continue }
            return (false, false)
        }
        if n == 0 { return (false, false) }
        return (fds.count > 1 && fds[1].revents != 0, fds[0].revents != 0)
    }
}

// MARK: - The hiredis context

/// Owns one `redisContext` and the reconnect state.
///
/// `@unchecked Sendable`: it is handed to the worker thread once and used only there (inside jobs, one at a time),
/// so no two threads ever touch the context. (`RedisSubscriber` owns one the same way, on its own thread.)
final class HiredisSession: @unchecked Sendable {
    private let configuration: RedisConfiguration
    private let logger: Logger
    private var context: UnsafeMutablePointer<redisContext>?
    private var failedAttempts = 0
    private var notBefore: ContinuousClock.Instant?
    private var hasConnectedBefore = false
    /// The TLS client context (`rediss://`), loaded at the first connect and kept for reconnects.
    private var tlsClient: TLSClientContext?
    /// The context's TLS session (hiredis owns and frees it with the context), nil on a plaintext connection.
    private var tlsSession: OpaquePointer?
    /// Where the context's reader builds each reply (`FlatReply`), kept from reply to reply and across reconnects.
    private let replyBuffer: UnsafeMutablePointer<herald_resp_reply>
    /// The buffer holds a reply handed out and not yet forgotten: it is emptied before the next one is read.
    private var replyHandedOut = false

    init(configuration: RedisConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        guard let buffer = herald_resp_reply_create() else { fatalError("out of memory for a Redis reply buffer") }
        self.replyBuffer = buffer
    }

    deinit {
        disconnect()
        herald_resp_reply_free(replyBuffer)
    }

    var isConnected: Bool { context != nil }

    func disconnect() {
        if let context {
            redisFree(context)
            self.context = nil
        }
        tlsSession = nil
    }

    func ensureConnected() throws {
        if context != nil { return }
        if let notBefore {
            let now = ContinuousClock.now
            if now < notBefore {
                Thread.sleep(forTimeInterval: (notBefore - now).timeInterval)
            }
        }
        do {
            try openContext()
            if hasConnectedBefore {
                logger.info(
                    "redis reconnected",
                    metadata: ["redis.host": "\(configuration.host)", "redis.port": "\(configuration.port)"])
            }
            hasConnectedBefore = true
            failedAttempts = 0
            notBefore = nil
        } catch let error as RedisError {
            failedAttempts += 1
            let delay = configuration.reconnectBackoff.delay(afterAttempt: failedAttempts, unit: .random(in: 0..<1))
            notBefore = ContinuousClock.now + delay
            logger.warning(
                "redis connect failed",
                metadata: [
                    "redis.host": "\(configuration.host)", "redis.port": "\(configuration.port)",
                    "error": "\(error.message)", "retry_in_ms": "\(delay.milliseconds)",
                ])
            throw error
        } catch {
            throw RedisError(.connectFailed, "\(error)")
        }
    }

    private func openContext() throws {
        guard
            let newContext = redisConnectWithTimeout(
                configuration.host, Int32(configuration.port), Self.timeval(configuration.connectTimeout))
        else {
            throw RedisError(.connectFailed, "hiredis could not allocate a context")
        }
        if newContext.pointee.err != 0 {
            let message = Self.errorString(newContext)
            redisFree(newContext)
            throw RedisError(.connectFailed, "\(configuration.host):\(configuration.port): \(message)")
        }
        herald_resp_install(newContext, replyBuffer)
        replyHandedOut = false
        // The TLS handshake is bounded by the connect timeout, the commands after it by the command timeout.
        let handshakeTimeout = configuration.tls == nil ? configuration.commandTimeout : configuration.connectTimeout
        if redisSetTimeout(newContext, Self.timeval(handshakeTimeout)) != REDIS_OK {
            let message = Self.errorString(newContext)
            redisFree(newContext)
            throw RedisError(.connectFailed, "setting the command timeout failed: \(message)")
        }
        if let tls = configuration.tls {
            do {
                try startTLS(newContext, tls)
            } catch {
                redisFree(newContext)
                throw error
            }
            if redisSetTimeout(newContext, Self.timeval(configuration.commandTimeout)) != REDIS_OK {
                let message = Self.errorString(newContext)
                redisFree(newContext)
                throw RedisError(.connectFailed, "setting the command timeout failed: \(message)")
            }
        }
        context = newContext
        do {
            if let password = configuration.password {
                let reply = try command(
                    configuration.username.map { RedisCommand("AUTH", $0, password) }
                        ?? RedisCommand("AUTH", password))
                if case .error(let message) = reply {
                    throw RedisError(.connectFailed, "AUTH refused: \(message)")
                }
            }
            if configuration.database != 0 {
                let reply = try command(RedisCommand("SELECT", configuration.database))
                if case .error(let message) = reply {
                    throw RedisError(.connectFailed, "SELECT \(configuration.database) refused: \(message)")
                }
            }
        } catch let error as RedisError {
            disconnect()
            throw RedisError(.connectFailed, error.message)
        } catch {
            disconnect()
            throw RedisError(.connectFailed, "\(error)")
        }
    }

    /// The TLS handshake on a freshly connected context, verifying the server's certificate and name
    /// (`TLSClientContext.session(verifying:)`); hiredis owns the `SSL` once the handshake succeeded.
    private func startTLS(_ context: UnsafeMutablePointer<redisContext>, _ tls: RedisTLSConfiguration) throws {
        tlsSession = nil
        let client: TLSClientContext
        if let tlsClient {
            client = tlsClient
        } else {
            do {
                client = try TLSClientContext(
                    trustedCAFile: tls.caFile, certificateFile: tls.certificateFile, privateKeyFile: tls.keyFile)
            } catch {
                throw RedisError(.invalidConfiguration, "Redis TLS: \(error.message)")
            }
            tlsClient = client
        }
        let ssl: OpaquePointer
        do {
            ssl = try client.session(verifying: tls.serverName ?? configuration.host)
        } catch {
            throw RedisError(.invalidConfiguration, "Redis TLS: \(error.message)")
        }
        guard redisInitiateSSL(context, ssl) == REDIS_OK else {
            let verify = SSL_get_verify_result(ssl)
            let why =
                verify != X509_V_OK
                ? String(cString: X509_verify_cert_error_string(verify)) : Self.errorString(context)
            SSL_free(ssl)
            throw RedisError(
                .connectFailed, "TLS handshake with \(configuration.host):\(configuration.port) failed: \(why)")
        }
        tlsSession = ssl
    }

    /// One command through `redisCommandArgv`.
    func command(_ command: RedisCommand) throws -> RedisValue {
        try ensureConnected()
        guard let context else { throw RedisError(.connectFailed, "no connection") }
        guard Self.append(command, to: context) == REDIS_OK else { throw brokenConnection() }
        return try readReplies(1)[0]
    }

    /// Puts the commands in the output buffer (written by `flush()`). Connect first (`ensureConnected()`).
    func append(_ commands: [RedisCommand]) throws {
        guard let context else { throw RedisError(.connectFailed, "no connection") }
        for command in commands where Self.append(command, to: context) != REDIS_OK {
            throw brokenConnection()
        }
    }

    /// Puts a prepared batch in the output buffer, its whole buffer in one append (written by `flush()`).
    func append(_ batch: RedisBatch) throws {
        assert(batch.isComplete, "RedisBatch: the last command is missing arguments")
        guard let context else { throw RedisError(.connectFailed, "no connection") }
        let status = batch.bytes.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { chars in
                redisAppendFormattedCommand(context, chars.baseAddress, chars.count)
            }
        }
        if status != REDIS_OK { throw brokenConnection() }
    }

    /// Writes the whole output buffer (blocking, each write bounded by the command timeout).
    func flush() throws {
        guard let context else { return }
        var done: Int32 = 0
        while done == 0 {
            guard redisBufferWrite(context, &done) == REDIS_OK else { throw brokenConnection() }
        }
    }

    /// Reads what the socket holds into hiredis's buffer (call it when poll(2) says the socket is readable, or
    /// `hasBufferedTLSData`: it does not wait then). EOF or an error drops the connection and throws.
    func fill() throws {
        guard let context else { throw RedisError(.connectionBroken, "no connection") }
        if redisBufferRead(context) != REDIS_OK { throw brokenConnection() }
    }

    /// The next complete reply in hiredis's buffer, nil when none is complete yet. It is valid until the next
    /// reply is read.
    func bufferedReply() throws -> FlatReply? {
        guard let context else { throw RedisError(.connectionBroken, "no connection") }
        forgetHandedOutReply()
        var raw: UnsafeMutableRawPointer?
        guard redisGetReplyFromReader(context, &raw) == REDIS_OK else { throw brokenConnection() }
        return raw == nil ? nil : handOut()
    }

    /// Empties the reply buffer of the reply handed out last. Only then: a reply not complete yet has its first
    /// elements in the buffer already.
    private func forgetHandedOutReply() {
        if replyHandedOut {
            herald_resp_reset(replyBuffer)
            replyHandedOut = false
        }
    }

    private func handOut() -> FlatReply {
        replyHandedOut = true
        return FlatReply(replyBuffer)
    }

    /// True when the TLS session holds decrypted bytes not read yet: poll(2) on the socket does not see them.
    var hasBufferedTLSData: Bool { tlsSession.map { SSL_pending($0) > 0 } ?? false }

    /// Drops the connection for `error` (logged), which it returns.
    func drop(_ error: RedisError) -> RedisError {
        disconnect()
        logger.warning("redis connection dropped", metadata: ["error": "\(error.code.rawValue): \(error.message)"])
        return error
    }

    /// The connection's socket (to wait on with poll(2)); nil while not connected.
    var fileDescriptor: Int32? { context.map { $0.pointee.fd } }

    /// Bytes read from the socket that do not make a whole reply yet (hiredis's reader buffer).
    var unparsedBytes: Int {
        guard let reader = context?.pointee.reader else { return 0 }
        return max(0, reader.pointee.len - reader.pointee.pos)
    }

    /// Writes `command` out now without reading a reply (a subscribed connection: replies come when they come).
    func sendWithoutReply(_ command: RedisCommand) throws {
        try ensureConnected()
        guard let context else { throw RedisError(.connectFailed, "no connection") }
        guard Self.append(command, to: context) == REDIS_OK else { throw brokenConnection() }
        try flush()
    }

    /// Every complete reply hiredis holds, after reading what the socket holds when `fromSocket` (call it so only
    /// when poll(2) says the socket is readable: it does not wait then). EOF or an error drops the connection and
    /// throws. Without `fromSocket` it returns what an earlier read left in hiredis's buffer.
    func readAvailable(fromSocket: Bool) throws -> [RedisValue] {
        guard let context else { throw RedisError(.connectionBroken, "no connection") }
        if fromSocket, redisBufferRead(context) != REDIS_OK { throw brokenConnection() }
        var replies: [RedisValue] = []
        while let reply = try bufferedReply() { replies.append(reply.value()) }
        return replies
    }

    /// Reads one reply, waiting up to the command timeout.
    func readReply() throws -> RedisValue { try readReplies(1)[0] }

    /// Reads `count` replies and decodes them.
    private func readReplies(_ count: Int) throws -> [RedisValue] {
        var replies: [RedisValue] = []
        replies.reserveCapacity(count)
        for _ in 0..<count { replies.append(try nextReply().value()) }
        return replies
    }

    /// The next reply, read from the socket (blocking, bounded by the command timeout) when none is buffered.
    private func nextReply() throws -> FlatReply {
        guard let context else { throw RedisError(.connectionBroken, "no connection") }
        forgetHandedOutReply()
        var raw: UnsafeMutableRawPointer?
        guard redisGetReply(context, &raw) == REDIS_OK, raw != nil else { throw brokenConnection() }
        return handOut()
    }

    /// Classifies the context's error, drops the context (its state is unknown now) and returns the error.
    private func brokenConnection() -> RedisError {
        guard let context else { return RedisError(.connectionBroken, "no connection") }
        let code = context.pointee.err
        let savedErrno = errno
        let message = Self.errorString(context)
        let error: RedisError
        switch code {
        case REDIS_ERR_TIMEOUT,
            REDIS_ERR_IO where savedErrno == EAGAIN || savedErrno == EWOULDBLOCK:
            error = RedisError(.timeout, "no answer within \(configuration.commandTimeout): \(message)")
        case REDIS_ERR_PROTOCOL:
            error = RedisError(.protocolError, message)
        default:
            error = RedisError(.connectionBroken, message.isEmpty ? "connection lost" : message)
        }
        return drop(error)
    }

    // MARK: Helpers

    /// Appends a command already in RESP form to the context's output buffer (hiredis copies the bytes).
    private static func append(_ command: RedisCommand, to context: UnsafeMutablePointer<redisContext>) -> Int32 {
        command.encoded.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { chars in
                redisAppendFormattedCommand(context, chars.baseAddress, chars.count)
            }
        }
    }

    private static func errorString(_ context: UnsafeMutablePointer<redisContext>) -> String {
        withUnsafeBytes(of: &context.pointee.errstr) { raw in
            let bytes = raw.prefix { $0 != 0 }
            return String(decoding: bytes, as: UTF8.self)
        }
    }

    private static func timeval(_ duration: Duration) -> timeval {
        let micros = duration.microseconds
        return Glibc.timeval(tv_sec: Int(micros / 1_000_000), tv_usec: Int(micros % 1_000_000))
    }
}
