import Foundation

/// When to make a new provider token (JWT). Apple rejects tokens older than an hour and
/// answers TooManyProviderTokenUpdates to tokens renewed more often than every 20 minutes.
/// The policy is pure: the caller passes the current time from its injected clock.
public struct APNsTokenRenewalPolicy: Sendable, Equatable {
    /// Age after which a token is renewed proactively.
    public var renewAfter: Duration
    /// A token younger than this is never replaced, even when APNs calls it expired.
    public var minimumInterval: Duration

    public init(renewAfter: Duration = .seconds(50 * 60), minimumInterval: Duration = .seconds(20 * 60)) {
        self.renewAfter = renewAfter
        self.minimumInterval = min(minimumInterval, renewAfter)
    }

    public enum Decision: Equatable, Sendable { case keep, renew }

    /// - Parameters:
    ///   - issuedAt: the current token's `iat`, or nil when there is none yet.
    ///   - rejectedAsExpired: APNs answered 403 ExpiredProviderToken to the current token.
    public func decide(issuedAt: Date?, now: Date, rejectedAsExpired: Bool = false) -> Decision {
        guard let issuedAt else { return .renew }
        let age = now.timeIntervalSince(issuedAt)
        if age >= renewAfter.timeInterval { return .renew }
        if rejectedAsExpired && age >= minimumInterval.timeInterval { return .renew }
        return .keep
    }
}
