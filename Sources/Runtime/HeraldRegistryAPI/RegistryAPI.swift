import Foundation
import HeraldCore
import HeraldRedis
import Logging

/// The registry HTTP API (docs/registry-api.md, OpenAPI in docs/registry-api.yaml): JSON over HTTP/1.1, paths
/// under `/v1/apps/{app}/users/{user}/`, a bearer token per calling back end. Transport-free: the stage's
/// HTTP endpoint (HeraldStage `StageHTTPServer`) hands each request to `handle`.
///
/// Writes answer 202 once the record is on herald.registry (herald-registry applies it moments later, in
/// order per user); reads answer from Redis. Errors are `{"error": "...", "field": "..."}`: 400 names the field,
/// 401 a missing or unknown token, 403 an app outside the client's scope, 404 an unknown route or an app the
/// pipeline does not list, 405 a known route with another method, 429 too many failed authentications from the
/// address, 503 when Kafka or Redis cannot be reached (it names which; try again).
public struct RegistryAPI: Sendable {
    /// One calling back end: its name (in logs and metrics), its bearer token and the apps it may use.
    public struct Client: Sendable {
        public var name: String
        public var token: [UInt8]
        /// The apps this client may read and write; nil: every app the pipeline serves.
        public var apps: Set<String>?
        public init(name: String, token: String, apps: Set<String>? = nil) {
            self.name = name
            self.token = Array(token.utf8)
            self.apps = apps
        }

        public func mayUse(_ app: String) -> Bool { apps?.contains(app) ?? true }
    }

    /// Shortest bearer token accepted from any source (`api.clients.*.token_env`, `HERALD_API_TOKENS`).
    public static let minimumTokenLength = 32

    public struct Response: Sendable, Equatable {
        public var status: Int
        public var body: [UInt8]
        /// Extra headers (`WWW-Authenticate`, `Retry-After`).
        public var headers: [String: String]
        public init(status: Int, body: [UInt8], headers: [String: String] = [:]) {
            self.status = status
            self.body = body
            self.headers = headers
        }
    }

    public let operations: RegistryOperations
    public let clients: [Client]
    public let logger: Logger
    /// The pipeline file's apps: a path naming another app is 404 (nil: every app is served).
    public let apps: AppDirectory?
    /// Failed authentications per client address (nil: no limit).
    public let limiter: AuthFailureLimiter?
    /// Called once per answered request: the route template (`PATCH /v1/apps/{app}/users/{user}/preferences`, or
    /// `unknown`, `unknown_app`, `unauthenticated`, `throttled`, `forbidden`, `method_not_allowed`: a fixed set,
    /// never a value from the request, so a client cannot grow the metric's label set), the status, and the
    /// client's name (`-` when unauthenticated).
    public let onRequest: @Sendable (_ route: String, _ status: Int, _ client: String) -> Void

    public init(
        operations: RegistryOperations, clients: [Client], logger: Logger, apps: AppDirectory? = nil,
        limiter: AuthFailureLimiter? = nil,
        onRequest: @escaping @Sendable (String, Int, String) -> Void = { _, _, _ in }
    ) {
        self.operations = operations
        self.clients = clients
        self.logger = logger
        self.apps = apps
        self.limiter = limiter
        self.onRequest = onRequest
    }

    /// The checks that need only the request head, in this order: a path outside `/v1` (404), an address over
    /// its failed-authentication budget (429, before the token is looked at), the token (401), the client's
    /// apps (403), an app the pipeline does not list (404). The HTTP server runs this as soon as a head is read,
    /// so a refused request's body is never read. Nil: the request may go on.
    public func checkHead(method: String, path: String, headers: [String: String], remote: String?) -> Response? {
        guard let (route, refusal) = headRefusal(path: path, headers: headers, remote: remote, countFailure: true)
        else { return nil }
        report(route: route, response: refusal, client: "-")
        return refusal
    }

    /// Answers one request. `headers` are keyed by lowercased name. A write whose request has a valid W3C
    /// `traceparent` (and `tracestate`) header puts them on the record it publishes (`RegistryTrace`); one that is
    /// not valid is ignored.
    public func handle(
        method: String, path: String, query: String? = nil, headers: [String: String], body: [UInt8],
        remote: String? = nil
    ) async -> Response {
        let client = authenticate(headers["authorization"])
        let route: String
        let response: Response
        if let (refusedRoute, refusal) = headRefusal(
            path: path, headers: headers, remote: remote, countFailure: false)
        {
            (route, response) = (refusedRoute, refusal)
        } else {
            let trace = RegistryTrace(traceparent: headers["traceparent"], tracestate: headers["tracestate"])
            (route, response) = await answer(method: method, path: path, query: query, body: body, trace: trace)
        }
        report(route: route, response: response, client: client?.name ?? "-")
        return response
    }

    private func report(route: String, response: Response, client: String) {
        onRequest(route, response.status, client)
        let metadata: Logger.Metadata = ["route": "\(route)", "status": "\(response.status)", "client": "\(client)"]
        if response.status >= 500 {
            logger.warning("registry api request failed", metadata: metadata)
        } else {
            logger.debug("registry api request", metadata: metadata)
        }
    }

    /// The route label and answer of a request the head checks refuse (`checkHead`); nil when they pass.
    /// `countFailure`: a failed authentication is counted against the address (once per request: at the head).
    func headRefusal(
        path: String, headers: [String: String], remote: String?, countFailure: Bool
    ) -> (String, Response)? {
        let segments = Self.segments(path)
        guard segments.first == "v1" else { return ("unknown", Self.error(404, "not found")) }
        let address = remote ?? "-"
        if let limiter, limiter.isBlocked(address) {
            var answer = Self.error(429, "too many failed authentications from this address; try again later")
            answer.headers["Retry-After"] = String(limiter.retryAfterSeconds(address))
            return ("throttled", answer)
        }
        guard let client = authenticate(headers["authorization"]) else {
            if countFailure { limiter?.recordFailure(address) }
            var answer = Self.error(401, "missing or unknown bearer token", field: "Authorization")
            answer.headers["WWW-Authenticate"] = "Bearer"
            return ("unauthenticated", answer)
        }
        guard segments.count >= 3, segments[1] == "apps", !segments[2].isEmpty else { return nil }
        let app = segments[2]
        guard client.mayUse(app) else {
            return ("forbidden", Self.error(403, "this client may not use this app", field: "app"))
        }
        if let apps, !apps.isKnown(app) {
            return ("unknown_app", Self.error(404, "the pipeline serves no such app", field: "app"))
        }
        return nil
    }

    /// The client whose token the `Authorization: Bearer` header carries. Every configured token is compared,
    /// each in constant time, so the answer's timing does not tell how much of a guess was right.
    func authenticate(_ header: String?) -> Client? {
        guard let header, header.count > 7, header.prefix(7).lowercased() == "bearer " else { return nil }
        let presented = Array(header.utf8.dropFirst(7))
        var found: Client?
        for client in clients where Self.constantTimeEqual(presented, client.token) && !client.token.isEmpty {
            found = client
        }
        return found
    }

    static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        var difference: UInt8 = a.count == b.count ? 0 : 1
        for i in 0..<max(a.count, b.count) {
            difference |= (i < a.count ? a[i] : 0) ^ (i < b.count ? b[i] : 0)
        }
        return difference == 0
    }

    static func segments(_ path: String) -> [String] {
        path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
            .map { String($0).removingPercentEncoding ?? String($0) }
    }

    /// Routes an authenticated request for an app the client may use.
    private func answer(
        method: String, path: String, query: String?, body: [UInt8], trace: RegistryTrace?
    ) async -> (String, Response) {
        let segments = Self.segments(path)
        guard segments.count >= 6, segments[1] == "apps", !segments[2].isEmpty, !segments[4].isEmpty,
            segments[2].utf8.count <= RegistryRecord.maxIDBytes, segments[4].utf8.count <= RegistryRecord.maxIDBytes
        else {
            return ("unknown", Self.error(404, "not found"))
        }
        let app = segments[2]
        switch segments[3] {
        case "users":
            return await userRoute(
                method: method, app: app, user: segments[4], rest: Array(segments.dropFirst(5)), query: query,
                body: body, trace: trace)
        case "conversations":
            return await conversationRoute(
                method: method, app: app, conversation: segments[4], rest: Array(segments.dropFirst(5)), body: body,
                trace: trace)
        default: return ("unknown", Self.error(404, "not found"))
        }
    }

    private func userRoute(
        method: String, app: String, user: String, rest: [String], query: String?, body: [UInt8],
        trace: RegistryTrace?
    ) async -> (String, Response) {
        let base = "/v1/apps/{app}/users/{user}/"
        switch (rest.first ?? "", rest.count) {
        case ("devices", 1):
            switch method {
            case "GET":
                return (
                    "GET \(base)devices",
                    await read { () async throws -> [UInt8] in
                        Array(try await operations.devicesJSON(app: app, user: user).serialized.utf8)
                    }
                )
            case "POST":
                return (
                    "POST \(base)devices",
                    await write(trace) { () throws(FieldError) in
                        let record = try RegistryOperations.registerRecord(
                            app: app, user: user, body: body, now: operations.now())
                        // A Web Push subscription of a push service the app does not allow.
                        if let device = record.device, let problem = apps?.app(app).webPushProblem(device) {
                            throw FieldError(field: "subscription", message: problem)
                        }
                        return record
                    }
                )
            case "DELETE":
                return (
                    "DELETE \(base)devices",
                    await write(trace) { RegistryRecord(op: .unregisterAll, appID: app, user: user) }
                )
            default: return ("method_not_allowed", Self.methodNotAllowed("GET, POST, DELETE"))
            }
        case ("devices", 2):
            guard method == "DELETE" else { return ("method_not_allowed", Self.methodNotAllowed("DELETE")) }
            let token = rest[1]
            return (
                "DELETE \(base)devices/{token}",
                await write(trace) {
                    RegistryRecord(op: .unregisterDevice, appID: app, user: user, token: token)
                }
            )
        case ("preferences", 1):
            switch method {
            case "GET":
                return (
                    "GET \(base)preferences",
                    await read { () async throws -> [UInt8] in
                        StageCodec.encode(try await operations.preferences(app: app, user: user))
                    }
                )
            case "PATCH":
                let record: RegistryRecord
                do throws(FieldError) {
                    record = try RegistryOperations.patchRecord(app: app, user: user, body: body)
                } catch {
                    return ("PATCH \(base)preferences", Self.error(400, error.message, field: error.field))
                }
                do {
                    if let over = try await operations.exceedsLimits(record) {
                        return (
                            "PATCH \(base)preferences", Self.error(400, over.problem.message, field: over.problem.field)
                        )
                    }
                } catch {
                    return ("PATCH \(base)preferences", unavailable(error))
                }
                return ("PATCH \(base)preferences", await write(trace) { record })
            default: return ("method_not_allowed", Self.methodNotAllowed("GET, PATCH"))
            }
        case ("presence", 1):
            guard method == "PUT" else { return ("method_not_allowed", Self.methodNotAllowed("PUT")) }
            return (
                "PUT \(base)presence",
                await write(trace) { () throws(FieldError) in
                    try RegistryOperations.presenceRecord(app: app, user: user, body: body)
                }
            )
        case ("read", 1):
            guard method == "POST" else { return ("method_not_allowed", Self.methodNotAllowed("POST")) }
            return (
                "POST \(base)read",
                await write(trace) { () throws(FieldError) in
                    try RegistryOperations.markReadRecord(
                        app: app, user: user, body: body, now: operations.now())
                }
            )
        case ("counts", 1):
            guard method == "GET" else { return ("method_not_allowed", Self.methodNotAllowed("GET")) }
            return (
                "GET \(base)counts",
                await read { () async throws -> [UInt8] in
                    let c = try await operations.counts(app: app, user: user)
                    return Array(
                        JSONValue.object([
                            ("unread", Self.json(total: c.total, c.conversations)),
                            ("mentions", Self.json(total: c.mentionTotal, c.mentionConversations)),
                        ]).serialized.utf8)
                }
            )
        case ("explain", 1):
            guard method == "GET" else { return ("method_not_allowed", Self.methodNotAllowed("GET")) }
            return ("GET \(base)explain", await explain(app: app, user: user, query: query))
        default:
            return ("unknown", Self.error(404, "not found"))
        }
    }

    private func conversationRoute(
        method: String, app: String, conversation: String, rest: [String], body: [UInt8], trace: RegistryTrace?
    ) async -> (String, Response) {
        let base = "/v1/apps/{app}/conversations/{conversation}/"
        switch (rest.first ?? "", rest.count) {
        case ("members", 1):
            switch method {
            case "GET":
                return (
                    "GET \(base)members",
                    await read { () async throws -> [UInt8] in
                        let members = try await operations.members(app: app, conversation: conversation)
                        return Array(
                            JSONValue.object([
                                ("conversation", .string(conversation)),
                                ("members", .array(members.map(JSONValue.string))),
                            ]).serialized.utf8)
                    }
                )
            case "PUT":
                return (
                    "PUT \(base)members",
                    await write(trace) { () throws(FieldError) in
                        try RegistryOperations.membersRecord(
                            .setMembers, app: app, conversation: conversation, body: body)
                    }
                )
            case "POST":
                return (
                    "POST \(base)members",
                    await write(trace) { () throws(FieldError) in
                        try RegistryOperations.membersRecord(
                            .addMembers, app: app, conversation: conversation, body: body)
                    }
                )
            default: return ("method_not_allowed", Self.methodNotAllowed("GET, PUT, POST"))
            }
        case ("members", 2):
            guard method == "DELETE" else { return ("method_not_allowed", Self.methodNotAllowed("DELETE")) }
            let member = rest[1]
            return (
                "DELETE \(base)members/{user}",
                await write(trace) {
                    RegistryRecord(op: .removeMembers, appID: app, conversation: conversation, members: [member])
                }
            )
        default:
            return ("unknown", Self.error(404, "not found"))
        }
    }

    /// `GET .../explain`: the user's latest decision, or with `?event=E` the decision about event E.
    func explain(app: String, user: String, query: String?) async -> Response {
        let event = Self.queryValue(query, "event")
        if let event, event.isEmpty || event.utf8.count > RegistryRecord.maxIDBytes {
            return Self.error(400, "an event id is 1 to \(RegistryRecord.maxIDBytes) bytes", field: "event")
        }
        do {
            guard let decision = try await operations.decision(app: app, user: user, event: event) else {
                return Self.error(
                    404,
                    event == nil
                        ? "no decision about this user is kept (never a recipient, or expired)"
                        : "no decision about this user and event is kept (not a recipient of it, or expired)")
            }
            return Response(status: 200, body: Array(decision.serialized.utf8))
        } catch {
            return unavailable(error)
        }
    }

    /// The first value of `name` in a query string (percent-decoded), nil when absent.
    static func queryValue(_ query: String?, _ name: String) -> String? {
        guard let query else { return nil }
        for pair in query.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.first.map(String.init) == name else { continue }
            let raw = parts.count > 1 ? String(parts[1]) : ""
            return raw.replacingOccurrences(of: "+", with: " ").removingPercentEncoding ?? raw
        }
        return nil
    }

    /// Builds a record (a `FieldError` is a 400 naming the field), publishes it (with the caller's trace context when
    /// it sent a valid one), answers 202.
    private func write(
        _ trace: RegistryTrace?, _ build: () throws(FieldError) -> RegistryRecord
    ) async -> Response {
        let record: RegistryRecord
        do throws(FieldError) {
            record = try build()
        } catch {
            return Self.error(400, error.message, field: error.field)
        }
        if let problem = record.validationError() { return Self.error(400, problem.detail, field: "(body)") }
        if let outside = record.rangeError() { return Self.error(400, outside.message, field: outside.field) }
        do {
            try await operations.sink.publish(record, trace: trace)
        } catch {
            return unavailable(error)
        }
        return Response(
            status: 202,
            body: Array(
                JSONValue.object([
                    ("accepted", .bool(true)), ("op", .string(record.op.rawValue)),
                    record.isMemberOp
                        ? ("conversation", .string(record.conversation ?? "")) : ("user", .string(record.user ?? "")),
                ]).serialized.utf8))
    }

    private func read(_ body: () async throws -> [UInt8]) async -> Response {
        do {
            return Response(status: 200, body: try await body())
        } catch {
            return unavailable(error)
        }
    }

    /// 503: Redis or Kafka could not be reached. The message names the dependency that failed (`redis` or
    /// `kafka`), never its address or the request's content; the log line has the error itself.
    func unavailable(_ error: any Error) -> Response {
        let dependency = error is RedisError ? "redis" : "kafka"
        logger.warning(
            "registry api dependency failed", metadata: ["dependency": "\(dependency)", "error": "\(error)"])
        var o: [(String, JSONValue)] = [
            (
                "error",
                .string(
                    "\(dependency == "redis" ? "state store (Redis)" : "registry topic (Kafka)") unavailable; try again"
                )
            ),
            ("dependency", .string(dependency)),
        ]
        if let code = (error as? RedisError)?.code { o.append(("code", .string(code.rawValue))) }
        return Response(status: 503, body: Array(JSONValue.object(o).serialized.utf8), headers: ["Retry-After": "1"])
    }

    static func methodNotAllowed(_ allowed: String) -> Response {
        error(405, "method not allowed (allowed: \(allowed))")
    }

    static func error(_ status: Int, _ message: String, field: String? = nil) -> Response {
        var o: [(String, JSONValue)] = [("error", .string(message))]
        if let field { o.append(("field", .string(field))) }
        return Response(status: status, body: Array(JSONValue.object(o).serialized.utf8))
    }

    static func json(total: Int, _ conversations: [String: Int]) -> JSONValue {
        .object([
            ("total", .number(String(total))),
            (
                "conversations",
                .object(conversations.sorted { $0.key < $1.key }.map { ($0.key, .number(String($0.value))) })
            ),
        ])
    }
}
