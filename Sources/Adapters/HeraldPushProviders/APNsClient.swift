import Foundation
import HeraldCore
import Logging

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
    public init(configuration: APNsClientConfiguration, logger: Logger = Logger(label: "herald.apns")) throws(APNsError)
    {
        self.configuration = configuration
        self.loop = try ClientLoop(config: configuration, logger: logger)
        loop.start()
    }

    /// A client dropped without `shutdown` still ends its I/O thread (failing what is left).
    deinit { loop.requestStop() }

    /// Sends one notification and waits for its final outcome.
    public func send(_ request: APNsDelivery) async -> APNsResponse {
        _ = await loop.gate.acquire(upTo: 1, prioritized: request.prioritized)
        return await withCheckedContinuation { continuation in
            loop.enqueue([Job(request: request) { continuation.resume(returning: $0) }])
        }
    }

    /// Accepts a batch; `onComplete` is called once per request, on the client's I/O thread
    /// (keep it short: count, yield to a stream, resume a continuation). Returns once every
    /// request is accepted, which waits while `maxInFlight` requests are outstanding.
    public func submit(_ requests: [APNsDelivery], onComplete: @escaping @Sendable (APNsResponse) -> Void) async {
        await loop.submit(requests, path: nil, onComplete: onComplete)
    }

    /// Counters so far.
    public var stats: APNsClientStats { loop.stats }

    /// Stops accepting requests, lets those in flight finish for up to `grace`, fails the rest
    /// with `clientShutdown`, closes the connections and ends the I/O thread.
    public func shutdown(grace: Duration = .seconds(5)) async {
        await loop.stop(drainFor: grace)
    }
}

/// A client that takes batches of requests and answers each through a callback (APNs, FCM): the stream form of
/// its answers is written once, here.
public protocol BatchPushClient: Sendable {
    func submit(_ requests: [APNsDelivery], onComplete: @escaping @Sendable (APNsResponse) -> Void) async
}

extension BatchPushClient {
    /// Sends a batch and yields each final outcome as it arrives (in completion order; match by `tag`). The
    /// stream finishes after the last one.
    public func responses(for requests: [APNsDelivery]) -> AsyncStream<APNsResponse> {
        let (stream, continuation) = AsyncStream<APNsResponse>.makeStream()
        let remaining = Countdown(requests.count)
        if requests.isEmpty { continuation.finish() }
        Task {
            await self.submit(requests) { response in
                continuation.yield(response)
                if remaining.tick() { continuation.finish() }
            }
        }
        return stream
    }
}

extension APNsClient: BatchPushClient {}
