import Foundation
import HeraldCore
import Logging
import Synchronization

/// Herald's per-app user state in Redis, in the key layout of `RedisKeys` (docs/redis-keys.md).
///
/// Reads for a batch of recipients are one pipelined round trip (`loadUsers`). Writes that must not interleave
/// with others (register with eviction, dead-token removal) run as Lua scripts, which Redis runs atomically;
/// multi-key replacements run inside MULTI/EXEC. Every script and every transaction touches the keys of one user or
/// one conversation (one Redis Cluster hash slot, through the keys' hash tags); steps that span slots (the token
/// owner key) are separate and idempotent. Every method throws `RedisError`; when `isRetryable` is true
/// the connection broke and the caller retries (all writes here are idempotent).
///
/// Timestamps are milliseconds since the epoch and are always passed in (`now`), never read from a clock.
public final class StateStore: Sendable {
    public let connection: RedisConnection
    private let logger: Logger
    /// The delivery-record shard keys whose TTL this store set lately (`ExpiryMemo`).
    let expiries = ExpiryMemo()

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
    /// every user in one pipelined round trip (4 commands per user). The unread counts hold the total and:
    /// - with `conversationsOf` (parallel to `users`), the counts of user i's listed conversations only, read with
    ///   `HMGET` (a user listed twice gets both lists);
    /// - without, every conversation's count (`HGETALL`: a user in a thousand conversations answers them all, so
    ///   the stages never ask for this).
    ///
    /// Users with nothing stored get an empty `UserState` (no devices). Devices come oldest first (by
    /// `registered_at`, then token); online tokens in device order. A stored device entry that is not valid JSON
    /// is skipped with a warning; stored preferences that are not valid JSON fall back to the defaults with a
    /// warning (neither can crash a stage).
    ///
    /// With `conversationsOf`, the preferences hold the listed conversations' settings only (the
    /// others are checked but not built). Users in `preferencesOnly` (and not in `users`) get only their
    /// preferences read (one `GET`), without any conversation's settings: resolve needs no more of a sender than
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

        let replies = try await connection.pipeline(
            Self.loadBatch(app: app, users: unique, unreadOf: scopes, now: now, preferencesOnly: light))
        let expected = unique.count * 4 + light.count
        guard replies.count == expected else {
            throw RedisError(.unexpectedReply, "expected \(expected) replies, got \(replies.count)")
        }

        var result: [String: UserState] = [:]
        result.reserveCapacity(unique.count + light.count)
        for (index, user) in unique.enumerated() {
            let base = index * 4
            let devices = try decodeDevices(replies[base], user: user)
            let onlineSet = Set(try Self.strings(replies[base + 1].orThrow("ZRANGEBYSCORE")))
            let registered = devices.map(\.token)
            let online = registered.filter { onlineSet.contains($0) } + onlineSet.subtracting(registered).sorted()
            let preferences = try decodePreferences(
                replies[base + 2].orThrow("GET"), user: user, conversations: scopes?[index])
            let unread: Unread
            if let scopes {
                let values = try Self.array(replies[base + 3].orThrow("HMGET"))
                var counts: [String: Int] = [:]
                for (offset, id) in scopes[index].enumerated() where offset + 1 < values.count {
                    if let count = values[offset + 1].int { counts[id] = Int(count) }
                }
                unread = Unread(total: values.first?.int.map { Int($0) } ?? 0, conversations: counts)
            } else {
                unread = try Self.decodeUnread(replies[base + 3].orThrow("HGETALL"))
            }
            result[user] = UserState(devices: devices, online: online, preferences: preferences, unread: unread)
        }
        let lightBase = unique.count * 4
        for (index, user) in light.enumerated() {
            let preferences = try decodePreferences(
                replies[lightBase + index].orThrow("GET"), user: user, conversations: [])
            result[user] = UserState(preferences: preferences)
        }
        return result
    }

    /// `loadUsers`' reads, written straight into one batch: per user `HGETALL devices`, `ZRANGEBYSCORE presence
    /// (now +inf`, `GET prefs`, and `HMGET unread total c:<conversation> ...` with `unreadOf` (user i's
    /// conversations) or `HGETALL unread` without; then `GET prefs` per preferences-only user. (Tests compare it
    /// with the same commands built one by one.)
    public static func loadBatch(
        app: String, users: [String], unreadOf: [[String]]?, now: Int64, preferencesOnly: [String]
    ) -> RedisBatch {
        var batch = RedisBatch(capacity: 64 + users.count * 320 + preferencesOnly.count * 64)
        let after = "(\(now)"
        for (index, user) in users.enumerated() {
            batch.command("HGETALL", arguments: 1)
            batch.userKey(app: app, user: user, .devices)
            batch.command("ZRANGEBYSCORE", arguments: 3)
            batch.userKey(app: app, user: user, .presence)
            batch.argument(after)
            batch.argument("+inf")
            batch.command("GET", arguments: 1)
            batch.userKey(app: app, user: user, .preferences)
            if let unreadOf {
                let conversations = index < unreadOf.count ? unreadOf[index] : []
                batch.command("HMGET", arguments: 2 + conversations.count)
                batch.userKey(app: app, user: user, .unread)
                batch.argument(RedisKeys.unreadTotalField)
                for id in conversations { batch.argument("c:", id) }
            } else {
                batch.command("HGETALL", arguments: 1)
                batch.userKey(app: app, user: user, .unread)
            }
        }
        for user in preferencesOnly {
            batch.command("GET", arguments: 1)
            batch.userKey(app: app, user: user, .preferences)
        }
        return batch
    }

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
            let replies = try await connection.pipeline([
                RedisCommand("MULTI"),
                RedisCommand("HDEL", RedisKeys.devices(app: app, user: old), device.token),
                RedisCommand("ZREM", RedisKeys.presence(app: app, user: old), device.token),
                RedisCommand("EXEC"),
            ])
            _ = try Self.execResults(replies)
            movedFrom = old
        }
        let json = Self.encode(device)
        let reply = try await connection.send(
            RedisCommand(
                "EVAL", Scripts.register, 2,
                RedisKeys.devices(app: app, user: user), RedisKeys.presence(app: app, user: user),
                device.token, json, Device.maxPerUser, device.kind.rawValue, unique ? 1 : 0)
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
        let replies = try await connection.pipeline([
            RedisCommand("MULTI"),
            RedisCommand("HDEL", RedisKeys.devices(app: app, user: user), token),
            RedisCommand("ZREM", RedisKeys.presence(app: app, user: user), token),
            RedisCommand("EXEC"),
        ])
        let exec = try Self.execResults(replies)
        try await releaseOwners(app: app, user: user, tokens: [token])
        return (exec.first?.int ?? 0) > 0
    }

    /// Removes every device of the user and the user's presence. Returns how many devices were registered.
    @discardableResult
    public func unregisterAll(app: String, user: String) async throws -> Int {
        let replies = try await connection.pipeline([
            RedisCommand("MULTI"),
            RedisCommand("HKEYS", RedisKeys.devices(app: app, user: user)),
            RedisCommand("DEL", RedisKeys.devices(app: app, user: user), RedisKeys.presence(app: app, user: user)),
            RedisCommand("EXEC"),
        ])
        let exec = try Self.execResults(replies)
        let tokens = try exec.first.map(Self.strings) ?? []
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
                "EVAL", Scripts.removeDead, 2,
                RedisKeys.devices(app: app, user: user), RedisKeys.presence(app: app, user: user),
                token, deadSince)
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
        try await connection.send(RedisCommand("SET", RedisKeys.preferences(app: app, user: user), json)).orThrow("SET")
    }

    /// Replaces the set of online devices: each token in `online` is online until `now + ttl` (milliseconds);
    /// every other device is offline. The chat server refreshes presence before the TTL passes; when it stops,
    /// the entries expire: reads filter the entries by the injected `now`, and the key itself gets a relative TTL
    /// of `ttl` on Redis's own clock so an abandoned user's presence also disappears from memory.
    public func setPresence(
        app: String, user: String, online: [String], ttlMilliseconds: Int64, now: Int64
    ) async throws {
        let key = RedisKeys.presence(app: app, user: user)
        var commands = [RedisCommand("MULTI"), RedisCommand("DEL", key)]
        if !online.isEmpty {
            let expiry = now + ttlMilliseconds
            var arguments: [any RedisArgument] = [key]
            for token in online { arguments.append(expiry); arguments.append(token) }
            commands.append(RedisCommand("ZADD", arguments))
            commands.append(RedisCommand("PEXPIRE", key, ttlMilliseconds))
        }
        commands.append(RedisCommand("EXEC"))
        _ = try Self.execResults(try await connection.pipeline(commands))
    }

    /// Marks one device online until `now + ttl` or offline, leaving the user's other devices as they are.
    public func setDevicePresence(
        app: String, user: String, token: String, online: Bool, ttlMilliseconds: Int64, now: Int64
    ) async throws {
        let key = RedisKeys.presence(app: app, user: user)
        var commands = [RedisCommand("MULTI"), RedisCommand("ZREMRANGEBYSCORE", key, "-inf", now)]
        if online {
            let expiry = now + ttlMilliseconds
            commands.append(RedisCommand("ZADD", key, expiry, token))
            commands.append(RedisCommand("PEXPIRE", key, ttlMilliseconds, "GT"))
            commands.append(RedisCommand("PEXPIRE", key, ttlMilliseconds, "NX"))
        } else {
            commands.append(RedisCommand("ZREM", key, token))
        }
        commands.append(RedisCommand("EXEC"))
        _ = try Self.execResults(try await connection.pipeline(commands))
    }

    /// Replaces the user's unread counts (total and per conversation).
    public func setUnread(app: String, user: String, unread: Unread) async throws {
        let key = RedisKeys.unread(app: app, user: user)
        var arguments: [any RedisArgument] = [key, RedisKeys.unreadTotalField, unread.total]
        for (conversation, count) in unread.conversations.sorted(by: { $0.key < $1.key }) {
            arguments.append(RedisKeys.unreadField(conversation: conversation))
            arguments.append(count)
        }
        _ = try Self.execResults(
            try await connection.pipeline([
                RedisCommand("MULTI"), RedisCommand("DEL", key), RedisCommand("HSET", arguments), RedisCommand("EXEC"),
            ]))
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
    /// Each user's keys are replaced in one MULTI/EXEC, and each conversation's members in another: every
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
            let devicesKey = RedisKeys.devices(app: app, user: user)
            let presenceKey = RedisKeys.presence(app: app, user: user)
            let unreadKey = RedisKeys.unread(app: app, user: user)
            let begin = commands.count
            commands.append(RedisCommand("MULTI"))
            commands.append(
                RedisCommand("DEL", devicesKey, presenceKey, unreadKey, RedisKeys.preferences(app: app, user: user)))
            if !state.devices.isEmpty {
                var arguments: [any RedisArgument] = [devicesKey]
                for device in state.devices { arguments.append(device.token); arguments.append(Self.encode(device)) }
                commands.append(RedisCommand("HSET", arguments))
            }
            if !state.online.isEmpty {
                let expiry = now + presenceTTLMilliseconds
                var arguments: [any RedisArgument] = [presenceKey]
                for token in state.online { arguments.append(expiry); arguments.append(token) }
                commands.append(RedisCommand("ZADD", arguments))
                commands.append(RedisCommand("PEXPIRE", presenceKey, presenceTTLMilliseconds))
            }
            commands.append(
                RedisCommand("SET", RedisKeys.preferences(app: app, user: user), Self.encode(state.preferences)))
            var unreadArguments: [any RedisArgument] = [unreadKey, RedisKeys.unreadTotalField, state.unread.total]
            for (conversation, count) in state.unread.conversations.sorted(by: { $0.key < $1.key }) {
                unreadArguments.append(RedisKeys.unreadField(conversation: conversation))
                unreadArguments.append(count)
            }
            commands.append(RedisCommand("HSET", unreadArguments))
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

    /// Claims each (event, token) pair for sending. A pair's record is a field of its shard's hash for the replay
    /// window that `now` falls in (`RedisKeys.delivered`); this window's and the previous one's are read. The answer
    /// per pair, in order:
    /// - `.claimed`: this call took it (or it was already this owner's): send. The field becomes
    ///   `p:<owner>:<now + ttlMilliseconds>`;
    /// - `.delivered`: a delivery record (`1`) is there: do not send again;
    /// - `.pending(owner:until:)`: another owner claimed it and has not confirmed it yet: do not send before
    ///   `until` (epoch ms), when the claim lapses unless it was confirmed or released.
    ///
    /// The common case costs plain commands in one pipelined round trip: per pair an `HSETNX` of the claim into
    /// this window, per shard an `HMGET` of its pairs in the previous window and a `PEXPIRE` when `expiries` says it
    /// is due (once a minute per shard key and process). Only a pair that finds something
    /// there (a record, a claim, a copy replayed across a window's end) is settled by a second round trip, one Lua
    /// script per shard (`Scripts.claim`), which judges what it found and withdraws a claim the first step wrote
    /// over a record of the previous window.
    public func claim(
        app: String, pairs: [DeliveryPair], owner: String, ttlMilliseconds: Int64,
        now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> [DeliveryClaim] {
        if pairs.isEmpty { return [] }
        let value = DeliveryClaim.pendingValue(owner: owner, until: now + ttlMilliseconds)
        let groups = deliveryGroups(pairs)
        let fields = pairs.map { RedisKeys.deliveredField(eventId: $0.eventID, token: $0.token) }
        var batch = RedisBatch(capacity: 64 + pairs.count * 120 + groups.count * 64)
        var expiring: [ExpiryMemo.Key] = []
        for group in groups {
            for index in group.indices {
                batch.command("HSETNX", arguments: 3)
                Self.windowKey(app: app, shard: group.shard, window: now / window, into: &batch)
                batch.argument(fields[index])
                batch.argument(value)
            }
            batch.command("HMGET", arguments: 1 + group.indices.count)
            Self.windowKey(app: app, shard: group.shard, window: now / window - 1, into: &batch)
            for index in group.indices { batch.argument(fields[index]) }
            expireIfDue(app: app, shard: group.shard, now: now, window: window, into: &batch, &expiring)
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == batch.count else {
            throw RedisError(.unexpectedReply, "claim: expected \(batch.count) replies, got \(replies.count)")
        }
        var out = [DeliveryClaim](repeating: .claimed, count: pairs.count)
        var unsettled: [Int] = []
        var next = 0
        var expired = 0
        for group in groups {
            let previous = try replies[next + group.indices.count].orThrow("HMGET claim").array ?? []
            guard previous.count == group.indices.count else {
                throw RedisError(.unexpectedReply, "claim: HMGET answered \(previous.count) of \(group.indices.count)")
            }
            for (offset, index) in group.indices.enumerated() {
                let wrote = try replies[next + offset].orThrow("HSETNX claim").int == 1
                if case .null = previous[offset], wrote { continue }
                unsettled.append(index)
            }
            next += group.indices.count + 1
            if expired < expiring.count, expiring[expired].shard == group.shard {
                _ = try replies[next].orThrow("PEXPIRE claim")
                next += 1
                expired += 1
            }
        }
        expiries.mark(expiring, now: now)
        if unsettled.isEmpty { return out }
        let settled = try await settleClaims(
            app: app, pairs: unsettled.map { pairs[$0] }, owner: owner, value: value, now: now, window: window)
        for (index, answer) in zip(unsettled, settled) { out[index] = answer }
        return out
    }

    /// The second step of `claim` for pairs that found something: one script per shard.
    private func settleClaims(
        app: String, pairs: [DeliveryPair], owner: String, value: String, now: Int64, window: Int64
    ) async throws -> [DeliveryClaim] {
        let prefix = DeliveryClaim.pendingPrefix(owner: owner)
        let groups = deliveryGroups(pairs)
        let fields = pairs.map { RedisKeys.deliveredField(eventId: $0.eventID, token: $0.token) }
        let replies = try await Scripts.claim.run(on: connection, what: "claim") { sha in
            var batch = RedisBatch(capacity: 128 + pairs.count * 40 + groups.count * 160)
            for group in groups {
                batch.command("EVALSHA", arguments: 8 + group.indices.count)
                batch.argument(sha)
                batch.argument("2")
                Self.windowKeys(app: app, shard: group.shard, now: now, window: window, into: &batch)
                batch.argument(prefix)
                batch.argument(value)
                batch.argument(now)
                batch.argument(2 * window)
                for index in group.indices { batch.argument(fields[index]) }
            }
            return batch
        }
        var out = [DeliveryClaim](repeating: .claimed, count: pairs.count)
        for (group, reply) in zip(groups, replies) {
            guard let answers = try reply.orThrow("EVALSHA claim").array, answers.count == group.indices.count else {
                throw RedisError(.unexpectedReply, "the claim script answered \(reply)")
            }
            for (index, answer) in zip(group.indices, answers) {
                switch answer {
                case .integer(0): out[index] = .claimed
                case .integer(1): out[index] = .delivered
                default:
                    guard let text = answer.text else {
                        throw RedisError(.unexpectedReply, "the claim script answered \(answer)")
                    }
                    out[index] = DeliveryClaim(stored: text, owner: owner)
                }
            }
        }
        return out
    }

    /// Confirms pairs as delivered (after the provider's 200): each field becomes `1` in the window `now` falls in,
    /// whoever held the claim, and that window's hash lives two windows from now. One pipelined round trip: an
    /// `HSET` of every pair of a shard and, when `expiries` says it is due, a `PEXPIRE` per shard.
    public func confirmDelivered(
        app: String, pairs: [DeliveryPair], now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws {
        if pairs.isEmpty { return }
        var batch = RedisBatch(capacity: 64 + pairs.count * 32)
        var expiring: [ExpiryMemo.Key] = []
        for group in deliveryGroups(pairs) {
            batch.command("HSET", arguments: 1 + 2 * group.indices.count)
            Self.windowKey(app: app, shard: group.shard, window: now / window, into: &batch)
            for index in group.indices {
                batch.argument(RedisKeys.deliveredField(eventId: pairs[index].eventID, token: pairs[index].token))
                batch.argument(DeliveryClaim.deliveredValue)
            }
            expireIfDue(app: app, shard: group.shard, now: now, window: window, into: &batch, &expiring)
        }
        try await connection.write(batch, what: "HSET")
        expiries.mark(expiring, now: now)
    }

    /// Releases this owner's claims on pairs that were not delivered (the notification went to the retry topic,
    /// the DLQ or token feedback): a claim of another owner, or a delivery record, is left alone. One script per
    /// shard, in one round trip.
    public func releaseClaims(
        app: String, pairs: [DeliveryPair], owner: String, now: Int64,
        window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws {
        if pairs.isEmpty { return }
        let groups = deliveryGroups(pairs)
        let replies = try await Scripts.release.run(on: connection, what: "release") { sha in
            var batch = RedisBatch(capacity: 64 + pairs.count * 40 + groups.count * 160)
            for group in groups {
                batch.command("EVALSHA", arguments: 5 + group.indices.count)
                batch.argument(sha)
                batch.argument("2")
                Self.windowKeys(app: app, shard: group.shard, now: now, window: window, into: &batch)
                batch.argument(DeliveryClaim.pendingPrefix(owner: owner))
                for index in group.indices {
                    batch.argument(RedisKeys.deliveredField(eventId: pairs[index].eventID, token: pairs[index].token))
                }
            }
            return batch
        }
        for reply in replies { _ = try reply.orThrow("EVALSHA release") }
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
                Self.windowKeys(
                    app: app, shard: RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards), now: now,
                    window: window,
                    into: &batch)
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

    /// Whether each pair has a delivery record (`1`; a pending claim does not count) in the window `now` falls in
    /// or the one before. One pipelined round trip (two `HGET` per pair).
    public func wasDelivered(
        app: String, pairs: [DeliveryPair], now: Int64, window: Int64 = StateStore.defaultReplayWindowMilliseconds
    ) async throws -> [Bool] {
        if pairs.isEmpty { return [] }
        var batch = RedisBatch(capacity: 64 + pairs.count * 160)
        for pair in pairs {
            let shard = RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards)
            let field = RedisKeys.deliveredField(eventId: pair.eventID, token: pair.token)
            for w in [now / window, now / window - 1] {
                batch.command("HGET", arguments: 2)
                Self.windowKey(app: app, shard: shard, window: w, into: &batch)
                batch.argument(field)
            }
        }
        let replies = try await connection.pipeline(batch)
        guard replies.count == 2 * pairs.count else {
            throw RedisError(.unexpectedReply, "expected \(2 * pairs.count) replies, got \(replies.count)")
        }
        return try pairs.indices.map { index in
            try (0..<2).contains { offset in
                try replies[2 * index + offset].orThrow("HGET").text == DeliveryClaim.deliveredValue
            }
        }
    }

    /// Adds the `PEXPIRE` of a shard's hash for the window `now` falls in (two windows) when `expiries` says it is
    /// due, and notes its key in `expiring` (to `mark` once the round trip succeeded).
    private func expireIfDue(
        app: String, shard: UInt64, now: Int64, window: Int64, into batch: inout RedisBatch,
        _ expiring: inout [ExpiryMemo.Key]
    ) {
        let key = ExpiryMemo.Key(kind: ExpiryMemo.deliveredKind, app: app, shard: shard, period: now / window)
        guard expiries.isDue(key, now: now) else { return }
        batch.command("PEXPIRE", arguments: 2)
        Self.windowKey(app: app, shard: shard, window: now / window, into: &batch)
        batch.argument(2 * window)
        expiring.append(key)
    }

    /// Pairs grouped by idempotency shard (in the order shards first appear), so each script touches one slot.
    func deliveryGroups(_ pairs: [DeliveryPair]) -> [(shard: UInt64, indices: [Int])] {
        var groups: [(shard: UInt64, indices: [Int])] = []
        var groupOf: [UInt64: Int] = [:]
        var lastEvent: String?
        var current = -1
        for (index, pair) in pairs.enumerated() {
            // Pairs of one event mostly come one after another: only a change of event hashes again.
            if pair.eventID != lastEvent {
                let shard = RedisKeys.deliveredShard(eventId: pair.eventID, of: deliveredShards)
                if let known = groupOf[shard] {
                    current = known
                } else {
                    current = groups.count
                    groupOf[shard] = current
                    groups.append((shard, []))
                }
                lastEvent = pair.eventID
            }
            groups[current].indices.append(index)
        }
        return groups
    }

    /// `RedisKeys.delivered(app:shard:window:)` as one argument.
    static func windowKey(app: String, shard: UInt64, window: Int64, into batch: inout RedisBatch) {
        batch.argument(RedisKeys.prefix, ":", app, ":delivered:{d", String(shard), "}:", String(window))
    }

    /// The keys of the window `now` falls in and of the one before, as two arguments.
    static func windowKeys(app: String, shard: UInt64, now: Int64, window: Int64, into batch: inout RedisBatch) {
        windowKey(app: app, shard: shard, window: now / window, into: &batch)
        windowKey(app: app, shard: shard, window: now / window - 1, into: &batch)
    }

    // MARK: Decoding

    private func decodeDevices(_ reply: RedisValue, user: String) throws -> [Device] {
        let values = try Self.array(reply.orThrow("HGETALL"))
        var devices: [Device] = []
        var index = 0
        while index + 1 < values.count {
            if let data = values[index + 1].data, let device = try? Device.fromStoredJSON(data) {
                devices.append(device)
            } else {
                let token = values[index].text ?? ""
                logger.warning(
                    "skipping a stored device that is not valid JSON",
                    metadata: [
                        "user": "\(user)", "token": "\(token.prefix(8))…",
                    ])
            }
            index += 2
        }
        return devices.sorted { ($0.registeredAt, $0.token) < ($1.registeredAt, $1.token) }
    }

    /// With `conversations`, only their settings are built (`Preferences.fromJSON(_:conversations:)`).
    private func decodePreferences(_ reply: RedisValue, user: String, conversations: [String]?) throws -> Preferences {
        guard case .string(let data) = reply else { return Preferences() }
        do {
            if let conversations { return try Preferences.fromJSON(data, conversations: conversations) }
            return try Preferences.fromJSON(data)
        } catch {
            logger.warning(
                "stored preferences are not valid; using defaults", metadata: ["user": "\(user)", "error": "\(error)"])
            return Preferences()
        }
    }

    private static func decodeUnread(_ reply: RedisValue) throws -> Unread {
        let values = try array(reply)
        var unread = Unread()
        var index = 0
        while index + 1 < values.count {
            if let field = values[index].text, let count = values[index + 1].int {
                if field == RedisKeys.unreadTotalField {
                    unread.total = Int(count)
                } else if field.hasPrefix("c:") {
                    unread.conversations[String(field.dropFirst(2))] = Int(count)
                }
            }
            index += 2
        }
        return unread
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

    private func load(on connection: RedisConnection) async throws -> String {
        if let known = sha.withLock({ $0 }) { return known }
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

    static func pendingValue(owner: String, until: Int64) -> String { "p:\(owner):\(until)" }

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
    /// KEYS: this replay window's idempotency hash, the previous window's (one shard: one slot). ARGV: this
    /// owner's claim prefix `p:<owner>:`, the claim value, now (ms), the hash's TTL (ms), then the pairs' fields.
    /// Per field: 1 when either window holds a delivery record; another owner's claim that has not lapsed
    /// (`p:<owner>:<until>` with until > now; a value of another form counts as a claim that has not lapsed);
    /// otherwise 0 after writing the claim value into this window (a lapsed claim, or this owner's, is replaced).
    /// When the answer is not 0, a claim of this owner in this window is deleted (`claim`'s first step may have
    /// written it over a record or claim in the previous window).
    static let claim = LoadedScript(
        """
        local out = {}
        local wrote = false
        local mine = ARGV[1]
        local now = tonumber(ARGV[3])
        for i = 5, #ARGV do
          local f = ARGV[i]
          local cur = redis.call('HGET', KEYS[1], f)
          local prev = redis.call('HGET', KEYS[2], f)
          local cur_mine = cur and string.sub(cur, 1, #mine) == mine
          if cur == '1' or prev == '1' then
            -- Delivered: a claim of this owner in this window (the first step may have just written it) goes.
            if cur_mine then redis.call('HDEL', KEYS[1], f) end
            out[#out + 1] = 1
          else
            local other = false
            for _, v in ipairs({cur or '', prev or ''}) do
              if v ~= '' and string.sub(v, 1, #mine) ~= mine then
                local expiry = tonumber(string.match(v, ':(%d+)$'))
                if expiry == nil or expiry > now then other = v end
              end
            end
            if other then
              if cur_mine then redis.call('HDEL', KEYS[1], f) end
              out[#out + 1] = other
            else
              redis.call('HSET', KEYS[1], f, ARGV[2])
              wrote = true
              out[#out + 1] = 0
            end
          end
        end
        if wrote then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
        return out
        """)

    /// KEYS: this window's and the previous window's idempotency hash. ARGV: the owner's claim prefix, then fields.
    /// Deletes each field that is a claim of that owner, in either window. Returns how many it deleted.
    static let release = LoadedScript(
        """
        local n = 0
        for k = 1, 2 do
          for i = 2, #ARGV do
            local v = redis.call('HGET', KEYS[k], ARGV[i])
            if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then n = n + redis.call('HDEL', KEYS[k], ARGV[i]) end
          end
        end
        return n
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

    /// KEYS: devices hash, presence zset. ARGV: token, device JSON, max devices per kind, the device's kind,
    /// unique (1: remove every other device of that kind). A stored entry without a readable kind counts as
    /// `apns`. Returns the evicted tokens.
    static let register = """
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        local max = tonumber(ARGV[3])
        local unique = ARGV[5] == '1'
        local evicted = {}
        if not unique and redis.call('HLEN', KEYS[1]) <= max then return evicted end
        local all = redis.call('HGETALL', KEYS[1])
        local entries = {}
        for i = 1, #all, 2 do
          local at = 0
          local kind = 'apns'
          local ok, device = pcall(cjson.decode, all[i + 1])
          if ok and type(device) == 'table' then
            if tonumber(device['registered_at']) then at = tonumber(device['registered_at']) end
            if type(device['kind']) == 'string' then kind = device['kind'] end
          end
          local newest = 0
          if all[i] == ARGV[1] then newest = 1 end
          if kind == ARGV[4] and not (unique and newest == 1) then entries[#entries + 1] = {at, newest, all[i]} end
        end
        local count = #entries
        if unique then max = 0 end
        if count <= max then return evicted end
        table.sort(entries, function(a, b)
          if a[1] ~= b[1] then return a[1] < b[1] end
          if a[2] ~= b[2] then return a[2] < b[2] end
          return a[3] < b[3]
        end)
        for i = 1, count - max do
          redis.call('HDEL', KEYS[1], entries[i][3])
          redis.call('ZREM', KEYS[2], entries[i][3])
          evicted[#evicted + 1] = entries[i][3]
        end
        return evicted
        """

    /// KEYS: devices hash, presence zset. ARGV: token, dead-since (ms).
    /// Returns 1 removed, -1 kept (registered after dead-since), 0 not registered.
    static let removeDead = """
        local raw = redis.call('HGET', KEYS[1], ARGV[1])
        if not raw then return 0 end
        local ok, device = pcall(cjson.decode, raw)
        if ok and type(device) == 'table' and tonumber(device['registered_at'])
           and tonumber(device['registered_at']) > tonumber(ARGV[2]) then
          return -1
        end
        redis.call('HDEL', KEYS[1], ARGV[1])
        redis.call('ZREM', KEYS[2], ARGV[1])
        return 1
        """
}
