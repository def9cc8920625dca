import Foundation
import HeraldCore
import Logging

extension StateStore {
    /// Replaces the user's preferences.
    /// Throws `PreferenceLimitError` (writing nothing) when `preferences` go beyond `limits`.
    public func setPreferences(
        app: String, user: String, preferences: Preferences, limits: PreferenceLimits = PreferenceLimits()
    ) async throws {
        if let over = limits.problem(preferences) { throw over }
        let json = Self.encode(preferences)
        try await connection.send(
            RedisCommand("HSET", RedisKeys.userState(app: app, user: user), UserRecord.preferencesField, json)
        ).orThrow("HSET")
    }

    /// Replaces the set of online devices: each token in `online` is online until `now + ttl` (milliseconds);
    /// every other device is offline. The chat server refreshes presence before the TTL passes; when it stops,
    /// the entries expire: reads filter them by the injected `now`. They stay in the user's state hash (a line of
    /// about 80 bytes per online device, at most 80 per user) until the next presence write for the user.
    public func setPresence(
        app: String, user: String, online: [String], ttlMilliseconds: Int64, now: Int64
    ) async throws {
        let key = RedisKeys.userState(app: app, user: user)
        let value = UserRecord.encodeOnline(online, expiry: Saturating.add(now, ttlMilliseconds))
        if value.isEmpty {
            try await connection.send(RedisCommand("HDEL", key, UserRecord.onlineField)).orThrow("HDEL")
        } else {
            try await connection.send(RedisCommand("HSET", key, UserRecord.onlineField, value)).orThrow("HSET")
        }
    }

    /// Marks one device online until `now + ttl` or offline, leaving the user's other devices as they are
    /// (entries already expired at `now` are dropped on the way). Atomic (one script). A token holding a newline
    /// cannot be a device's and changes nothing.
    public func setDevicePresence(
        app: String, user: String, token: String, online: Bool, ttlMilliseconds: Int64, now: Int64
    ) async throws {
        if token.contains("\n") { return }
        try await connection.send(
            RedisCommand(
                "EVAL", Scripts.devicePresence, 1, RedisKeys.userState(app: app, user: user), token,
                online ? UserRecord.onlineExpiry(Saturating.add(now, ttlMilliseconds)) : 0, now)
        ).orThrow("EVAL devicePresence")
    }

    /// Replaces the user's unread counts (total and per conversation). Atomic (one script).
    public func setUnread(app: String, user: String, unread: Unread) async throws {
        var arguments: [any RedisArgument] = [
            Scripts.replaceCounts, 1, RedisKeys.userState(app: app, user: user), RedisKeys.unreadTotalField,
            unread.total,
        ]
        for (conversation, count) in unread.conversations.sorted(by: { $0.key < $1.key }) {
            arguments.append(RedisKeys.unreadField(conversation: conversation))
            arguments.append(count)
        }
        try await connection.send(RedisCommand("EVAL", arguments)).orThrow("EVAL replaceCounts")
    }

    /// Adds `members` to the conversation's members.
    public func addMembers(app: String, conversation: String, members: [String]) async throws {
        guard !members.isEmpty else { return }
        try await connection.send(
            RedisCommand("SADD", [RedisKeys.members(app: app, conversation: conversation)] + members)
        ).orThrow("SADD")
    }

    /// Removes `members` from the conversation's members.
    public func removeMembers(app: String, conversation: String, members: [String]) async throws {
        guard !members.isEmpty else { return }
        try await connection.send(
            RedisCommand("SREM", [RedisKeys.members(app: app, conversation: conversation)] + members)
        ).orThrow("SREM")
    }

    /// Replaces the conversation's members.
    public func setMembers(app: String, conversation: String, members: [String]) async throws {
        let key = RedisKeys.members(app: app, conversation: conversation)
        var commands = [RedisCommand("MULTI"), RedisCommand("DEL", key)]
        if !members.isEmpty { commands.append(RedisCommand("SADD", [key] + members)) }
        commands.append(RedisCommand("EXEC"))
        _ = try Self.execResults(try await connection.pipeline(commands))
    }

    /// Writes a whole state fixture (docs/behaviour.md §3) in one pipelined round trip: every listed user's devices, presence,
    /// preferences and unread counts, and every listed conversation's members, are replaced (users and
    /// conversations not listed are left alone). Online entries get `presenceTTLMilliseconds` from `now`. A user
    /// with more than 20 devices keeps the 20 newest, as registering them one by one would.
    ///
    /// Each user's state hash is replaced in one MULTI/EXEC, and each conversation's members in another: every
    /// transaction touches one hash slot, so the same pipeline works on one node and on a Redis Cluster. The token
    /// owner keys (another slot each) are set outside the transactions; every write is idempotent, so a retried
    /// load converges.
    public func loadFixture(app: String, fixture: StateFixture, presenceTTLMilliseconds: Int64, now: Int64) async throws
    {
        var commands: [RedisCommand] = []
        /// Where each transaction's replies are (MULTI through EXEC).
        var transactions: [Range<Int>] = []
        for (user, declared) in fixture.users.sorted(by: { $0.key < $1.key }) {
            var state = UserState(online: declared.online, preferences: declared.preferences, unread: declared.unread)
            for device in declared.devices { state.register(device) }
            let key = RedisKeys.userState(app: app, user: user)
            let begin = commands.count
            commands.append(RedisCommand("MULTI"))
            commands.append(RedisCommand("DEL", key))
            var fields: [any RedisArgument] = [key, UserRecord.preferencesField, Self.encode(state.preferences)]
            // A fixture that names no unread total leaves it unknown (no badge), as simulate reads it.
            if let total = state.unread.storedTotal {
                fields.append(RedisKeys.unreadTotalField)
                fields.append(total)
            }
            if !state.devices.isEmpty {
                fields.append(UserRecord.devicesField)
                fields.append(UserRecord.encodeDevices(state.devices))
            }
            let online = UserRecord.encodeOnline(state.online, expiry: Saturating.add(now, presenceTTLMilliseconds))
            if !online.isEmpty {
                fields.append(UserRecord.onlineField)
                fields.append(online)
            }
            for (conversation, count) in state.unread.conversations.sorted(by: { $0.key < $1.key }) {
                fields.append(RedisKeys.unreadField(conversation: conversation))
                fields.append(count)
            }
            commands.append(RedisCommand("HSET", fields))
            commands.append(RedisCommand("EXEC"))
            transactions.append(begin..<commands.count)
            for device in state.devices {
                commands.append(RedisCommand("SET", RedisKeys.tokenOwner(app: app, token: device.token), user))
            }
        }
        for (conversation, state) in fixture.conversations.sorted(by: { $0.key < $1.key }) {
            let key = RedisKeys.members(app: app, conversation: conversation)
            let begin = commands.count
            commands.append(RedisCommand("MULTI"))
            commands.append(RedisCommand("DEL", key))
            if !state.members.isEmpty { commands.append(RedisCommand("SADD", [key] + state.members)) }
            commands.append(RedisCommand("EXEC"))
            transactions.append(begin..<commands.count)
        }
        if commands.isEmpty { return }
        let replies = try await connection.pipeline(commands)
        guard replies.count == commands.count else {
            throw RedisError(.unexpectedReply, "expected \(commands.count) replies, got \(replies.count)")
        }
        var inTransaction = [Bool](repeating: false, count: replies.count)
        for range in transactions {
            _ = try Self.execResults(Array(replies[range]))
            for index in range { inTransaction[index] = true }
        }
        for (index, reply) in replies.enumerated() where !inTransaction[index] { try reply.orThrow("SET owner") }
    }
}
