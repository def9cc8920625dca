// Web Push over HTTP/1.1 (libcurl, HeraldHTTP) for push services that do not speak HTTP/2: the same encrypted body,
// headers and VAPID token as `WebPushClient`, the same answer table.
import Foundation
import HeraldCore
import HeraldHTTP
import Synchronization

/// Sends Web Push messages to push services without HTTP/2: one shared HTTP/1.1 client (connections kept alive per
/// host), a VAPID token per (origin, VAPID key) signed again when half of its lifetime has passed.
public final class WebPushHTTP1Sender: Sendable {
    private let http: HTTP1Client
    private let tokens = Mutex<[String: WebPushVAPIDTokens]>([:])
    private let tokenLifetime: TimeInterval
    private let now: @Sendable () -> Date

    public init(
        trustedCAFile: String? = nil, maxInFlight: Int = 1000, connectTimeout: Duration = .seconds(5),
        tokenLifetime: TimeInterval = WebPushVAPID.defaultLifetime, now: @escaping @Sendable () -> Date = { Date() }
    ) throws(PushError) {
        do {
            http = try HTTP1Client(
                configuration: HTTP1ClientConfiguration(
                    trustedCAFile: trustedCAFile, maxInFlight: maxInFlight, maxConnectionsPerHost: 8,
                    connectTimeout: connectTimeout))
        } catch {
            throw PushError(.io, error.message)
        }
        self.tokenLifetime = min(tokenLifetime, WebPushVAPID.maxLifetime)
        self.now = now
    }

    /// The HTTP/1.1 request of a delivery made by `WebPushClient.delivery` (its device token is the endpoint's
    /// path), to `origin`, signed with `vapid`.
    func request(_ delivery: PushDelivery, origin: String, vapid: WebPushVAPID) throws(PushError) -> HTTPRequest {
        let source = tokens.withLock { tokens in
            let key = origin + " " + vapid.publicKey
            if let found = tokens[key] { return found }
            let made = WebPushVAPIDTokens(vapid: vapid, audience: origin, lifetime: tokenLifetime, now: now)
            tokens[key] = made
            return made
        }
        guard let bearer = try source.currentBearer() else { throw PushError(.credential, "no VAPID token") }
        let seconds = Int64(now().timeIntervalSince1970)
        var headers: [(String, String)] = [
            ("Content-Type", "application/octet-stream"), ("Content-Encoding", "aes128gcm"),
            ("TTL", String(max(0, (delivery.expiration ?? seconds) - seconds))),
            ("Urgency", WebPushPayload.urgency(priority: delivery.priority?.rawValue ?? 5)),
            ("Authorization", source.scheme + bearer.token),
        ]
        if let topic = delivery.collapseID { headers.append(("Topic", topic)) }
        let timeout = max(.milliseconds(1), delivery.deadline - ContinuousClock.now)
        return HTTPRequest(
            url: origin + delivery.deviceToken, headers: headers, body: delivery.payload, timeout: timeout,
            tag: delivery.tag)
    }

    /// Sends deliveries to `origin` (one attempt each, concurrently); `each` gets every outcome, classified by
    /// HeraldCore's `WebPushAnswerTable`, on the calling task, in completion order.
    public func send(
        _ deliveries: [PushDelivery], origin: String, vapid: WebPushVAPID, each: (PushResponse) -> Void
    ) async {
        await withTaskGroup(of: PushResponse.self) { group in
            for delivery in deliveries {
                let request: HTTPRequest
                do {
                    request = try self.request(delivery, origin: origin, vapid: vapid)
                } catch {
                    each(
                        Self.response(
                            tag: delivery.tag, status: nil, body: [], retryAfter: nil,
                            failure: .credentialUnusable("\(error)")))
                    continue
                }
                group.addTask {
                    let response = await self.http.send(request)
                    let failure: PushTransportFailure? =
                        switch response.failure {
                        case nil: nil
                        case .timedOut?: .deadlineExceeded
                        case .connectFailed(let why)?: .connectFailed(why)
                        case .transfer?: .connectionLost
                        case .shutdown?: .clientShutdown
                        }
                    return Self.response(
                        tag: response.tag, status: response.status, body: response.body,
                        retryAfter: response.headers["retry-after"], failure: failure)
                }
            }
            for await response in group { each(response) }
        }
    }

    /// An outcome as the HTTP/2 client reports it: status, the table's class and reason (with the push service's
    /// words), `Retry-After`, or the failure below HTTP.
    static func response(
        tag: UInt64, status: Int?, body: [UInt8], retryAfter: String?, failure: PushTransportFailure?
    ) -> PushResponse {
        guard let status else {
            let f = failure ?? .protocolViolation("no answer")
            return PushResponse(
                tag: tag, status: nil, reason: nil, apnsID: nil, unregisteredAt: nil, transportFailure: f,
                disposition: .permanentFailure(reason: f.description), attempts: 1, reasonText: f.kind)
        }
        let answer = WebPushAnswerTable.classify(status: status)
        var text = WebPushAnswerTable.reasonText(status: status)
        let said = (200..<300).contains(status) ? "" : WebPushAnswerTable.detail(body)
        if !said.isEmpty { text += ": " + said }
        let disposition = BackoffPolicy(maxAttempts: 1).disposition(
            for: answer, reasonText: text, attempt: 1, unit: 0)
        return PushResponse(
            tag: tag, status: status, reason: nil, apnsID: nil, unregisteredAt: nil, transportFailure: nil,
            disposition: disposition, attempts: 1, reasonText: text, answer: answer,
            retryAfter: FCMAnswerTable.retryAfter(retryAfter))
    }

    public func shutdown() async { await http.shutdown() }
}
