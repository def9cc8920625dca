import NIOCore
import NIOHTTP1
import Synchronization

// The limits of the stage's HTTP endpoint (and of the registry API, which runs on the same server code): how long
// a client may take to send a request, how long an idle keep-alive connection stays open, how many connections
// are open at once, and the check of a request head before any of its body is read. docs/security.md lists them.

/// Limits of a `StageHTTPServer`, each with its default (`HERALD_HTTP_READ_TIMEOUT_MS`, `HERALD_HTTP_IDLE_TIMEOUT_MS`, `HERALD_HTTP_MAX_CONNECTIONS`; docs/operations.md).
public struct HTTPServerLimits: Sendable, Hashable {
    /// From a connection's opening, or from the first byte of a request on a kept-alive connection, until the
    /// request's last body byte. A client slower than this is disconnected (a stalled or slow-loris client).
    public var readTimeout: Duration
    /// How long a kept-alive connection may sit idle between requests.
    public var idleTimeout: Duration
    /// Open connections beyond this are answered 503 and closed at once.
    public var maxConnections: Int
    /// Largest request body accepted (413 beyond, answered from the head's `Content-Length` before any body byte
    /// is read, or once the body grows past it).
    public var maxBodyBytes: Int
    /// From a response's head handed to the connection until its last byte is in the kernel's send buffer. A client
    /// that stops reading (pipelining requests and never reading the answers) is disconnected, instead of holding
    /// the connection and its answer for good.
    public var writeTimeout: Duration

    public static let defaultReadTimeout = Duration.seconds(10)
    public static let defaultIdleTimeout = Duration.seconds(60)
    public static let defaultMaxConnections = 1024
    public static let defaultMaxBodyBytes = 1 << 20
    public static let defaultWriteTimeout = Duration.seconds(10)

    public init(
        readTimeout: Duration = defaultReadTimeout, idleTimeout: Duration = defaultIdleTimeout,
        maxConnections: Int = defaultMaxConnections, maxBodyBytes: Int = defaultMaxBodyBytes,
        writeTimeout: Duration = defaultWriteTimeout
    ) {
        self.readTimeout = readTimeout
        self.idleTimeout = idleTimeout
        self.maxConnections = maxConnections
        self.maxBodyBytes = maxBodyBytes
        self.writeTimeout = writeTimeout
    }
}

/// Why the server closed a connection itself (`herald_http_connections_closed_total{reason}`).
public enum HTTPCloseReason: String, Sendable, CaseIterable {
    /// The request (head and body) did not arrive within the read timeout.
    case readTimeout = "read_timeout"
    /// A kept-alive connection was idle for the idle timeout.
    case idleTimeout = "idle_timeout"
    /// The open-connection cap was reached: answered 503 and closed.
    case connectionCap = "connection_cap"
    /// The request head was refused (401, 403, 404, 413, 429) before its body was read.
    case refusedAtHead = "refused_at_head"
    /// An answer was not taken by the client within the write timeout.
    case writeTimeout = "write_timeout"
}

/// Which deadline a connection is under: a pure state machine, driven by what the connection's handlers see.
struct ConnectionDeadlines: Sendable, Equatable {
    enum Phase: Sendable, Equatable {
        /// Nothing received since the connection opened or since the last response: the read timeout on a new
        /// connection, the idle timeout between requests.
        case waiting(fresh: Bool)
        /// A request is arriving (its first byte is in): the read timeout runs.
        case reading
        /// The request is complete and being answered: no client deadline (the handler's own timeouts apply).
        case answering
        /// The request was refused at its head; what the client still sends is read and dropped until it closes
        /// or the read timeout passes (then closed, counted as `refused_at_head` already).
        case lingering
    }

    enum Action: Sendable, Equatable {
        case schedule(Duration, HTTPCloseReason?)
        case cancel
        case none
    }

    var phase = Phase.waiting(fresh: true)
    let readTimeout: Duration
    let idleTimeout: Duration

    func opened() -> Action { .schedule(readTimeout, .readTimeout) }

    /// Bytes arrived from the client.
    mutating func bytesArrived() -> Action {
        switch phase {
        case .waiting(let fresh):
            phase = .reading
            return fresh ? .none : .schedule(readTimeout, .readTimeout)
        case .reading, .answering, .lingering:
            return .none
        }
    }

    /// A request head was decoded (it may have been buffered behind a pipelined request's answer).
    mutating func headRead() -> Action {
        switch phase {
        case .waiting:
            phase = .reading
            return .schedule(readTimeout, .readTimeout)
        case .answering:
            // Pipelined: its bytes arrived while the previous request was answered.
            phase = .reading
            return .schedule(readTimeout, .readTimeout)
        case .reading, .lingering:
            return .none
        }
    }

    /// The request's last body byte arrived.
    mutating func requestEnded() -> Action {
        guard phase == .reading else { return .none }
        phase = .answering
        return .cancel
    }

    /// The answer's last byte was written; the connection stays open for the next request.
    mutating func responseEnded() -> Action {
        guard phase == .answering else { return .none }
        phase = .waiting(fresh: false)
        return .schedule(idleTimeout, .idleTimeout)
    }

    /// The request was refused at its head.
    mutating func refused() -> Action {
        phase = .lingering
        return .schedule(readTimeout, nil)
    }
}

/// The per-connection timer over `ConnectionDeadlines`. Used only on its channel's event loop (both handlers that
/// drive it sit in that channel's pipeline), so it needs no lock.
final class ConnectionTimer {
    private var deadlines: ConnectionDeadlines
    private var scheduled: Scheduled<Void>?
    /// The write deadline of the answer being written, apart from the request deadlines above: the next pipelined
    /// request may be read while an answer is still being written.
    private var writing: Scheduled<Void>?
    private let writeTimeout: Duration
    private let channel: any Channel
    private let onClose: @Sendable (HTTPCloseReason) -> Void

    init(channel: any Channel, limits: HTTPServerLimits, onClose: @escaping @Sendable (HTTPCloseReason) -> Void) {
        self.channel = channel
        self.deadlines = ConnectionDeadlines(readTimeout: limits.readTimeout, idleTimeout: limits.idleTimeout)
        self.onClose = onClose
        self.writeTimeout = limits.writeTimeout
    }

    /// An answer's head is being written: its write deadline starts.
    func responseStarted() {
        writing?.cancel()
        let channel = self.channel
        let onClose = self.onClose
        writing = channel.eventLoop.scheduleTask(in: .nanoseconds(Int64(writeTimeout / .nanoseconds(1)))) {
            onClose(.writeTimeout)
            channel.close(promise: nil)
        }
    }

    /// An answer's last byte was written to the socket.
    func responseWritten() {
        writing?.cancel()
        writing = nil
        responseEnded()
    }

    /// True once a request was refused at its head: what the client still sends is dropped as it arrives.
    var isDiscarding: Bool { deadlines.phase == .lingering }

    func opened() { apply(deadlines.opened()) }
    func bytesArrived() { apply(deadlines.bytesArrived()) }
    func headRead() { apply(deadlines.headRead()) }
    func requestEnded() { apply(deadlines.requestEnded()) }
    func responseEnded() { apply(deadlines.responseEnded()) }
    func refused() { apply(deadlines.refused()) }
    func closed() {
        scheduled?.cancel()
        scheduled = nil
        writing?.cancel()
        writing = nil
    }

    private func apply(_ action: ConnectionDeadlines.Action) {
        switch action {
        case .none:
            return
        case .cancel:
            scheduled?.cancel()
            scheduled = nil
        case .schedule(let after, let reason):
            scheduled?.cancel()
            let channel = self.channel
            let onClose = self.onClose
            scheduled = channel.eventLoop.scheduleTask(in: .nanoseconds(Int64(after / .nanoseconds(1)))) {
                if let reason { onClose(reason) }
                channel.close(promise: nil)
            }
        }
    }
}

/// First in the pipeline: sees every byte a client sends, so a request's read timeout starts at its first byte
/// (a head that stalls half-way never reaches the HTTP decoder's output). Once a request is refused at its head,
/// it drops what arrives before the HTTP decoder sees it, so a refused upload holds no decoder buffer.
final class ByteArrivalHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    private let timer: ConnectionTimer

    init(timer: ConnectionTimer) { self.timer = timer }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { timer.opened() }
    }

    func channelActive(context: ChannelHandlerContext) {
        timer.opened()
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if timer.isDiscarding { return }
        timer.bytesArrived()
        context.fireChannelRead(data)
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer.closed()
        context.fireChannelInactive()
    }
}

/// A request head as the head check sees it: no body yet.
public struct HTTPRequestHeadCheck: Sendable {
    public var method: String
    public var path: String
    public var headers: [String: String]
    /// The client's IP address (nil when unknown).
    public var remoteAddress: String?
}

/// After the HTTP decoder: checks each request head before any of its body is read. A refused head (the
/// `admit` check's answer, or a `Content-Length` over the body limit) is answered at once with
/// `Connection: close`; the connection's output is then shut, and what the client still sends is dropped without
/// being buffered until it closes or the read timeout passes (closing at once, with unread bytes, would make
/// the kernel reset the connection and could destroy the answer before the client reads it).
final class RequestHeadGate: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let timer: ConnectionTimer
    private let maxBodyBytes: Int
    private let admit: HTTPHeadCheck?
    private let onRefused: @Sendable () -> Void
    private var dropping = false

    init(
        timer: ConnectionTimer, maxBodyBytes: Int, admit: HTTPHeadCheck?,
        onRefused: @escaping @Sendable () -> Void
    ) {
        self.timer = timer
        self.maxBodyBytes = maxBodyBytes
        self.admit = admit
        self.onRefused = onRefused
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if dropping { return }
        let part = unwrapInboundIn(data)
        switch part {
        case .head(let head):
            timer.headRead()
            if let refusal = refusal(head, remote: context.channel.remoteAddress?.ipAddress) {
                refuse(context: context, head: head, with: refusal)
                return
            }
        case .body:
            break
        case .end:
            timer.requestEnded()
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch unwrapOutboundIn(data) {
        case .head:
            timer.responseStarted()
            context.write(data, promise: promise)
        case .body:
            context.write(data, promise: promise)
        case .end:
            // The deadline ends when the last byte is in the socket, not when it is handed to the pipeline.
            // The handler, the timer and the promise live on the connection's event loop: the callback runs there.
            let written = promise ?? context.eventLoop.makePromise(of: Void.self)
            let timer = self.timer
            written.futureResult.assumeIsolated().whenSuccess { timer.responseWritten() }
            context.write(data, promise: written)
        }
    }

    private func refusal(_ head: HTTPRequestHead, remote: String?) -> HTTPRouteResponse? {
        if let length = head.headers.first(name: "content-length").flatMap({ Int($0) }), length > maxBodyBytes {
            return HTTPRouteResponse(
                status: 413,
                body: Array(#"{"error":"request body larger than \#(maxBodyBytes) bytes","field":"(body)"}"#.utf8))
        }
        guard let admit else { return nil }
        var headers: [String: String] = [:]
        for (name, value) in head.headers where headers[name.lowercased()] == nil { headers[name.lowercased()] = value }
        let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init)
        return admit(
            HTTPRequestHeadCheck(
                method: head.method.rawValue, path: path ?? head.uri, headers: headers, remoteAddress: remote))
    }

    private func refuse(context: ChannelHandlerContext, head: HTTPRequestHead, with response: HTTPRouteResponse) {
        dropping = true
        timer.refused()
        onRefused()
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: response.contentType)
        headers.add(name: "Content-Length", value: String(response.body.count))
        headers.add(name: "Connection", value: "close")
        for (name, value) in response.headers { headers.add(name: name, value: value) }
        context.write(
            wrapOutboundOut(
                .head(
                    HTTPResponseHead(
                        version: head.version, status: .init(statusCode: response.status), headers: headers))),
            promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: response.body)))), promise: nil)
        let done = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: done)
        let channel = context.channel
        done.futureResult.whenComplete { _ in channel.close(mode: .output, promise: nil) }
    }
}

/// Counts open connections against the cap.
final class ConnectionCounter: Sendable {
    private let open = Atomic<Int>(0)
    let limit: Int

    init(limit: Int) { self.limit = limit }

    /// Counts a new connection; false when the cap is reached (the connection is then not counted).
    func admit() -> Bool {
        while true {
            let current = open.load(ordering: .relaxed)
            guard current < limit else { return false }
            if open.compareExchange(expected: current, desired: current + 1, ordering: .relaxed).exchanged {
                return true
            }
        }
    }

    func release() { open.subtract(1, ordering: .relaxed) }

    var count: Int { open.load(ordering: .relaxed) }
}

/// On a connection over the cap: writes a fixed 503 and closes, before any HTTP handling is set up.
final class OverCapacityHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    static let answer: [UInt8] = {
        let body = #"{"error":"too many connections; try again"}"#
        return Array(
            ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
                + "Connection: close\r\nRetry-After: 1\r\n\r\n" + body).utf8)
    }()
    private var answered = false

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { answer(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        answer(context: context)
    }

    private func answer(context: ChannelHandlerContext) {
        guard !answered else { return }
        answered = true
        let channel = context.channel
        context.writeAndFlush(NIOAny(ByteBuffer(bytes: Self.answer))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}

/// The head check of a server with routes: runs on the connection's event loop as soon as a request head is
/// read, so it must be quick and must not block. A non-nil answer is sent at once and the body is never read.
public typealias HTTPHeadCheck = @Sendable (HTTPRequestHeadCheck) -> HTTPRouteResponse?
