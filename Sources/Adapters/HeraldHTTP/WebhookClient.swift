import Foundation
import HeraldCore

/// Where one webhook provider's POSTs go.
public struct WebhookEndpoint: Sendable, Hashable {
    public var url: String
    public var username: String?
    public var password: String?

    public init(url: String, username: String? = nil, password: String? = nil) {
        self.url = url; self.username = username; self.password = password
    }

    /// The endpoint for a configured webhook; the password comes from `password_env` (in `environment`)
    /// or the inline one. Nil with a reason when `password_env` names an unset variable.
    public static func resolve(
        _ hook: WebhookCredential,
        environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> Result<WebhookEndpoint, HTTPError> {
        var password = hook.password
        if let name = hook.passwordEnv {
            guard let value = environment[name] else {
                return .failure(
                    HTTPError("environment variable \(name) (the password of webhook \(hook.providerID)) is not set"))
            }
            password = value
        }
        return .success(WebhookEndpoint(url: hook.url, username: hook.username, password: password))
    }
}

/// What a webhook answered, classified by HeraldCore's `WebhookAnswerTable`.
public struct WebhookOutcome: Sendable, Equatable {
    public var status: Int?
    public var failure: HTTPResponse.Failure?
    public var answer: PushAnswerClass
    /// `HTTP503`, `TimedOut`, ...; empty when delivered.
    public var reasonText: String
}

/// Custom webhook delivery: one HTTPS POST (JSON) per rendered webhook request, Basic authentication
/// when configured, a 2-second answer deadline, connections kept alive per host and many requests in
/// flight (libcurl multi over HTTP/1.1). No retries here: send retries through `herald.retry`.
public final class WebhookClient: Sendable {
    private let http: HTTP1Client
    public let timeout: Duration

    public init(
        configuration: HTTP1ClientConfiguration = HTTP1ClientConfiguration(), timeout: Duration = .seconds(2)
    ) throws(HTTPError) {
        http = try HTTP1Client(configuration: configuration)
        self.timeout = timeout
    }

    /// The HTTP request for one rendered webhook notification.
    public func request(_ rendered: PushRequest, to endpoint: WebhookEndpoint, tag: UInt64 = 0) -> HTTPRequest {
        var auth: (user: String, password: String)?
        if let user = endpoint.username { auth = (user, endpoint.password ?? "") }
        return HTTPRequest(
            url: endpoint.url, headers: [("Content-Type", "application/json")], body: rendered.payload,
            timeout: timeout, basicAuth: auth, tag: tag)
    }

    /// Sends every request; `onAnswer(tag, outcome)` runs once per request on the client's thread.
    /// Returns after the last answer.
    public func send(_ requests: [HTTPRequest], onAnswer: @escaping @Sendable (UInt64, WebhookOutcome) -> Void) async {
        if requests.isEmpty { return }
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let left = Countdown(requests.count)
            Task {
                await http.submit(requests) { response in
                    onAnswer(response.tag, Self.outcome(response))
                    if left.tick() { done.resume() }
                }
            }
        }
    }

    public func send(_ request: HTTPRequest) async -> WebhookOutcome { Self.outcome(await http.send(request)) }

    public var stats: HTTP1ClientStats { http.stats }

    public func shutdown() async { await http.shutdown() }

    static func outcome(_ r: HTTPResponse) -> WebhookOutcome {
        if let status = r.status {
            return WebhookOutcome(
                status: status, failure: nil, answer: WebhookAnswerTable.classify(status: status),
                reasonText: WebhookAnswerTable.reasonText(status: status))
        }
        let failure = r.failure ?? .transfer("no answer")
        let transport: PushTransportFailure
        switch failure {
        case .timedOut: transport = .deadlineExceeded
        case .connectFailed(let why): transport = .connectFailed(why)
        case .transfer: transport = .connectionLost
        case .shutdown: transport = .clientShutdown
        }
        let name: String
        switch failure {
        case .timedOut: name = "TimedOut"
        case .connectFailed: name = "ConnectFailed"
        case .transfer: name = "TransferFailed"
        case .shutdown: name = "ClientShutdown"
        }
        return WebhookOutcome(
            status: nil, failure: failure, answer: WebhookAnswerTable.classify(transport), reasonText: name)
    }
}
