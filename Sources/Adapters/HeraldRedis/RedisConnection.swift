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
/// Every hiredis call (connect, write, read: all blocking) runs on the connection's own thread, never on Swift's
/// cooperative pool; callers `await` and get the answer through a continuation. Calls are served one at a time
/// in the order they were made.
///
/// Pipelining: `pipeline(_:)` appends the whole batch with `redisAppendCommandArgv` and then reads the replies
/// with `redisGetReply`; hiredis writes the full batch before reading the first reply, so a batch of any size
/// costs one round trip (in a cluster: one per node, all nodes at once).
///
/// Broken connections: an I/O error, EOF, protocol error or timeout drops the hiredis context and fails the
/// current call with a retryable `RedisError` (`isRetryable == true`). The next call reconnects (at once the
/// first time, then with exponential backoff while reconnects keep failing). Callers retry the batch; the
/// adapter never retries on its own, because it cannot know which commands of a broken batch the server ran.
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
            self.backend = .node(Worker(session: HiredisSession(configuration: configuration, logger: logger)))
        }
    }

    deinit {
        close()
    }

    /// Opens the connection now (otherwise the first command does); a cluster learns its slot map and connects to
    /// every master. Throws `connectFailed` (retryable).
    public func connect() async throws {
        switch backend {
        case .node(let worker): try await worker.submit { session in try session.ensureConnected() }
        case .cluster(let router): try await router.connect()
        }
    }

    /// Sends one command (`redisCommandArgv`) and returns its reply. An error reply is returned as
    /// `.error`, not thrown; use `RedisValue.orThrow()` when an error reply should be an error.
    public func send(_ command: RedisCommand) async throws -> RedisValue {
        switch backend {
        case .node(let worker): try await worker.submit { session in try session.command(command) }
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
        case .node(let worker): return try await worker.submit { session in try session.pipeline(commands) }
        case .cluster(let router): return try await router.pipeline(commands)
        }
    }

    /// Sends a `RedisBatch` in one round trip (its buffer as it is) and returns one reply per command, in order.
    public func pipeline(_ batch: RedisBatch) async throws -> [RedisValue] {
        if batch.isEmpty { return [] }
        switch backend {
        case .node(let worker): return try await worker.submit { session in try session.pipeline(batch) }
        case .cluster(let router): return try await router.pipeline(batch)
        }
    }

    /// Sends a `RedisBatch` of writes in one round trip; the replies are only checked: the first error reply is
    /// thrown (`server_error`, naming `what`), the others are read and dropped without being decoded.
    public func write(_ batch: RedisBatch, what: String) async throws {
        if batch.isEmpty { return }
        switch backend {
        case .node(let worker): try await worker.submit { session in try session.write(batch, what: what) }
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

/// A serial job queue served by one dedicated thread.
///
/// `@unchecked Sendable`: `jobs`, `stopped` and `connected` are only read or written while holding `condition`;
/// `session` (and with it the hiredis context) is touched only by the worker thread, inside jobs.
private final class Worker: @unchecked Sendable {
    typealias Job = (HiredisSession?) -> Void

    private let condition = NSCondition()
    private var jobs: Deque<Job> = []
    private var stopped = false
    private var connected = false
    private var thread: Thread?

    init(session: HiredisSession) {
        let thread = Thread { [self] in self.run(session) }
        thread.name = "herald-redis"
        self.thread = thread
        thread.start()
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

    func submit<T: Sendable>(_ body: @escaping @Sendable (HiredisSession) throws -> T) async throws -> T {
        let result: Result<T, RedisError> = await withCheckedContinuation { continuation in
            let job: Job = { session in
                guard let session else {
                    continuation.resume(returning: .failure(RedisError(.closed, "the Redis connection was closed")))
                    return
                }
                let result: Result<T, RedisError>
                do {
                    result = .success(try body(session))
                } catch let error as RedisError {
                    result = .failure(error)
                } catch {
                    result = .failure(RedisError(.unexpectedReply, "\(error)"))
                }
                // Publish the connection state before the caller resumes, so `isConnected` read right after
                // a call reflects that call.
                self.setConnected(session.isConnected)
                continuation.resume(returning: result)
            }
            condition.lock()
            if stopped {
                condition.unlock()
                job(nil)
                return
            }
            jobs.append(job)
            condition.signal()
            condition.unlock()
        }
        return try result.get()
    }

    func stop() {
        condition.lock()
        stopped = true
        condition.broadcast()
        condition.unlock()
    }

    private func run(_ session: HiredisSession) {
        while true {
            condition.lock()
            while jobs.isEmpty && !stopped {
                condition.wait()
            }
            guard let job = jobs.popFirst() else {
                condition.unlock()
                break
            }
            let isStopped = stopped
            condition.unlock()

            job(isStopped ? nil : session)
        }
        session.disconnect()
        condition.lock()
        connected = false
        condition.unlock()
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

    init(configuration: RedisConfiguration, logger: Logger) {
        self.configuration = configuration
        self.logger = logger
    }

    deinit {
        disconnect()
    }

    var isConnected: Bool { context != nil }

    func disconnect() {
        if let context {
            redisFree(context)
            self.context = nil
        }
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
            let delay = backoff(afterFailures: failedAttempts)
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

    private func backoff(afterFailures failures: Int) -> Duration {
        let exponent = min(failures - 1, 20)
        let base = configuration.initialBackoff * (1 << exponent)
        let capped = min(base, configuration.maximumBackoff)
        // Full jitter on the upper half, so a fleet of workers does not reconnect in lockstep.
        let jitter = Double.random(in: 0.5...1.0)
        return capped * jitter
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
    }

    /// One command through `redisCommandArgv`.
    func command(_ command: RedisCommand) throws -> RedisValue {
        try ensureConnected()
        guard let context else { throw RedisError(.connectFailed, "no connection") }
        guard Self.append(command, to: context) == REDIS_OK else { throw brokenConnection() }
        return try readReplies(1)[0]
    }

    /// The whole batch: append every command, then read one reply per command.
    func pipeline(_ commands: [RedisCommand]) throws -> [RedisValue] {
        try ensureConnected()
        guard let context else { throw RedisError(.connectFailed, "no connection") }
        for command in commands where Self.append(command, to: context) != REDIS_OK {
            throw brokenConnection()
        }
        return try readReplies(commands.count)
    }

    /// A prepared batch: its whole buffer in one append, then one reply per command.
    func pipeline(_ batch: RedisBatch) throws -> [RedisValue] {
        try appendBatch(batch)
        return try readReplies(batch.count)
    }

    /// The connection's socket (to wait on with poll(2)); nil while not connected.
    var fileDescriptor: Int32? { context.map { $0.pointee.fd } }

    /// Writes `command` out now without reading a reply (a subscribed connection: replies come when they come).
    func sendWithoutReply(_ command: RedisCommand) throws {
        try ensureConnected()
        guard let context else { throw RedisError(.connectFailed, "no connection") }
        guard Self.append(command, to: context) == REDIS_OK else { throw brokenConnection() }
        var done: Int32 = 0
        while done == 0 {
            guard redisBufferWrite(context, &done) == REDIS_OK else { throw brokenConnection() }
        }
    }

    /// Every complete reply hiredis holds, after reading what the socket holds when `fromSocket` (call it so only
    /// when poll(2) says the socket is readable: it does not wait then). EOF or an error drops the connection and
    /// throws. Without `fromSocket` it returns what an earlier read left in hiredis's buffer.
    func readAvailable(fromSocket: Bool) throws -> [RedisValue] {
        guard let context else { throw RedisError(.connectionBroken, "no connection") }
        if fromSocket, redisBufferRead(context) != REDIS_OK { throw brokenConnection() }
        var replies: [RedisValue] = []
        while true {
            var raw: UnsafeMutableRawPointer?
            guard redisGetReplyFromReader(context, &raw) == REDIS_OK else { throw brokenConnection() }
            guard let raw else { return replies }
            replies.append(Self.decode(raw.assumingMemoryBound(to: redisReply.self)))
            freeReplyObject(raw)
        }
    }

    /// Reads one reply, waiting up to the command timeout.
    func readReply() throws -> RedisValue { try readReplies(1)[0] }

    /// Reads `count` replies and decodes them.
    private func readReplies(_ count: Int) throws -> [RedisValue] {
        var replies: [RedisValue] = []
        replies.reserveCapacity(count)
        for _ in 0..<count {
            let raw = try nextReply()
            replies.append(Self.decode(raw.assumingMemoryBound(to: redisReply.self)))
            freeReplyObject(raw)
        }
        return replies
    }

    /// A prepared batch of writes: every reply is read; the first error reply is thrown once all are read (the
    /// connection stays in step).
    func write(_ batch: RedisBatch, what: String) throws {
        try appendBatch(batch)
        var firstError: String?
        for _ in 0..<batch.count {
            let raw = try nextReply()
            let reply = raw.assumingMemoryBound(to: redisReply.self).pointee
            if reply.type == REDIS_REPLY_ERROR, firstError == nil {
                firstError = reply.str.map { String(cString: $0) } ?? ""
            }
            freeReplyObject(raw)
        }
        if let firstError { throw RedisError(.serverError, "\(what): \(firstError)") }
    }

    private func appendBatch(_ batch: RedisBatch) throws {
        assert(batch.isComplete, "RedisBatch: the last command is missing arguments")
        try ensureConnected()
        guard let context else { throw RedisError(.connectFailed, "no connection") }
        let status = batch.bytes.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { chars in
                redisAppendFormattedCommand(context, chars.baseAddress, chars.count)
            }
        }
        if status != REDIS_OK { throw brokenConnection() }
    }

    private func nextReply() throws -> UnsafeMutableRawPointer {
        guard let context else { throw RedisError(.connectionBroken, "no connection") }
        var raw: UnsafeMutableRawPointer?
        guard redisGetReply(context, &raw) == REDIS_OK, let raw else { throw brokenConnection() }
        return raw
    }

    /// Classifies the context's error, drops the context (its state is unknown now) and returns the error.
    private func brokenConnection() -> RedisError {
        guard let context else { return RedisError(.connectionBroken, "no connection") }
        let code = context.pointee.err
        let savedErrno = errno
        let message = Self.errorString(context)
        disconnect()
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
        logger.warning("redis connection dropped", metadata: ["error": "\(error.code.rawValue): \(error.message)"])
        return error
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

    static func decode(_ reply: UnsafeMutablePointer<redisReply>) -> RedisValue {
        let value = reply.pointee
        switch value.type {
        case REDIS_REPLY_STRING:
            guard let str = value.str else { return .string(Data()) }
            return .string(Data(bytes: str, count: value.len))
        case REDIS_REPLY_INTEGER:
            return .integer(Int64(value.integer))
        case REDIS_REPLY_NIL:
            return .null
        case REDIS_REPLY_STATUS:
            guard let str = value.str else { return .status("") }
            return .status(String(decoding: UnsafeRawBufferPointer(start: str, count: value.len), as: UTF8.self))
        case REDIS_REPLY_ERROR:
            guard let str = value.str else { return .error("") }
            return .error(String(decoding: UnsafeRawBufferPointer(start: str, count: value.len), as: UTF8.self))
        case REDIS_REPLY_ARRAY:
            guard let elements = value.element else { return .array([]) }
            var values: [RedisValue] = []
            values.reserveCapacity(value.elements)
            for index in 0..<value.elements {
                if let element = elements[index] {
                    values.append(decode(element))
                } else {
                    values.append(.null)
                }
            }
            return .array(values)
        // RESP3 types: Herald speaks RESP2 (it never sends HELLO 3), so these do not arrive; should one, it decodes as
        // the RESP2 form Redis itself would have sent.
        case REDIS_REPLY_DOUBLE, REDIS_REPLY_BIGNUM, REDIS_REPLY_VERB:
            guard let str = value.str else { return .string(Data()) }
            return .string(Data(bytes: str, count: value.len))
        case REDIS_REPLY_BOOL:
            return .integer(value.integer == 0 ? 0 : 1)
        case REDIS_REPLY_MAP, REDIS_REPLY_SET, REDIS_REPLY_PUSH, REDIS_REPLY_ATTR:
            guard let elements = value.element else { return .array([]) }
            return .array((0..<value.elements).map { elements[$0].map(decode) ?? .null })
        default:
            return .error("unknown hiredis reply type \(value.type)")
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
