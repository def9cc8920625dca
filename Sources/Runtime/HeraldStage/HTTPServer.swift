import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import Prometheus
import ServiceLifecycle
import Synchronization

/// The HTTP/1.1 endpoint every stage serves:
/// - `GET /metrics`: Prometheus text exposition of the registry;
/// - `GET /healthz`: 200 while the process runs;
/// - `GET /readyz`: 200 when every readiness check passes, else 503 with a JSON body naming the failing ones.
///
/// Create it with `bind(host:port:registry:readiness:logger:)` (port 0 picks a free port; `port` tells which), then
/// run it as a `Service`, first in the stage's `ServiceGroup` so it is the last to stop and `/metrics` stays up while
/// the other services drain.
///
/// With `routes` (the registry API, docs/registry-api.md), every request goes to that handler first, body
/// included (at most `limits.maxBodyBytes`, else 413); a nil answer falls through to the three endpoints above.
/// `admit` checks each request head before any of its body is read (the API's token check): its answer is sent
/// at once and the body is never buffered.
///
/// Every connection is bounded by `limits` (`HTTPServerLimits`): the read timeout, the idle timeout, the cap on
/// open connections. Connections the server closes itself are counted in `herald_http_connections_closed_total`.
public final class StageHTTPServer: Service, Sendable {
    public let host: String
    /// The bound port (the ephemeral one when bound with port 0).
    public let port: Int
    private let serverChannel: NIOAsyncChannel<AcceptedConnection, Never>
    private let registry: PrometheusCollectorRegistry
    private let readiness: ReadinessChecks
    private let logger: Logger
    /// Labels of the readiness gauges (`stage`), set on every scrape of `/metrics`.
    private let readinessLabels: [(String, String)]
    private let routes: HTTPRouteHandler?
    public let limits: HTTPServerLimits
    private let connections: ConnectionCounter

    private init(
        host: String, port: Int,
        serverChannel: NIOAsyncChannel<AcceptedConnection, Never>,
        registry: PrometheusCollectorRegistry, readiness: ReadinessChecks, logger: Logger,
        readinessLabels: [(String, String)], routes: HTTPRouteHandler?, limits: HTTPServerLimits,
        connections: ConnectionCounter
    ) {
        self.limits = limits
        self.connections = connections
        self.readinessLabels = readinessLabels
        self.routes = routes
        self.host = host
        self.port = port
        self.serverChannel = serverChannel
        self.registry = registry
        self.readiness = readiness
        self.logger = logger
    }

    /// Binds the listening socket now (so a port conflict fails at startup, and port 0 resolves to a real port).
    /// - Parameter endpoint: the `endpoint` label of `herald_http_connections_closed_total` (`metrics`, `api`).
    /// - Parameter readinessLabels: labels of `herald_ready` and `herald_readiness_check` (the stage's `stage`),
    ///   which every `/metrics` scrape sets from a fresh readiness evaluation, so alerts can see a stage that is not ready.
    public static func bind(
        host: String = "0.0.0.0", port: Int, registry: PrometheusCollectorRegistry,
        readiness: ReadinessChecks, readinessLabels: [(String, String)] = [],
        logger: Logger = Logger(label: "herald.http"),
        eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        routes: HTTPRouteHandler? = nil, admit: HTTPHeadCheck? = nil,
        limits: HTTPServerLimits = HTTPServerLimits(), endpoint: String = "metrics"
    ) async throws -> StageHTTPServer {
        let connections = ConnectionCounter(limit: limits.maxConnections)
        let closed = ClosedCounters(registry: registry, labels: readinessLabels + [("endpoint", endpoint)])
        let channel = try await ServerBootstrap(group: eventLoopGroup)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            // Room for a crowd of handshakes that arrives faster than the accept loop runs (the kernel caps it at
            // net.core.somaxconn): a handshake that finds the queue full is dropped, and the client waits for its
            // retransmission.
            .serverChannelOption(.backlog, value: 4096)
            // Accepted connections wait for the serving loop in a buffer of up to the connection cap (NIO's default
            // is 10): a crowd is accepted and counted against the cap on NIO's own threads even while the tasks
            // that serve it are slow to be scheduled, instead of waiting in the kernel's queue for them.
            .bind(
                host: host, port: port,
                serverBackPressureStrategy: .init(
                    lowWatermark: max(2, limits.maxConnections / 2), highWatermark: max(10, limits.maxConnections))
            ) { child in
                child.eventLoop.makeCompletedFuture {
                    let sync = child.pipeline.syncOperations
                    guard connections.admit() else {
                        closed.count(.connectionCap)
                        try sync.addHandler(OverCapacityHandler())
                        return AcceptedConnection(
                            try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(
                                wrappingChannelSynchronously: child))
                    }
                    child.closeFuture.whenComplete { _ in connections.release() }
                    let timer = ConnectionTimer(channel: child, limits: limits) { closed.count($0) }
                    try sync.addHandler(ByteArrivalHandler(timer: timer))
                    try sync.configureHTTPServerPipeline(withErrorHandling: true)
                    try sync.addHandler(
                        RequestHeadGate(
                            timer: timer, maxBodyBytes: limits.maxBodyBytes, admit: admit,
                            onRefused: { closed.count(.refusedAtHead) }))
                    return AcceptedConnection(
                        try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(
                            wrappingChannelSynchronously: child))
                }
            }
        let bound = channel.channel.localAddress?.port ?? port
        logger.info("http endpoint listening", metadata: [LogKey.host: "\(host)", LogKey.port: "\(bound)"])
        return StageHTTPServer(
            host: host, port: bound, serverChannel: channel, registry: registry,
            readiness: readiness, logger: logger, readinessLabels: readinessLabels, routes: routes, limits: limits,
            connections: connections)
    }

    /// Connections open now (for tests and the connection cap).
    public var openConnections: Int { connections.count }

    /// Serves connections until graceful shutdown or cancellation, then closes the listening socket and every open
    /// connection (an idle keep-alive connection from a scraper must not hold up the shutdown).
    public func run() async throws {
        let serverChannel = self.serverChannel
        do {
            try await cancelWhenGracefulShutdown {
                try await withThrowingDiscardingTaskGroup { group in
                    try await serverChannel.executeThenClose { inbound in
                        for try await accepted in inbound {
                            let connection = accepted.take()
                            group.addTask { await self.serve(connection) }
                        }
                    }
                }
            }
        } catch {
            // Cancellation (graceful shutdown or the group cancelling) ends serving normally.
            if !Task.isCancelled && !Task.isShuttingDownGracefully && !(error is CancellationError) {
                throw error
            }
        }
        try? await serverChannel.channel.close()
    }

    /// Closes the listening socket (what graceful shutdown does).
    public func close() async {
        try? await serverChannel.channel.close()
    }

    private func serve(_ connection: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>) async {
        do {
            try await connection.executeThenClose { inbound, outbound in
                var request: HTTPRequestHead?
                var body: [UInt8] = []
                var bodyTooLarge = false
                for try await part in inbound {
                    switch part {
                    case .head(let head):
                        request = head
                        body = []
                        bodyTooLarge = false
                    case .body(var chunk):
                        guard self.routes != nil, !bodyTooLarge else { continue }
                        if body.count + chunk.readableBytes > self.limits.maxBodyBytes {
                            bodyTooLarge = true
                            body = []
                        } else if let bytes = chunk.readBytes(length: chunk.readableBytes) {
                            body += bytes
                        }
                    case .end:
                        guard let head = request else { continue }
                        request = nil
                        let response: Response
                        if bodyTooLarge {
                            response = Response(
                                status: .payloadTooLarge, contentType: "application/json",
                                body: Array(
                                    #"{"error":"request body larger than \#(self.limits.maxBodyBytes) bytes","field":"(body)"}"#
                                        .utf8))
                        } else if let routes = self.routes,
                            let routed = await routes(
                                Self.routeRequest(head, body: body, remote: connection.channel.remoteAddress?.ipAddress)
                            )
                        {
                            response = Response(
                                status: HTTPResponseStatus(statusCode: routed.status),
                                contentType: routed.contentType, body: routed.body, headers: routed.headers)
                        } else {
                            response = await self.respond(to: head)
                        }
                        body = []
                        var headers = HTTPHeaders()
                        headers.add(name: "Content-Type", value: response.contentType)
                        headers.add(name: "Content-Length", value: String(response.body.count))
                        for (name, value) in response.headers { headers.add(name: name, value: value) }
                        if !head.isKeepAlive { headers.add(name: "Connection", value: "close") }
                        try await outbound.write(
                            .head(HTTPResponseHead(version: head.version, status: response.status, headers: headers)))
                        if head.method != .HEAD {
                            try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: response.body))))
                        }
                        try await outbound.write(.end(nil))
                        if !head.isKeepAlive { return }
                    }
                }
            }
        } catch {
            logger.debug("http connection ended with an error", metadata: [LogKey.error: "\(error)"])
        }
    }

    /// The head check of an unauthenticated probe route (`/healthz` on the registry API's port): GET or HEAD
    /// without a body, else refused before anything more is read (405, or 400 for a body).
    public static func healthCheckHead(_ head: HTTPRequestHeadCheck) -> HTTPRouteResponse? {
        guard head.method == "GET" || head.method == "HEAD" else {
            return HTTPRouteResponse(status: 405, body: Array(#"{"error":"method not allowed"}"#.utf8))
        }
        let length = head.headers["content-length"].flatMap { Int($0.trimmingCharacters(in: .whitespaces)) } ?? 0
        guard length == 0, head.headers["transfer-encoding"] == nil else {
            return HTTPRouteResponse(status: 400, body: Array(#"{"error":"this route takes no body"}"#.utf8))
        }
        return nil
    }

    static func routeRequest(_ head: HTTPRequestHead, body: [UInt8], remote: String? = nil) -> HTTPRouteRequest {
        let parts = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        var headers: [String: String] = [:]
        for (name, value) in head.headers where headers[name.lowercased()] == nil { headers[name.lowercased()] = value }
        return HTTPRouteRequest(
            method: head.method.rawValue, path: parts.first.map(String.init) ?? head.uri,
            query: parts.count > 1 ? String(parts[1]) : nil, headers: headers, body: body, remoteAddress: remote)
    }

    struct Response {
        var status: HTTPResponseStatus
        var contentType: String
        var body: [UInt8]
        var headers: [(String, String)] = []
    }

    func respond(to head: HTTPRequestHead) async -> Response {
        let path = head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
        guard head.method == .GET || head.method == .HEAD else {
            return Response(
                status: .methodNotAllowed, contentType: "application/json",
                body: Array(#"{"error":"method not allowed"}"#.utf8))
        }
        switch path {
        case "/metrics":
            await publishReadiness()
            var text = HeraldMetrics.emit(registry)
            ProcessMetrics.current()?.emit(labels: readinessLabels, into: &text)
            return Response(status: .ok, contentType: "text/plain; version=0.0.4; charset=utf-8", body: text)
        case "/healthz":
            return Response(status: .ok, contentType: "application/json", body: Array(#"{"status":"ok"}"#.utf8))
        case "/readyz":
            let report = await readiness.evaluate()
            return Response(
                status: report.isReady ? .ok : .serviceUnavailable, contentType: "application/json",
                body: Array(Self.readinessJSON(report).utf8))
        default:
            return Response(
                status: .notFound, contentType: "application/json", body: Array(#"{"error":"not found"}"#.utf8))
        }
    }

    /// `herald_ready` (1 when `/readyz` would answer 200) and `herald_readiness_check{check}` (1 per passing check).
    private func publishReadiness() async {
        let report = await readiness.evaluate()
        registry.makeGauge(descriptor: .herald(StageMetrics.Name.ready), labels: readinessLabels)
            .set(to: report.isReady ? 1.0 : 0.0)
        for (check, passing) in report.checks {
            registry.makeGauge(
                descriptor: .herald(StageMetrics.Name.readinessCheck), labels: readinessLabels + [("check", check)]
            ).set(to: passing ? 1.0 : 0.0)
        }
    }

    /// `{"status":"ready","failing":[],"checks":{"redis":true}}` or `{"status":"not_ready","failing":["redis"],...}`.
    static func readinessJSON(_ report: ReadinessChecks.Report) -> String {
        var out = "{\"status\":\"\(report.isReady ? "ready" : "not_ready")\",\"failing\":["
        out += report.failing.map { name -> String in
            var quoted = ""
            JSONLogHandler.appendString(name, to: &quoted)
            return quoted
        }.joined(separator: ",")
        out += "],\"checks\":{"
        out += report.checks.sorted { $0.key < $1.key }.map { name, passed -> String in
            var quoted = ""
            JSONLogHandler.appendString(name, to: &quoted)
            return quoted + ":" + (passed ? "true" : "false")
        }.joined(separator: ",")
        out += "}}"
        return out
    }
}

/// A request handed to the endpoint's extra routes: header names lowercased (first value of each).
public struct HTTPRouteRequest: Sendable {
    public var method: String
    public var path: String
    public var query: String?
    public var headers: [String: String]
    public var body: [UInt8]
    /// The client's IP address (nil when unknown).
    public var remoteAddress: String?

    public init(
        method: String, path: String, query: String? = nil, headers: [String: String] = [:], body: [UInt8] = [],
        remoteAddress: String? = nil
    ) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.remoteAddress = remoteAddress
    }
}

/// What an extra route (or the head check) answers.
public struct HTTPRouteResponse: Sendable {
    public var status: Int
    public var contentType: String
    public var body: [UInt8]
    /// Extra headers (`WWW-Authenticate`, `Retry-After`, ...).
    public var headers: [(String, String)]

    public init(
        status: Int, contentType: String = "application/json", body: [UInt8], headers: [(String, String)] = []
    ) {
        self.status = status
        self.contentType = contentType
        self.body = body
        self.headers = headers
    }
}

/// `herald_http_connections_closed_total{stage, endpoint, reason}`: connections the server closed itself.
struct ClosedCounters: Sendable {
    let registry: PrometheusCollectorRegistry
    let labels: [(String, String)]

    func count(_ reason: HTTPCloseReason) {
        registry.makeCounter(
            descriptor: .herald(StageMetrics.Name.httpConnectionsClosed), labels: labels + [("reason", reason.rawValue)]
        ).increment()
    }
}

extension MetricNameDescriptor {
    /// A metric of `StageMetrics.Name` by its full name, without a `# HELP` line (as every metric the stages export:
    /// docs/operations.md describes them).
    static func herald(_ name: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: name, unitName: "", helpText: "")
    }
}

/// Extra routes of the HTTP endpoint: nil lets the request fall through to /metrics, /healthz and /readyz.
public typealias HTTPRouteHandler = @Sendable (HTTPRouteRequest) async -> HTTPRouteResponse?

/// An accepted connection on its way to the serving loop. One the loop never takes (accepted while the server stops
/// serving, such as a scrape in a shutdown's last moment) is closed when it is dropped: NIO traps when a wrapped
/// channel goes away without its writer finished.
final class AcceptedConnection: Sendable {
    private let connection: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>
    private let taken = Atomic<Bool>(false)

    init(_ connection: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>) {
        self.connection = connection
    }

    /// The connection, for `executeThenClose`, which finishes and closes it.
    func take() -> NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart> {
        taken.store(true, ordering: .relaxed)
        return connection
    }

    deinit {
        guard !taken.load(ordering: .relaxed) else { return }
        // Finished and closed the way a served connection is, on a task of its own (a deinit cannot wait).
        let connection = self.connection
        Task { try? await connection.executeThenClose { _, _ in } }
    }
}
