import Foundation
import HeraldCore
import Logging
import Synchronization

/// An APNs client for one credential and environment: a pool of persistent HTTP/2 connections
/// driven by its own I/O thread (nghttp2 session API over OpenSSL, poll loop, one TLS write per
/// loop pass). Hand it requests one at a time (`send`) or in batches (`submit`, `responses`);
/// at most `maxInFlight` requests are accepted at once and the submitting task waits beyond that.
///
/// Transparent resends (do not count as attempts): REFUSED_STREAM, streams above a GOAWAY's
/// last-stream-id, requests not yet written when a connection broke. Retryable answers and
/// in-flight losses are retried per `configuration.retry` within each request's deadline; 403
/// ExpiredProviderToken renews the JWT (per the renewal policy) and retries.
///
/// The process must ignore SIGPIPE (executables do it at start-up, docs/architecture.md): OpenSSL writes with
/// write(2), and a write to a connection APNs reset would otherwise kill the process.
public final class APNsClient: Sendable {
    public let configuration: APNsClientConfiguration
    private let loop: ClientLoop

    /// Validates the credential (loads the key or certificate), starts the I/O thread and
    /// begins opening `configuration.connections` connections.
    public init(configuration: APNsClientConfiguration, logger: Logger = Logger(label: "herald.apns")) throws(PushError)
    {
        self.configuration = configuration
        let tls = try TLSContext(credential: configuration.credential, trustedCAFile: configuration.trustedCAFile)
        var bearer: APNsTokenProvider?
        if case .token(let keyID, let teamID, let pem) = configuration.credential {
            let jwt = try APNsJWT(keyID: keyID, teamID: teamID, p8PEM: pem)
            bearer = APNsTokenProvider(jwt: jwt, policy: configuration.tokenRenewal, now: configuration.now)
        }
        self.loop = try ClientLoop(
            config: configuration.pool, endpoint: configuration.resolvedEndpoint, tls: tls, logger: logger,
            bearer: bearer)
        loop.start()
    }

    /// A client dropped without `shutdown` still ends its I/O thread (failing what is left).
    deinit { loop.requestStop() }

    /// Sends one notification and waits for its final outcome.
    public func send(_ request: PushDelivery) async -> PushResponse { await loop.send(request) }

    /// Accepts a batch; `onComplete` is called once per request, on the client's I/O thread
    /// (keep it short: count, yield to a stream, resume a continuation). Returns once every
    /// request is accepted, which waits while `maxInFlight` requests are outstanding.
    public func submit(_ requests: [PushDelivery], onComplete: @escaping @Sendable (PushResponse) -> Void) async {
        await loop.submit(requests, path: nil, onComplete: onComplete)
    }

    /// Counters so far.
    public var stats: PushClientStats { loop.stats }

    /// Stops accepting requests, lets those in flight finish for up to `grace`, fails the rest
    /// with `clientShutdown`, closes the connections and ends the I/O thread.
    public func shutdown(grace: Duration = .seconds(5)) async {
        await loop.stop(drainFor: grace)
    }
}

/// A client that takes batches of requests and answers each through a callback (APNs, FCM): the stream form of
/// its answers is written once, here.
public protocol BatchPushClient: Sendable {
    func submit(_ requests: [PushDelivery], onComplete: @escaping @Sendable (PushResponse) -> Void) async
}

extension BatchPushClient {
    /// Sends a batch and hands each final outcome to `each` on the calling task, in completion order (match by
    /// `tag`); returns after the last one. The answers that arrive while `each` runs are taken together, so a
    /// busy sender wakes once per run of answers, not once per answer as through an `AsyncStream` (whose
    /// generic buffer cost herald-send about 6 % of its CPU).
    public func answers(for requests: [PushDelivery], each: (PushResponse) -> Void) async {
        if requests.isEmpty { return }
        let inbox = ResponseInbox(expecting: requests.count)
        async let submitted: Void = submit(requests) { inbox.put($0) }
        while true {
            let arrived = await inbox.take()
            if arrived.isEmpty { break }
            for response in arrived { each(response) }
        }
        await submitted
    }

    /// Sends a batch and yields each final outcome as it arrives (in completion order; match by `tag`). The
    /// stream finishes after the last one.
    public func responses(for requests: [PushDelivery]) -> AsyncStream<PushResponse> {
        let (stream, continuation) = AsyncStream<PushResponse>.makeStream()
        Task {
            await self.answers(for: requests) { continuation.yield($0) }
            continuation.finish()
        }
        return stream
    }
}

/// The answers of one batch on their way from a client's I/O thread (`put`) to the task that sent it (`take`).
final class ResponseInbox: Sendable {
    private struct State {
        var arrived: [PushResponse] = []
        var remaining: Int
        var waiter: UnsafeContinuation<[PushResponse], Never>?
    }
    private let state: Mutex<State>

    init(expecting count: Int) { state = Mutex(State(remaining: count)) }

    /// One answer; wakes the taker when it waits.
    func put(_ response: PushResponse) {
        let wake: (UnsafeContinuation<[PushResponse], Never>, [PushResponse])? = state.withLock { s in
            s.arrived.append(response)
            s.remaining -= 1
            guard let waiter = s.waiter else { return nil }
            s.waiter = nil
            defer { s.arrived = [] }
            return (waiter, s.arrived)
        }
        if let (waiter, arrived) = wake { waiter.resume(returning: arrived) }
    }

    /// Every answer not taken yet, waiting for one when there is none; empty once all have been taken.
    func take() async -> [PushResponse] {
        await withUnsafeContinuation { continuation in
            let ready: [PushResponse]? = state.withLock { s in
                if !s.arrived.isEmpty {
                    defer { s.arrived = [] }
                    return s.arrived
                }
                if s.remaining <= 0 { return [] }
                s.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

extension APNsClient: BatchPushClient {}
