import Foundation
import HeraldCore
import Logging

/// The registry HTTP API (docs/registry-api.md, OpenAPI in docs/registry-api.yaml): JSON over HTTP/1.1, paths
/// under `/v1/apps/{app}/users/{user}/`, a bearer token per calling back end. Transport-free: the stage's
/// HTTP endpoint (HeraldStage `StageHTTPServer`) hands each request to `handle`.
///
/// Writes answer 202 once the record is on herald.registry (herald-registry applies it moments later, in
/// order per user); reads answer from Redis. Errors are `{"error": "...", "field": "..."}`: 400 names the field,
/// 401 a missing or unknown token, 404 an unknown route, 405 a known route with another method, 503 when
/// Kafka or Redis cannot be reached (try again).
public struct RegistryAPI: Sendable {
    /// One calling back end: its name (in logs and metrics) and its bearer token.
    public struct Client: Sendable {
        public var name: String
        public var token: [UInt8]
        public init(name: String, token: String) {
            self.name = name
            self.token = Array(token.utf8)
        }
    }

    public struct Response: Sendable, Equatable {
        public var status: Int
        public var body: [UInt8]
        public init(status: Int, body: [UInt8]) {
            self.status = status
            self.body = body
        }
    }

    public let operations: RegistryOperations
    public let clients: [Client]
    public let logger: Logger
    /// Called once per answered request: the route template (`PATCH /v1/apps/{app}/users/{user}/preferences`, or
    /// `unknown`, `unauthenticated`, `method_not_allowed`: a fixed set, never a value from the request, so a
    /// client cannot grow the metric's label set), the status, and the client's name (`-` when unauthenticated).
    public let onRequest: @Sendable (_ route: String, _ status: Int, _ client: String) -> Void

    public init(
        operations: RegistryOperations, clients: [Client], logger: Logger,
        onRequest: @escaping @Sendable (String, Int, String) -> Void = { _, _, _ in }
    ) {
        self.operations = operations
        self.clients = clients
        self.logger = logger
        self.onRequest = onRequest
    }

    /// Answers one request. `headers` are keyed by lowercased name.
    public func handle(method: String, path: String, headers: [String: String], body: [UInt8]) async -> Response {
        let client = authenticate(headers["authorization"])
        let (route, response) = await answer(method: method, path: path, client: client, body: body)
        onRequest(route, response.status, client ?? "-")
        if response.status >= 500 {
            logger.warning(
                "registry api request failed",
                metadata: ["route": "\(route)", "status": "\(response.status)", "client": "\(client ?? "-")"])
        } else {
            logger.debug(
                "registry api request",
                metadata: ["route": "\(route)", "status": "\(response.status)", "client": "\(client ?? "-")"])
        }
        return response
    }

    /// The client whose token the `Authorization: Bearer` header carries. Every configured token is compared,
    /// each in constant time, so the answer's timing does not tell how much of a guess was right.
    func authenticate(_ header: String?) -> String? {
        guard let header, header.count > 7, header.prefix(7).lowercased() == "bearer " else { return nil }
        let presented = Array(header.utf8.dropFirst(7))
        var found: String?
        for client in clients where Self.constantTimeEqual(presented, client.token) && !client.token.isEmpty {
            found = client.name
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

    private func answer(method: String, path: String, client: String?, body: [UInt8]) async -> (String, Response) {
        let segments = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
            .map { String($0).removingPercentEncoding ?? String($0) }
        guard segments.first == "v1" else { return ("unknown", Self.error(404, "not found")) }
        guard client != nil else {
            return ("unauthenticated", Self.error(401, "missing or unknown bearer token", field: "Authorization"))
        }
        guard segments.count >= 6, segments[1] == "apps", segments[3] == "users", !segments[2].isEmpty,
            !segments[4].isEmpty,
            segments[2].utf8.count <= 256, segments[4].utf8.count <= 256
        else {
            return ("unknown", Self.error(404, "not found"))
        }
        let app = segments[2], user = segments[4]
        let rest = Array(segments.dropFirst(5))
        let base = "/v1/apps/{app}/users/{user}/"
        switch (rest.first ?? "", rest.count) {
        case ("devices", 1):
            switch method {
            case "POST":
                return (
                    "POST \(base)devices",
                    await write { () throws(FieldError) in
                        try RegistryOperations.registerRecord(app: app, user: user, body: body, now: operations.now())
                    }
                )
            case "DELETE":
                return (
                    "DELETE \(base)devices", await write { RegistryRecord(op: .unregisterAll, appID: app, user: user) }
                )
            default: return ("method_not_allowed", Self.methodNotAllowed("POST, DELETE"))
            }
        case ("devices", 2):
            guard method == "DELETE" else { return ("method_not_allowed", Self.methodNotAllowed("DELETE")) }
            let token = rest[1]
            return (
                "DELETE \(base)devices/{token}",
                await write {
                    RegistryRecord(op: .unregisterDevice, appID: app, user: user, token: token)
                }
            )
        case ("preferences", 1):
            switch method {
            case "GET":
                return (
                    "GET \(base)preferences",
                    await read { () async throws -> [UInt8] in
                        try StageCodec.encode(try await operations.preferences(app: app, user: user))
                    }
                )
            case "PATCH":
                return (
                    "PATCH \(base)preferences",
                    await write { () throws(FieldError) in
                        try RegistryOperations.patchRecord(app: app, user: user, body: body)
                    }
                )
            default: return ("method_not_allowed", Self.methodNotAllowed("GET, PATCH"))
            }
        case ("presence", 1):
            guard method == "PUT" else { return ("method_not_allowed", Self.methodNotAllowed("PUT")) }
            return (
                "PUT \(base)presence",
                await write { () throws(FieldError) in
                    try RegistryOperations.presenceRecord(app: app, user: user, body: body)
                }
            )
        case ("read", 1):
            guard method == "POST" else { return ("method_not_allowed", Self.methodNotAllowed("POST")) }
            return (
                "POST \(base)read",
                await write { () throws(FieldError) in
                    try RegistryOperations.markReadRecord(app: app, user: user, body: body)
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
            do {
                guard let decision = try await operations.lastDecision(app: app, user: user) else {
                    return (
                        "GET \(base)explain",
                        Self.error(404, "no decision about this user is kept (never a recipient, or expired)")
                    )
                }
                return ("GET \(base)explain", Response(status: 200, body: Array(decision.serialized.utf8)))
            } catch {
                return ("GET \(base)explain", Self.unavailable(error))
            }
        default:
            return ("unknown", Self.error(404, "not found"))
        }
    }

    /// Builds a record (a `FieldError` is a 400 naming the field), publishes it, answers 202.
    private func write(_ build: () throws(FieldError) -> RegistryRecord) async -> Response {
        let record: RegistryRecord
        do throws(FieldError) {
            record = try build()
        } catch {
            return Self.error(400, error.message, field: error.field)
        }
        if let problem = record.validationError() { return Self.error(400, problem.detail, field: "(body)") }
        do {
            try await operations.sink.publish(record)
        } catch {
            return Self.unavailable(error)
        }
        return Response(
            status: 202,
            body: Array(
                JSONValue.object([
                    ("accepted", .bool(true)), ("op", .string(record.op.rawValue)),
                    ("user", .string(record.user ?? "")),
                ]).serialized.utf8))
    }

    private func read(_ body: () async throws -> [UInt8]) async -> Response {
        do {
            return Response(status: 200, body: try await body())
        } catch {
            return Self.unavailable(error)
        }
    }

    /// 503: Redis or Kafka could not be reached. The message names the failing system and its error code,
    /// never request content.
    static func unavailable(_ error: any Error) -> Response {
        Self.error(
            503, "state store or registry topic unavailable; try again (\(String(describing: error).prefix(200)))")
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
