import Foundation
import HeraldCore
import Logging
import Synchronization

/// Herald's per-app user state in Redis, in the key layout of `RedisKeys` (docs/redis-keys.md).
///
/// A user's devices, presence, preferences and unread counts are one hash (`UserRecord`). Reads for a batch of
/// recipients are one pipelined round trip (`loadUsers`), one command per user. Writes that read before they write
/// (register with eviction, dead-token removal, presence of one device) run as Lua scripts, which Redis runs
/// atomically; replacements run inside MULTI/EXEC. Every script and every transaction touches the keys of one user or
/// one conversation (one Redis Cluster hash slot, through the keys' hash tags); steps that span slots (the token
/// owner key) are separate and idempotent. Every method throws `RedisError`; when `isRetryable` is true
/// the connection broke and the caller retries (all writes here are idempotent).
///
/// Timestamps are milliseconds since the epoch and are always passed in (`now`), never read from a clock.
public final class StateStore: Sendable {
    public let connection: RedisConnection
    let logger: Logger
    /// The delivery-record shard keys whose TTL this store set lately (`ExpiryMemo`).
    let expiries = ExpiryMemo()
    /// The blocks of claim numbers this store took and the numbers its claims hold (`ClaimNumbers`).
    let claimNumbers = ClaimNumberSource()
    /// References to shared burst events given back, waiting for the next burst round trip (`BurstEventReleases`).
    let burstReleases = BurstEventReleases()

    /// Shards of the idempotency records per replay window (`idempotency.shards`, docs/redis-keys.md).
    public let deliveredShards: UInt64

    public init(
        connection: RedisConnection, logger: Logger = Logger(label: "herald.redis.state"),
        deliveredShards: UInt64 = RedisKeys.deliveredShards
    ) {
        self.connection = connection
        self.logger = logger
        self.deliveredShards = max(1, deliveredShards)
    }

    // MARK: Reads

    /// Loads devices, online devices (presence entries not expired at `now`), preferences and unread counts for
    /// every user in one pipelined round trip, one command per user (their state hash, `UserRecord`). The unread
    /// counts hold the total and:
    /// - with `conversationsOf` (parallel to `users`), the counts of user i's listed conversations only, read with
    ///   `HMGET` (a user listed twice gets both lists);
    /// - without, every conversation's count (`HGETALL`: a user in a thousand conversations answers them all, so
    ///   the stages never ask for this).
    ///
    /// Users with nothing stored get an empty `UserState` (no devices). Devices come oldest first (by
    /// `registered_at`, then token); online tokens in device order. A stored device line that is not a valid device
    /// is skipped with a warning; stored preferences that are not valid JSON fall back to the defaults with a warning
    /// (neither can crash a stage).
    ///
    /// With `conversationsOf`, the preferences hold the listed conversations' settings only (the
    /// others are checked but not built). Users in `preferencesOnly` (and not in `users`) get only their
    /// preferences read (one `HGET`), without any conversation's settings: resolve needs no more of a sender than
    /// their display name. Their state has no devices, no presence and no unread counts.
    public func loadUsers(
        app: String, users: [String], now: Int64, preferencesOnly: [String] = [], conversationsOf: [[String]]? = nil
    ) async throws -> [String: UserState] {
        var unique: [String] = []
        var scopes: [[String]]?
        var light: [String] = []
        if let conversationsOf {
            var position: [String: Int] = Dictionary(minimumCapacity: users.count + preferencesOnly.count)
            var lists: [[String]] = []
            lists.reserveCapacity(users.count)
            for (index, user) in users.enumerated() {
                let listed = index < conversationsOf.count ? conversationsOf[index] : []
                if let at = position[user] {
                    for id in listed where !lists[at].contains(id) { lists[at].append(id) }
                } else {
                    position[user] = unique.count
                    unique.append(user)
                    lists.append(listed)
                }
            }
            scopes = lists
            for user in preferencesOnly where position[user] == nil {
                position[user] = -1
                light.append(user)
            }
        } else {
            var seen = Set<String>()
            for user in users where seen.insert(user).inserted { unique.append(user) }
            for user in preferencesOnly where seen.insert(user).inserted { light.append(user) }
        }
        if unique.isEmpty && light.isEmpty { return [:] }

        let replies = try await connection.pipelineFlat(
            Self.loadBatch(app: app, users: unique, unreadOf: scopes, preferencesOnly: light))
        let expected = unique.count + light.count
        guard replies.count == expected else {
            throw RedisError(.unexpectedReply, "expected \(expected) replies, got \(replies.count)")
        }

        var result: [String: UserState] = [:]
        result.reserveCapacity(unique.count + light.count)
        for (index, user) in unique.enumerated() {
            if let scopes {
                // Read in place: a recipient's reply costs no allocation of its own.
                let reply = replies[index]
                try replies.orThrow(reply, "HMGET")
                let values = replies.elementCount(reply) ?? 0
                guard values == 4 + scopes[index].count else {
                    throw RedisError(.unexpectedReply, "HMGET answered \(values) values")
                }
                var counts: [String: Int] = [:]
                var position = 0
                replies.forEachElement(reply) { field in
                    defer { position += 1 }
                    if position >= 4, let count = replies.int(field) {
                        counts[scopes[index][position - 4]] = Int(count)
                    }
                }
                let unread = Unread(
                    total: replies.int(replies.element(reply, 3)).map { Int($0) }, conversations: counts)
                result[user] = decodeState(
                    in: replies, devices: replies.element(reply, 0), online: replies.element(reply, 1),
                    preferences: replies.element(reply, 2), unread: unread, user: user,
                    conversations: scopes[index], now: now)
            } else {
                let reply = replies[index]
                try replies.orThrow(reply, "HGETALL")
                var devices: RedisReplies.Reply?
                var online: RedisReplies.Reply?
                var preferences: RedisReplies.Reply?
                var unread = Unread()
                // Field, value, field, value, ...; an odd last element is left out.
                var field: String?
                var isValue = false
                replies.forEachElement(reply) { element in
                    defer { isValue.toggle() }
                    guard isValue else {
                        field = replies.text(element)
                        return
                    }
                    switch field {
                    case UserRecord.devicesField?: devices = element
                    case UserRecord.onlineField?: online = element
                    case UserRecord.preferencesField?: preferences = element
                    case let name?:
                        _ = CountFields.read(
                            name, replies.value(element), total: &unread.storedTotal,
                            conversations: &unread.conversations)
                    case nil: break
                    }
                }
                result[user] = decodeState(
                    in: replies, devices: devices, online: online, preferences: preferences, unread: unread,
                    user: user, conversations: nil, now: now)
            }
        }
        for (index, user) in light.enumerated() {
            let reply = replies[unique.count + index]
            try replies.orThrow(reply, "HGET")
            let preferences =
                replies.withBytes(reply) { decodePreferences($0, user: user, conversations: []) } ?? Preferences()
            result[user] = UserState(preferences: preferences)
        }
        return result
    }

    /// One user's state from the stored fields of their state hash (nil: not stored), read in place.
    private func decodeState(
        in replies: RedisReplies, devices: RedisReplies.Reply?, online: RedisReplies.Reply?,
        preferences: RedisReplies.Reply?, unread: Unread, user: String, conversations: [String]?, now: Int64
    ) -> UserState {
        let stored = devices.flatMap { replies.withBytes($0) { decodeDevices($0, user: user) } } ?? []
        let onlineTokens =
            online.flatMap { replies.withBytes($0) { decodeOnline($0, devices: stored, now: now) } } ?? []
        let prefs =
            preferences.flatMap {
                replies.withBytes($0) { decodePreferences($0, user: user, conversations: conversations) }
            } ?? Preferences()
        return UserState(devices: stored, online: onlineTokens, preferences: prefs, unread: unread)
    }

    /// The devices of a `d` field, oldest first (by `registered_at`, then token).
    private func decodeDevices(_ field: UnsafeRawBufferPointer, user: String) -> [Device] {
        var stored = UserRecord.decodeDevices(field) { start in
            logger.warning(
                "skipping a stored device that is not valid JSON", metadata: ["user": "\(user)", "entry": "\(start)…"])
        }
        stored.sort { ($0.registeredAt, $0.token) < ($1.registeredAt, $1.token) }
        return stored
    }

    /// The tokens of an `o` field online at `now`: the registered ones in device order, then any others sorted.
    private func decodeOnline(_ field: UnsafeRawBufferPointer, devices: [Device], now: Int64) -> [String] {
        let onlineSet = Set(UserRecord.decodeOnline(field, now: now))
        if onlineSet.isEmpty { return [] }
        let registered = devices.map(\.token)
        return registered.filter { onlineSet.contains($0) } + onlineSet.subtracting(registered).sorted()
    }

    /// `loadUsers`' reads, written straight into one batch: per user one `HMGET` of their state hash (devices,
    /// presence, preferences, the unread total and `c:<conversation>` for each of `unreadOf`'s conversations), or
    /// `HGETALL` of it without `unreadOf`; then `HGET` of the preferences per preferences-only user. (Tests compare
    /// it with the same commands built one by one.)
    public static func loadBatch(
        app: String, users: [String], unreadOf: [[String]]?, preferencesOnly: [String]
    ) -> RedisBatch {
        var batch = RedisBatch(capacity: 64 + users.count * 160 + preferencesOnly.count * 64)
        for (index, user) in users.enumerated() {
            if let unreadOf {
                let conversations = index < unreadOf.count ? unreadOf[index] : []
                batch.command("HMGET", arguments: 5 + conversations.count)
                batch.userKey(app: app, user: user, .state)
                batch.arguments(encoded: Self.stateFields, count: 4)
                for id in conversations { batch.argument("c:", id) }
            } else {
                batch.command("HGETALL", arguments: 1)
                batch.userKey(app: app, user: user, .state)
            }
        }
        for user in preferencesOnly {
            batch.command("HGET", arguments: 2)
            batch.userKey(app: app, user: user, .state)
            batch.argument(UserRecord.preferencesField)
        }
        return batch
    }

    /// One page of each conversation's members (`SSCAN <members key> <cursor> COUNT <count>`), pipelined in one
    /// round trip: the page's members, sorted, and the cursor of the next page ("0" after the last one). A small
    /// set comes back whole with cursor 0. (Read in place: a page costs a string per member and its array.)
    public func memberPages(
        _ conversations: [(app: String, conversation: String)], cursors: [String], count: Int
    ) async throws -> [(members: [String], next: String)] {
        guard conversations.count == cursors.count else {
            throw RedisError(.unexpectedReply, "\(conversations.count) conversations, \(cursors.count) cursors")
        }
        if conversations.isEmpty { return [] }
        var batch = RedisBatch(capacity: 96 * conversations.count)
        for (conversation, cursor) in zip(conversations, cursors) {
            batch.command("SSCAN", arguments: 4)
            batch.membersKey(app: conversation.app, conversation: conversation.conversation)
            batch.argument(cursor)
            batch.argument("COUNT")
            batch.argument(Int64(count))
        }
        let replies = try await connection.pipelineFlat(batch)
        guard replies.count == conversations.count else {
            throw RedisError(.unexpectedReply, "expected \(conversations.count) replies, got \(replies.count)")
        }
        var pages: [(members: [String], next: String)] = []
        pages.reserveCapacity(replies.count)
        for index in 0..<replies.count {
            let reply = replies[index]
            try replies.orThrow(reply, "SSCAN")
            guard replies.elementCount(reply) == 2, let next = replies.text(replies.element(reply, 0)),
                let items = replies.elementCount(replies.element(reply, 1))
            else {
                throw RedisError(.unexpectedReply, "SSCAN answered \(replies.value(reply))")
            }
            var members: [String] = []
            members.reserveCapacity(items)
            replies.forEachElement(replies.element(reply, 1)) { item in
                if let member = replies.text(item) { members.append(member) }
            }
            members.sort()
            pages.append((members, next))
        }
        return pages
    }

    /// The fields every `HMGET` of `loadBatch` reads first (devices, presence, preferences, the unread total), as
    /// the four bulk strings they are on the wire.
    private static let stateFields: [UInt8] = {
        var fields: [UInt8] = []
        for field in [
            UserRecord.devicesField, UserRecord.onlineField, UserRecord.preferencesField,
            RedisKeys.unreadTotalField,
        ] {
            RESP.appendBulk(field, to: &fields)
        }
        return fields
    }()

    /// One user's state (all unread conversations); `loadUsers` for a batch.
    public func loadUser(app: String, user: String, now: Int64) async throws -> UserState {
        try await loadUsers(app: app, users: [user], now: now)[user] ?? UserState()
    }

    /// The conversation's members, sorted (a set in Redis).
    public func members(app: String, conversation: String) async throws -> [String] {
        let reply = try await connection.send(
            RedisCommand("SMEMBERS", RedisKeys.members(app: app, conversation: conversation))
        ).orThrow("SMEMBERS")
        return try Self.strings(reply).sorted()
    }

    // MARK: Decoding

    /// With `conversations`, only their settings are built (`Preferences.fromJSON(_:conversations:)`).
    private func decodePreferences(
        _ stored: UnsafeRawBufferPointer, user: String, conversations: [String]?
    ) -> Preferences {
        do {
            return try Preferences.fromStoredJSON(stored, conversations: conversations)
        } catch {
            logger.warning(
                "stored preferences are not valid; using defaults", metadata: ["user": "\(user)", "error": "\(error)"])
            return Preferences()
        }
    }

    static func array(_ reply: RedisValue) throws -> [RedisValue] {
        if reply.isNull { return [] }
        guard let values = reply.array else { throw RedisError(.unexpectedReply, "expected an array, got \(reply)") }
        return values
    }

    static func strings(_ reply: RedisValue) throws -> [String] {
        try array(reply).map { value in
            guard let text = value.text else { throw RedisError(.unexpectedReply, "expected a string, got \(value)") }
            return text
        }
    }

    /// The EXEC reply of a `MULTI ... EXEC` pipeline, with any queued-command error surfaced.
    static func execResults(_ replies: [RedisValue]) throws -> [RedisValue] {
        for reply in replies.dropLast() { try reply.orThrow("MULTI") }
        guard let exec = replies.last else { throw RedisError(.unexpectedReply, "no EXEC reply") }
        let results = try array(exec.orThrow("EXEC"))
        for result in results { try result.orThrow("EXEC") }
        return results
    }

    /// The stored form of a device or preferences: HeraldCore's JSON (the fixture shape, docs/redis-keys.md).
    static func encode<T: JSONRecord>(_ value: T) -> [UInt8] { value.jsonBytes() }
}
