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

    // MARK: Devices

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

    // MARK: Preferences, presence, unread, members

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

    // MARK: Idempotency (send): claim, confirm, release

    /// How long a delivery record is kept by default: a copy of a pair replayed within this long after its
    /// delivery is never sent again (the pipeline file's `idempotency.replay_window_seconds`).
    public static let defaultReplayWindowMilliseconds: Int64 = 3_600_000

    /// Claims each (event, token) pair for sending. A pair's record is a field of its shard's hash for one replay
    /// window (`RedisKeys.delivered`): the window its event time falls in when the pair carries one
    /// (`DeliveryPair.eventTime`; every copy of the pair then looks in that hash alone, whenever it is sent), else
    /// the window `now` falls in, and then the previous window's hash is read too. The field's value is one of
    /// `owner`'s claim numbers (`ClaimNumbers`); `confirmDelivered` sets the number's bit in its block's key, and
    /// the record stays as it is. The answer per pair, in order:
    /// - `.claimed`: this call took it (or it was already this owner's): send;
    /// - `.delivered`: a delivery record is there (a number whose bit is set, or `1`): do not send again;
    /// - `.pending(owner:until:)`: another owner's claim that has not lapsed: do not send before `until` (epoch
    ///   ms). A number's claim lapses when its block does (`ClaimNumbers.lifetime` plus the claim TTL after the
    ///   block was taken); its owner is not recorded (empty).
    ///
    /// The common case costs plain commands in one pipelined round trip: per pair an `HSETNX` of its number, per
    /// shard of pairs without an event time an `HMGET` of its pairs in the previous window, and a `PEXPIRE` per
    /// hash when `expiries` says it is due (once a minute per hash and process). Only a pair that finds something
    /// (a record, a claim, a copy replayed across a window's end) is settled by `settleClaims`, in up to three
    /// more round trips.
    public func claim(
        app: String, pairs: [DeliveryPair], owner: String, ttlMilliseconds: Int64,
        now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> [DeliveryClaim] {
        if pairs.isEmpty { return [] }
        let numbers = try await takeClaimNumbers(
            app: app, owner: owner, count: pairs.count, claimTTL: ttlMilliseconds, now: now, window: window)
        let groups = deliveryGroups(pairs, window: window)
        let fields = pairs.map { RedisKeys.deliveredField(eventId: $0.eventID, token: $0.token) }
        var batch = RedisBatch(capacity: 64 + pairs.count * 96 + groups.count * 64)
        var expiring = Set<ExpiryMemo.Key>()
        var expires = [Bool](repeating: false, count: groups.count)
        for (g, group) in groups.enumerated() {
            let current = group.filed ?? now / window
            for index in group.indices {
                batch.command("HSETNX", arguments: 3)
                Self.windowKey(app: app, shard: group.shard, window: current, into: &batch)
                batch.argument(fields[index])
                batch.argument(numbers[index])
            }
            if group.filed == nil {
                batch.command("HMGET", arguments: 1 + group.indices.count)
                Self.windowKey(app: app, shard: group.shard, window: now / window - 1, into: &batch)
                for index in group.indices { batch.argument(fields[index]) }
            }
            expires[g] = expireIfDue(
                app: app, shard: group.shard, period: current, now: now, window: window, into: &batch, &expiring)
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == batch.count else {
            throw RedisError(.unexpectedReply, "claim: expected \(batch.count) replies, got \(replies.count)")
        }
        var out = [DeliveryClaim](repeating: .claimed, count: pairs.count)
        var held = numbers.map { Optional($0) }
        var unsettled: [Int] = []
        var written = [Int64?](repeating: nil, count: pairs.count)
        var next = 0
        for (g, group) in groups.enumerated() {
            var previous: [RedisValue]?
            if group.filed == nil {
                previous = try replies[next + group.indices.count].orThrow("HMGET claim").array ?? []
                guard previous?.count == group.indices.count else {
                    throw RedisError(
                        .unexpectedReply, "claim: HMGET answered \(previous?.count ?? 0) of \(group.indices.count)")
                }
            }
            for (offset, index) in group.indices.enumerated() {
                let wrote = try replies[next + offset].orThrow("HSETNX claim").int == 1
                if wrote { written[index] = numbers[index] }
                if wrote, previous.map({ $0[offset] == .null }) ?? true { continue }
                unsettled.append(index)
            }
            next += group.indices.count + (group.filed == nil ? 1 : 0)
            if expires[g] {
                _ = try replies[next].orThrow("PEXPIRE claim")
                next += 1
            }
        }
        expiries.mark(Array(expiring), now: now)
        if !unsettled.isEmpty {
            let settled = try await settleClaims(
                app: app, pairs: unsettled.map { pairs[$0] }, written: unsettled.map { written[$0] }, owner: owner,
                claimTTL: ttlMilliseconds, now: now, window: window)
            for (index, answer) in zip(unsettled, settled) {
                out[index] = answer.claim
                held[index] = answer.number
            }
        }
        claimNumbers.hold(
            app: app, owner: owner,
            pairs.indices.compactMap { index in out[index] == .claimed ? held[index].map { (pairs[index], $0) } : nil },
            now: now)
        return out
    }

    /// Numbers for `count` claims of `owner`: from its current block, and from new blocks when that runs out or
    /// its lifetime ended. A new block is picked at random and taken with `SET ... NX PX` of its key, one round
    /// trip; a block whose key exists (another process's, within its TTL) is skipped. Random, not counted: a
    /// failover that loses the newest writes cannot hand a block that is in use to a second process, except by
    /// the same pick among 524,287.
    private func takeClaimNumbers(
        app: String, owner: String, count: Int, claimTTL: Int64, now: Int64, window: Int64
    ) async throws -> [Int64] {
        let who = ClaimNumberSource.Owner(app: app, owner: owner)
        var out = claimNumbers.take(who, count: count, claimTTL: claimTTL, now: now)
        var attempts = 0
        while out.count < count {
            attempts += 1
            if attempts > 64 { throw RedisError(.unexpectedReply, "claim numbers: no free block in 64 attempts") }
            let block = Int64.random(in: 1...ClaimNumbers.blockCount)
            let keyTTL = ClaimNumbers.keyTTL(window: window, claimTTL: claimTTL)
            let header = ClaimNumbers.header(lapsesAt: now + ClaimNumbers.lifetime(claimTTL: claimTTL) + claimTTL)
            let taken = try await connection.send(
                RedisCommand("SET", RedisKeys.claimBlock(app: app, block: block), header, "NX", "PX", keyTTL)
            ).orThrow("SET claim block")
            if taken.isNull { continue }
            claimNumbers.install(who, block: block, claimTTL: claimTTL, takenAt: now, keepFor: keyTTL)
            out += claimNumbers.take(who, count: count - out.count, claimTTL: claimTTL, now: now)
        }
        return out
    }

    /// The second step of `claim` for pairs that found something. `written` is the number the first step wrote
    /// into the pair's current window (nil: its `HSETNX` found a value there). Round trips: an `HMGET` per hash
    /// of what both windows hold; a `BITFIELD` per number found (its block's lapse time and the number's bit);
    /// then a compare-and-set script (`Scripts.swapClaim`) per pair it takes over or per claim of this owner it
    /// withdraws. Per pair: a record in either window (`1`, or a number whose bit is set) is `.delivered`; a claim
    /// of another owner that has not lapsed (a number of another owner's block before its lapse time, a
    /// `p:<owner>:<until>` claim before `until`, a value of any other form) is `.pending`; in both cases a claim of
    /// this owner in the current window is withdrawn. Else the pair is this owner's: its claim in the current
    /// window stands, or a new number replaces what is there (nothing, or a lapsed claim), if it is still there.
    private func settleClaims(
        app: String, pairs: [DeliveryPair], written: [Int64?], owner: String, claimTTL: Int64, now: Int64,
        window: Int64
    ) async throws -> [(claim: DeliveryClaim, number: Int64?)] {
        let who = ClaimNumberSource.Owner(app: app, owner: owner)
        let groups = deliveryGroups(pairs, window: window)
        let fields = pairs.map { RedisKeys.deliveredField(eventId: $0.eventID, token: $0.token) }
        // 1. What both windows hold.
        var read = RedisBatch(capacity: 64 + pairs.count * 24 + groups.count * 160)
        for group in groups {
            read.command("HMGET", arguments: 1 + group.indices.count)
            Self.windowKey(app: app, shard: group.shard, window: group.filed ?? now / window, into: &read)
            for index in group.indices { read.argument(fields[index]) }
            if group.filed == nil {
                read.command("HMGET", arguments: 1 + group.indices.count)
                Self.windowKey(app: app, shard: group.shard, window: now / window - 1, into: &read)
                for index in group.indices { read.argument(fields[index]) }
            }
        }
        let replies = try await connection.pipeline(read)
        guard replies.count == read.count else {
            throw RedisError(.unexpectedReply, "claim: expected \(read.count) replies, got \(replies.count)")
        }
        var current = [RedisValue](repeating: .null, count: pairs.count)
        var previous = [RedisValue](repeating: .null, count: pairs.count)
        var next = 0
        func take(_ into: inout [RedisValue], _ group: DeliveryGroup) throws {
            let values = try replies[next].orThrow("HMGET claim").array ?? []
            guard values.count == group.indices.count else {
                throw RedisError(.unexpectedReply, "claim: HMGET answered \(values.count) of \(group.indices.count)")
            }
            for (offset, index) in group.indices.enumerated() { into[index] = values[offset] }
            next += 1
        }
        for group in groups {
            try take(&current, group)
            if group.filed == nil { try take(&previous, group) }
        }
        // 2. The blocks of the numbers found.
        var found: [Int64] = []
        for index in pairs.indices {
            for value in [current[index], previous[index]] {
                if let n = ClaimNumbers.parse(value), n != written[index] { found.append(n) }
            }
        }
        let blocks = try await readClaimNumbers(app: app, found)
        // 3. Judge each pair.
        var out: [(claim: DeliveryClaim, number: Int64?)] = Array(repeating: (.claimed, nil), count: pairs.count)
        var swaps: [(index: Int, group: DeliveryGroup, expected: RedisValue, replacement: Int64?)] = []
        let ownPrefix = DeliveryClaim.pendingPrefix(owner: owner)
        for group in groups {
            for index in group.indices {
                var delivered = false
                var other: DeliveryClaim?
                var ownNumber: Int64?
                var ownHere = false
                for (value, isCurrent) in [(current[index], true), (previous[index], false)] where value != .null {
                    if let n = ClaimNumbers.parse(value) {
                        let block = n == written[index] ? nil : blocks[n]
                        if block?.delivered == true {
                            delivered = true
                        } else if n == written[index] || claimNumbers.isMine(who, number: n) {
                            if isCurrent {
                                ownNumber = n
                                ownHere = true
                            }
                        } else if let block, block.lapsesAt > now {
                            other = other ?? .pending(owner: "", until: block.lapsesAt)
                        }
                        continue
                    }
                    guard let text = value.text else {
                        other = other ?? .pending(owner: "", until: 0)
                        continue
                    }
                    if text == DeliveryClaim.deliveredValue {
                        delivered = true
                    } else if text.hasPrefix(ownPrefix) {
                        if isCurrent { ownHere = true }
                    } else if case .pending(let holder, let until) = DeliveryClaim(stored: text, owner: owner),
                        until > now || until == 0
                    {
                        other = other ?? .pending(owner: holder, until: until)
                    }
                }
                if delivered || other != nil {
                    out[index] = (delivered ? .delivered : other ?? .delivered, nil)
                    if ownHere { swaps.append((index, group, current[index], nil)) }
                } else if let ownNumber {
                    out[index] = (.claimed, ownNumber)
                } else {
                    swaps.append((index, group, current[index], 0))
                }
            }
        }
        if swaps.isEmpty { return out }
        // 4. Take over or withdraw, each only if the field still holds what step 1 read.
        let fresh = try await takeClaimNumbers(
            app: app, owner: owner, count: swaps.filter { $0.replacement != nil }.count, claimTTL: claimTTL,
            now: now, window: window)
        var nextFresh = 0
        for s in swaps.indices where swaps[s].replacement != nil {
            swaps[s].replacement = fresh[nextFresh]
            nextFresh += 1
        }
        let answers = try await Scripts.swapClaim.run(on: connection, what: "claim") { sha in
            var batch = RedisBatch(capacity: 64 + swaps.count * 160)
            for swap in swaps {
                let group = swap.group
                batch.command("EVALSHA", arguments: 7)
                batch.argument(sha)
                batch.argument("1")
                Self.windowKey(app: app, shard: group.shard, window: group.filed ?? now / window, into: &batch)
                batch.argument(fields[swap.index])
                batch.argument(swap.expected.data.map { Array($0) } ?? [])
                batch.argument(swap.replacement.map { String($0) } ?? "")
                batch.argument(2 * window)
            }
            return batch
        }
        for (swap, answer) in zip(swaps, answers) {
            let done = try answer.orThrow("EVALSHA claim").int == 1
            guard let number = swap.replacement else { continue }
            // Another copy changed the field since it was read: wait for a moment and look again.
            out[swap.index] = done ? (.claimed, number) : (.pending(owner: "", until: now), nil)
        }
        return out
    }

    /// Per claim number: its block's lapse time (0 when the block's key is gone) and whether its bit is set. One
    /// pipelined `BITFIELD` per number.
    private func readClaimNumbers(
        app: String, _ numbers: [Int64]
    ) async throws -> [Int64: (lapsesAt: Int64, delivered: Bool)] {
        var unique: [Int64] = []
        var seen = Set<Int64>()
        for n in numbers where seen.insert(n).inserted { unique.append(n) }
        if unique.isEmpty { return [:] }
        var batch = RedisBatch(capacity: 64 + unique.count * 96)
        for n in unique {
            batch.command("BITFIELD", arguments: 7)
            batch.argument(RedisKeys.claimBlock(app: app, block: ClaimNumbers.block(of: n)))
            batch.argument("GET")
            batch.argument("i64")
            batch.argument("0")
            batch.argument("GET")
            batch.argument("u1")
            batch.argument(ClaimNumbers.bit(of: n))
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == unique.count else {
            throw RedisError(.unexpectedReply, "BITFIELD: expected \(unique.count) replies, got \(replies.count)")
        }
        var out: [Int64: (lapsesAt: Int64, delivered: Bool)] = [:]
        for (n, reply) in zip(unique, replies) {
            guard let values = try reply.orThrow("BITFIELD claim").array, values.count == 2 else {
                throw RedisError(.unexpectedReply, "BITFIELD answered \(reply)")
            }
            out[n] = (values[0].int ?? 0, values[1].int == 1)
        }
        return out
    }

    /// Confirms pairs as delivered (after the provider's 200), whoever held the claim. A pair this store claimed
    /// gets its claim number's bit set: one `BITFIELD` per block for all of them, and its record in the shard hash
    /// stays as it is. Any other pair's field becomes `1` in the hash it is filed under (its event time's window,
    /// else the window `now` falls in), that hash living two windows from now: an `HSET` per hash, and a
    /// `PEXPIRE` per hash when `expiries` says it is due. One pipelined round trip.
    public func confirmDelivered(
        app: String, pairs: [DeliveryPair], now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws {
        if pairs.isEmpty { return }
        let held = claimNumbers.letGo(app: app, pairs)
        var bits: [Int64: [Int64]] = [:]
        var blockOrder: [Int64] = []
        var plain: [DeliveryPair] = []
        func setBit(_ n: Int64) {
            let block = ClaimNumbers.block(of: n)
            if bits[block] == nil { blockOrder.append(block) }
            bits[block, default: []].append(ClaimNumbers.bit(of: n))
        }
        for (pair, claims) in zip(pairs, held) {
            guard let claims else {
                plain.append(pair)
                continue
            }
            setBit(claims.first.number)
            for claim in claims.more { setBit(claim.number) }
        }
        var batch = RedisBatch(capacity: 64 + pairs.count * 32)
        for block in blockOrder {
            let offsets = bits[block] ?? []
            batch.command("BITFIELD", arguments: 1 + 4 * offsets.count)
            batch.argument(RedisKeys.claimBlock(app: app, block: block))
            for offset in offsets {
                batch.argument("SET")
                batch.argument("u1")
                batch.argument(offset)
                batch.argument("1")
            }
        }
        var expiring = Set<ExpiryMemo.Key>()
        for group in deliveryGroups(plain, window: window) {
            let filed = group.filed ?? now / window
            batch.command("HSET", arguments: 1 + 2 * group.indices.count)
            Self.windowKey(app: app, shard: group.shard, window: filed, into: &batch)
            for index in group.indices {
                batch.argument(RedisKeys.deliveredField(eventId: plain[index].eventID, token: plain[index].token))
                batch.argument(DeliveryClaim.deliveredValue)
            }
            expireIfDue(
                app: app, shard: group.shard, period: filed, now: now, window: window, into: &batch, &expiring)
        }
        do {
            try await connection.write(batch, what: "confirm")
        } catch {
            claimNumbers.restore(app: app, pairs, held)
            throw error
        }
        expiries.mark(Array(expiring), now: now)
    }

    /// Releases this owner's claims on pairs that were not delivered (the notification went to the retry topic,
    /// the DLQ or token feedback): a field that still holds the number this owner's claim wrote is deleted (in
    /// either window), so a later copy claims the pair at once; a claim of another owner, or a delivery record, is
    /// left alone. One compare-and-delete script per field and window, in one round trip. A pair this store did not
    /// claim for the owner has nothing to release.
    public func releaseClaims(
        app: String, pairs: [DeliveryPair], owner: String, now: Int64,
        window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws {
        if pairs.isEmpty { return }
        let numbers = claimNumbers.letGo(app: app, owner: owner, pairs)
        let releasing = pairs.indices.filter { numbers[$0] != nil }
        if releasing.isEmpty { return }
        let groups = deliveryGroups(releasing.map { pairs[$0] }, window: window)
        do {
            let replies = try await Scripts.swapClaim.run(on: connection, what: "release") { sha in
                var batch = RedisBatch(capacity: 64 + releasing.count * 320)
                for group in groups {
                    let windows = group.filed.map { [$0] } ?? [now / window, now / window - 1]
                    for w in windows {
                        for index in group.indices {
                            let pair = pairs[releasing[index]]
                            batch.command("EVALSHA", arguments: 7)
                            batch.argument(sha)
                            batch.argument("1")
                            Self.windowKey(app: app, shard: group.shard, window: w, into: &batch)
                            batch.argument(RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token))
                            batch.argument(String(numbers[releasing[index]] ?? 0))
                            batch.argument("")
                            batch.argument(2 * window)
                        }
                    }
                }
                return batch
            }
            for reply in replies { _ = try reply.orThrow("EVALSHA release") }
        } catch {
            claimNumbers.hold(
                app: app, owner: owner, releasing.compactMap { i in numbers[i].map { (pairs[i], $0) } }, now: now)
            throw error
        }
    }

    /// Records that the notification of `eventId` was delivered to `token` unless a record or claim is there:
    /// true when this call created the record. (Tools and tests; send uses claim/confirm.)
    public func markDelivered(
        app: String, eventId: String, token: String, now: Int64,
        window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> Bool {
        try await markDelivered(
            app: app, pairs: [DeliveryPair(eventID: eventId, token: token)], now: now, window: window)[0]
    }

    /// The batch form of `markDelivered`: one pipelined round trip, one answer per pair, in order.
    public func markDelivered(
        app: String, pairs: [DeliveryPair], now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> [Bool] {
        let replies = try await Scripts.mark.run(on: connection, what: "mark") { sha in
            var batch = RedisBatch(capacity: 64 + pairs.count * 200)
            for pair in pairs {
                batch.command("EVALSHA", arguments: 6)
                batch.argument(sha)
                batch.argument("2")
                let group = DeliveryGroup(
                    shard: RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards),
                    filed: Self.filedWindow(pair, window: window), indices: [])
                Self.windowKeys(app: app, group: group, now: now, window: window, into: &batch)
                batch.argument(RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token))
                batch.argument(2 * window)
            }
            return batch
        }
        return try replies.map { reply in
            switch try reply.orThrow("EVALSHA mark") {
            case .integer(1): return true
            case .integer(0): return false
            default: throw RedisError(.unexpectedReply, "the mark script answered \(reply)")
            }
        }
    }

    /// Whether each pair has a delivery record (`1`, or a claim number whose bit is set; a claim does not count)
    /// in the hash it is filed under: its event time's window, or (a pair without one) the window `now` falls in or
    /// the one before. One pipelined round trip (one or two `HGET` per pair), and one more (a `BITFIELD` per
    /// number) for the claim numbers found.
    public func wasDelivered(
        app: String, pairs: [DeliveryPair], now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> [Bool] {
        if pairs.isEmpty { return [] }
        var batch = RedisBatch(capacity: 64 + pairs.count * 160)
        var looks: [Int] = []
        for pair in pairs {
            let shard = RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards)
            let field = RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token)
            let windows = Self.filedWindow(pair, window: window).map { [$0] } ?? [now / window, now / window - 1]
            for w in windows {
                batch.command("HGET", arguments: 2)
                Self.windowKey(app: app, shard: shard, window: w, into: &batch)
                batch.argument(field)
            }
            looks.append(windows.count)
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == batch.count else {
            throw RedisError(.unexpectedReply, "expected \(batch.count) replies, got \(replies.count)")
        }
        for reply in replies { try reply.orThrow("HGET") }
        let numbers = try await readClaimNumbers(app: app, replies.compactMap(ClaimNumbers.parse))
        var next = 0
        return looks.map { count in
            defer { next += count }
            return replies[next..<next + count].contains { reply in
                if let n = ClaimNumbers.parse(reply) { return numbers[n]?.delivered == true }
                return reply.text == DeliveryClaim.deliveredValue
            }
        }
    }

    /// Adds the `PEXPIRE` (two windows) of a shard's hash for window `period` when `expiries` says it is due, and
    /// notes its key in `expiring` (to `mark` once the round trip succeeded). True when it added one.
    @discardableResult
    private func expireIfDue(
        app: String, shard: UInt64, period: Int64, now: Int64, window: Int64, into batch: inout RedisBatch,
        _ expiring: inout Set<ExpiryMemo.Key>
    ) -> Bool {
        let key = ExpiryMemo.Key(kind: ExpiryMemo.deliveredKind, app: app, shard: shard, period: period)
        // Pairs without an event time and pairs filed under the current window share a hash: one PEXPIRE does.
        guard !expiring.contains(key), expiries.isDue(key, now: now) else { return false }
        batch.command("PEXPIRE", arguments: 2)
        Self.windowKey(app: app, shard: shard, window: period, into: &batch)
        batch.argument(2 * window)
        expiring.insert(key)
        return true
    }

    /// Pairs grouped by idempotency shard and filing window (in the order they first appear), so each script
    /// touches one slot. `filed` is the window a group's records are filed under when its pairs carry their event's
    /// time (`DeliveryPair.eventTime`), nil for pairs filed under the window of the send.
    func deliveryGroups(_ pairs: [DeliveryPair], window: Int64) -> [DeliveryGroup] {
        var groups = IndexGroups<DeliveryGroup.Key>(capacity: pairs.count)
        var last: (event: String, time: Int64?, group: Int)?
        for (index, pair) in pairs.enumerated() {
            // Pairs of one event mostly come one after another: only a change of event hashes again.
            if let last, last.event == pair.eventID, last.time == pair.eventTime {
                groups.add(index, toGroup: last.group)
                continue
            }
            let key = DeliveryGroup.Key(
                shard: RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards),
                filed: Self.filedWindow(pair, window: window))
            last = (pair.eventID, pair.eventTime, groups.add(index, to: key))
        }
        return zip(groups.keys, groups.members()).map { key, indices in
            DeliveryGroup(shard: key.shard, filed: key.filed, indices: indices)
        }
    }

    /// The window a pair's record is filed under whenever it is sent: its event time's, when it has one.
    static func filedWindow(_ pair: DeliveryPair, window: Int64) -> Int64? {
        guard let time = pair.eventTime, time >= 0 else { return nil }
        return time / window
    }

    /// `RedisKeys.delivered(app:shard:window:)` as one argument.
    static func windowKey(app: String, shard: UInt64, window: Int64, into batch: inout RedisBatch) {
        batch.argument(RedisKeys.prefix, ":", app, ":delivered:{d", String(shard), "}:", String(window))
    }

    /// The two keys a group's scripts read, as two arguments: the hash its records are filed under twice, or the
    /// hashes of the window `now` falls in and of the one before.
    static func windowKeys(
        app: String, group: DeliveryGroup, now: Int64, window: Int64, into batch: inout RedisBatch
    ) {
        let current = group.filed ?? now / window
        windowKey(app: app, shard: group.shard, window: current, into: &batch)
        windowKey(app: app, shard: group.shard, window: group.filed ?? now / window - 1, into: &batch)
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

    private static func array(_ reply: RedisValue) throws -> [RedisValue] {
        if reply.isNull { return [] }
        guard let values = reply.array else { throw RedisError(.unexpectedReply, "expected an array, got \(reply)") }
        return values
    }

    private static func strings(_ reply: RedisValue) throws -> [String] {
        try array(reply).map { value in
            guard let text = value.text else { throw RedisError(.unexpectedReply, "expected a string, got \(value)") }
            return text
        }
    }

    /// The EXEC reply of a `MULTI ... EXEC` pipeline, with any queued-command error surfaced.
    private static func execResults(_ replies: [RedisValue]) throws -> [RedisValue] {
        for reply in replies.dropLast() { try reply.orThrow("MULTI") }
        guard let exec = replies.last else { throw RedisError(.unexpectedReply, "no EXEC reply") }
        let results = try array(exec.orThrow("EXEC"))
        for result in results { try result.orThrow("EXEC") }
        return results
    }

    /// The stored form of a device or preferences: HeraldCore's JSON (the fixture shape, docs/redis-keys.md).
    private static func encode<T: JSONRecord>(_ value: T) -> [UInt8] { value.jsonBytes() }
}

/// A Lua script run with EVALSHA, so its text is not sent and hashed again with every call: loaded with
/// `SCRIPT LOAD` on first use, and again when the server answers NOSCRIPT (it restarted, or its script cache was
/// flushed), after which the batch is sent once more.
final class LoadedScript: Sendable {
    let body: String
    private let sha = Mutex<String?>(nil)

    init(_ body: String) { self.body = body }

    /// Sends the batch `build` makes with the script's SHA1 and returns its replies.
    func run(
        on connection: RedisConnection, what: String, _ build: (String) -> RedisBatch
    ) async throws -> [RedisValue] {
        for attempt in 0..<2 {
            let known = try await load(on: connection)
            let batch = build(known)
            let replies = try await connection.pipeline(batch)
            guard replies.count == batch.count else {
                throw RedisError(.unexpectedReply, "\(what): expected \(batch.count) replies, got \(replies.count)")
            }
            let unknown = replies.contains {
                if case .error(let message) = $0 { return message.hasPrefix("NOSCRIPT") }
                return false
            }
            if !unknown || attempt == 1 { return replies }
            sha.withLock { $0 = nil }
        }
        return []
    }

    /// The script's SHA1, loading the script first when this process has not yet, or, with `again`, in any case (a
    /// node answered NOSCRIPT: another caller may have loaded it meanwhile, on another server).
    func load(on connection: RedisConnection, again: Bool = false) async throws -> String {
        if !again, let known = sha.withLock({ $0 }) { return known }
        let reply = try await connection.send(RedisCommand("SCRIPT", "LOAD", body)).orThrow("SCRIPT LOAD")
        guard let text = reply.text else { throw RedisError(.unexpectedReply, "SCRIPT LOAD answered \(reply)") }
        sha.withLock { $0 = text }
        return text
    }
}

/// What a claim found (see `StateStore.claim`).
public enum DeliveryClaim: Sendable, Hashable {
    case claimed
    case delivered
    case pending(owner: String, until: Int64)

    static let deliveredValue = "1"

    static func pendingPrefix(owner: String) -> String { "p:\(owner):" }

    /// Reads a stored value; a claim of `owner` itself counts as claimed (an earlier attempt of this process).
    init(stored: String, owner: String) {
        if stored == Self.deliveredValue {
            self = .delivered
            return
        }
        if stored.hasPrefix(Self.pendingPrefix(owner: owner)) {
            self = .claimed
            return
        }
        // p:<owner>:<until>; anything else (an unknown value) is treated as a claim that expires with its TTL.
        let parts = stored.split(separator: ":")
        if parts.count >= 3, parts[0] == "p", let until = Int64(parts[parts.count - 1]) {
            self = .pending(owner: parts[1..<(parts.count - 1)].joined(separator: ":"), until: until)
        } else {
            self = .pending(owner: "", until: 0)
        }
    }
}

/// The Lua scripts, run with EVAL (Redis runs a script atomically).
enum Scripts {
    /// KEYS: a delivery-record hash. ARGV: field, the value it must hold (empty: none), the value to write (empty:
    /// delete the field), the hash's TTL (ms, set when it has none). Compare and set: 1 when the field held the
    /// expected value and was changed, 0 when it held something else.
    static let swapClaim = LoadedScript(
        """
        local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
        if cur ~= ARGV[2] then return 0 end
        if ARGV[3] == '' then
          if cur ~= '' then redis.call('HDEL', KEYS[1], ARGV[1]) end
          return 1
        end
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
        if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
        return 1
        """)

    /// KEYS: this window's and the previous window's idempotency hash. ARGV: field, TTL (ms). Writes a delivery
    /// record unless either window holds anything for the field; 1 when it wrote one.
    static let mark = LoadedScript(
        """
        if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
          return 0
        end
        redis.call('HSET', KEYS[1], ARGV[1], '1')
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return 1
        """)

    /// KEYS: the owner key. ARGV: user. Deletes the key when it still names that user.
    static let releaseOwner = """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """

    /// Lua helpers over a user's state hash (`UserRecord`), put in front of the scripts that change devices or
    /// presence. `devices(key)`: the `d` field's lines as {line, token, at, kind} (a line that does not decode has
    /// token nil, `registered_at` 0 and kind `apns`); `put_devices(key, list)` writes them back (or deletes the
    /// field when none are left); `drop_online(key, gone, now)` removes the `o` lines of the tokens in the set
    /// `gone` and, with `now`, those expired at `now`.
    static let userHelpers = """
        local function devices(key)
          local out = {}
          local raw = redis.call('HGET', key, 'd')
          if not raw then return out end
          for line in string.gmatch(raw, '[^\\n]+') do
            local entry = {line = line, at = 0, kind = 'apns'}
            local ok, device = pcall(cjson.decode, line)
            if ok and type(device) == 'table' then
              if type(device['token']) == 'string' then entry.token = device['token'] end
              if tonumber(device['registered_at']) then entry.at = tonumber(device['registered_at']) end
              if type(device['kind']) == 'string' then entry.kind = device['kind'] end
            end
            out[#out + 1] = entry
          end
          return out
        end
        local function put_devices(key, list)
          local lines = {}
          for _, entry in ipairs(list) do lines[#lines + 1] = entry.line end
          if #lines == 0 then redis.call('HDEL', key, 'd') else redis.call('HSET', key, 'd', table.concat(lines, '\\n')) end
        end
        local function drop_online(key, gone, now)
          local raw = redis.call('HGET', key, 'o')
          if not raw then return end
          local kept = {}
          for line in string.gmatch(raw, '[^\\n]+') do
            local expiry, token = string.match(line, '^(%d+) (.*)$')
            local live = expiry ~= nil and not gone[token] and (now == nil or tonumber(expiry) > now)
            if live then kept[#kept + 1] = line end
          end
          if #kept == 0 then redis.call('HDEL', key, 'o') else redis.call('HSET', key, 'o', table.concat(kept, '\\n')) end
        end

        """

    /// KEYS: the user's state hash. ARGV: token, device JSON, max devices per kind, the device's kind, unique (1:
    /// remove every other device of that kind), the device's `registered_at`. The entry replaces the token's
    /// earlier one; a stored line that does not decode is dropped. Returns the evicted tokens.
    static let register =
        userHelpers + """
            local max = tonumber(ARGV[3])
            local unique = ARGV[5] == '1'
            local list = {}
            for _, entry in ipairs(devices(KEYS[1])) do
              if entry.token ~= nil and entry.token ~= ARGV[1] then list[#list + 1] = entry end
            end
            list[#list + 1] = {line = ARGV[2], token = ARGV[1], at = tonumber(ARGV[6]) or 0, kind = ARGV[4], newest = 1}
            local same = {}
            for _, entry in ipairs(list) do
              if entry.kind == ARGV[4] and not (unique and entry.newest == 1) then same[#same + 1] = entry end
            end
            if unique then max = 0 end
            local evicted = {}
            if #same > max then
              table.sort(same, function(a, b)
                if a.at ~= b.at then return a.at < b.at end
                if (a.newest or 0) ~= (b.newest or 0) then return (a.newest or 0) < (b.newest or 0) end
                return a.token < b.token
              end)
              local gone = {}
              for i = 1, #same - max do
                gone[same[i].token] = true
                evicted[#evicted + 1] = same[i].token
              end
              local kept = {}
              for _, entry in ipairs(list) do
                if not gone[entry.token] then kept[#kept + 1] = entry end
              end
              list = kept
              drop_online(KEYS[1], gone, nil)
            end
            put_devices(KEYS[1], list)
            return evicted
            """

    /// KEYS: the user's state hash. ARGV: token. Removes the device and its presence line. Returns 1 when the
    /// device was registered, else 0.
    static let unregister =
        userHelpers + """
            local list = {}
            local found = 0
            for _, entry in ipairs(devices(KEYS[1])) do
              if entry.token == ARGV[1] then found = 1 else list[#list + 1] = entry end
            end
            if found == 1 then put_devices(KEYS[1], list) end
            drop_online(KEYS[1], {[ARGV[1]] = true}, nil)
            return found
            """

    /// KEYS: the user's state hash. Removes every device and the presence; returns the devices' tokens.
    static let unregisterAll =
        userHelpers + """
            local tokens = {}
            for _, entry in ipairs(devices(KEYS[1])) do
              if entry.token ~= nil then tokens[#tokens + 1] = entry.token end
            end
            redis.call('HDEL', KEYS[1], 'd', 'o')
            return tokens
            """

    /// KEYS: the user's state hash. ARGV: token, dead-since (ms).
    /// Returns 1 removed, -1 kept (registered after dead-since), 0 not registered.
    static let removeDead =
        userHelpers + """
            local list = {}
            local found = nil
            for _, entry in ipairs(devices(KEYS[1])) do
              if entry.token == ARGV[1] then found = entry else list[#list + 1] = entry end
            end
            if found == nil then return 0 end
            if found.at > tonumber(ARGV[2]) then return -1 end
            put_devices(KEYS[1], list)
            drop_online(KEYS[1], {[ARGV[1]] = true}, nil)
            return 1
            """

    /// KEYS: the user's state hash. ARGV: token, its new expiry (ms; 0: offline), now (ms). Lines expired at now
    /// are dropped too.
    static let devicePresence =
        userHelpers + """
            drop_online(KEYS[1], {[ARGV[1]] = true}, tonumber(ARGV[3]))
            if ARGV[2] ~= '0' then
              local raw = redis.call('HGET', KEYS[1], 'o')
              local line = ARGV[2] .. ' ' .. ARGV[1]
              if raw then line = raw .. '\\n' .. line end
              redis.call('HSET', KEYS[1], 'o', line)
            end
            return 1
            """

    /// KEYS: the user's state hash. ARGV: field, count pairs. The `total` and `c:` fields are replaced by these.
    static let replaceCounts =
        CountScripts.dropCounts + """
            drop_counts(KEYS[1])
            redis.call('HSET', KEYS[1], unpack(ARGV))
            return 1
            """
}

/// Pairs of one idempotency hash: a shard, and the window the records are filed under (nil: the window of the
/// send, with the previous one read too).
struct DeliveryGroup {
    struct Key: Hashable {
        var shard: UInt64
        var filed: Int64?
    }
    var shard: UInt64
    var filed: Int64?
    /// The positions of the group's pairs among those grouped, ascending (a slice of one array for all groups).
    var indices: ArraySlice<Int>
}
