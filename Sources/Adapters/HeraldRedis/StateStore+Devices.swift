import Foundation
import HeraldCore
import Logging

extension StateStore {
    /// What `registerDeviceReporting` did besides storing the device.
    public struct Registration: Sendable, Hashable {
        /// Tokens of the same user removed by the cap or by `unique`.
        public var evicted: [String]
        /// The user the token was registered to before (it has been removed there), if another one.
        public var movedFrom: String?
    }

    /// Registers a device or, when its token is already registered, replaces the stored entry. When the user
    /// then holds more than `Device.maxPerUser` (20) devices of the device's kind, the oldest of that kind by
    /// `registered_at` are removed (ties: the device being registered counts as newest, then by token) together
    /// with their presence entries; with `unique` every other device of that kind is removed. Atomic per user
    /// (one Lua script). Returns the evicted tokens.
    @discardableResult
    public func registerDevice(app: String, user: String, device: Device, unique: Bool = false) async throws -> [String]
    {
        try await registerDeviceReporting(app: app, user: user, device: device, unique: unique).evicted
    }

    /// `registerDevice`, and one owner per token: the token -> owner key (`RedisKeys.tokenOwner`) is set to
    /// `user` first; when it named another user, the token (and its presence) is removed from that user. Three
    /// steps, each idempotent, so a retried record converges (they touch different Cluster slots, so they cannot
    /// be one script). Owner keys of evicted tokens are deleted when they still name `user`.
    public func registerDeviceReporting(
        app: String, user: String, device: Device,
        unique: Bool = false
    ) async throws -> Registration {
        let ownerKey = RedisKeys.tokenOwner(app: app, token: device.token)
        let previous = try await connection.send(RedisCommand("SET", ownerKey, user, "GET")).orThrow("SET owner")
        var movedFrom: String?
        if let old = previous.text, old != user {
            try await connection.send(
                RedisCommand("EVAL", Scripts.unregister, 1, RedisKeys.userState(app: app, user: old), device.token)
            ).orThrow("EVAL unregister")
            movedFrom = old
        }
        let json = Self.encode(device)
        let reply = try await connection.send(
            RedisCommand(
                "EVAL", Scripts.register, 1, RedisKeys.userState(app: app, user: user),
                device.token, json, Device.maxPerUser, device.kind.rawValue, unique ? 1 : 0, device.registeredAt)
        ).orThrow("EVAL register")
        let evicted = try Self.strings(reply)
        try await releaseOwners(app: app, user: user, tokens: evicted)
        return Registration(evicted: evicted, movedFrom: movedFrom)
    }

    /// Deletes the owner keys of `tokens` that still name `user` (one pipelined round trip).
    func releaseOwners(app: String, user: String, tokens: [String]) async throws {
        if tokens.isEmpty { return }
        let replies = try await connection.pipeline(
            tokens.map {
                RedisCommand("EVAL", Scripts.releaseOwner, 1, RedisKeys.tokenOwner(app: app, token: $0), user)
            })
        for r in replies { _ = try r.orThrow("EVAL releaseOwner") }
    }

    /// The user a token is registered to in `app`, if any (tools, tests).
    public func owner(app: String, token: String) async throws -> String? {
        try await connection.send(RedisCommand("GET", RedisKeys.tokenOwner(app: app, token: token))).orThrow(
            "GET owner"
        ).text
    }

    /// Removes one device and its presence entry. Returns whether it was registered.
    @discardableResult
    public func unregisterDevice(app: String, user: String, token: String) async throws -> Bool {
        let reply = try await connection.send(
            RedisCommand("EVAL", Scripts.unregister, 1, RedisKeys.userState(app: app, user: user), token)
        ).orThrow("EVAL unregister")
        try await releaseOwners(app: app, user: user, tokens: [token])
        return (reply.int ?? 0) > 0
    }

    /// Removes every device of the user and the user's presence. Returns how many devices were registered.
    @discardableResult
    public func unregisterAll(app: String, user: String) async throws -> Int {
        let reply = try await connection.send(
            RedisCommand("EVAL", Scripts.unregisterAll, 1, RedisKeys.userState(app: app, user: user))
        ).orThrow("EVAL unregisterAll")
        let tokens = try Self.strings(reply)
        try await releaseOwners(app: app, user: user, tokens: tokens)
        return tokens.count
    }

    /// What `removeDeadToken` did.
    public enum DeadTokenOutcome: String, Sendable, Hashable {
        /// The token was registered at or before the dead-since time and has been removed.
        case removed
        /// The token was registered again after the dead-since time: kept.
        case keptReregistered = "kept_reregistered"
        /// The token was not registered (already removed).
        case notRegistered = "not_registered"
    }

    /// Removes a token APNs reported dead (410 / BadDeviceToken / DeviceTokenNotForTopic) unless the device was
    /// registered again after `deadSince` (its `registered_at` is later): atomic, so a registration racing with
    /// the removal either happens before (and wins, if newer) or after (and re-adds the device).
    @discardableResult
    public func removeDeadToken(
        app: String, user: String, token: String, deadSince: Int64
    ) async throws -> DeadTokenOutcome {
        let reply = try await connection.send(
            RedisCommand(
                "EVAL", Scripts.removeDead, 1, RedisKeys.userState(app: app, user: user), token, deadSince)
        ).orThrow("EVAL removeDead")
        switch reply.int {
        case 1:
            try await releaseOwners(app: app, user: user, tokens: [token])
            return .removed
        case -1: return .keptReregistered
        case 0: return .notRegistered
        default: throw RedisError(.unexpectedReply, "dead-token script answered \(reply)")
        }
    }
}
