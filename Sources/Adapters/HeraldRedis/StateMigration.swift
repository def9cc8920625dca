import Foundation

/// What `StateStore.migrateLegacyUserKeys` did.
public struct LegacyMigration: Sendable, Hashable {
    /// Users at least one of whose old keys was moved into their state hash (and deleted).
    public var users: Int
    /// Old keys deleted.
    public var keysDeleted: Int
    /// Old keys of an unexpected Redis type (not written by Herald 0.9), left in place untouched (each counted once
    /// per run).
    public var keysSkipped: Int

    public init(users: Int = 0, keysDeleted: Int = 0, keysSkipped: Int = 0) {
        self.users = users
        self.keysDeleted = keysDeleted
        self.keysSkipped = keysSkipped
    }
}

/// The upgrade from the key layout of Herald 0.9, four keys per user, to the one state hash per user
/// (`RedisKeys.userState`, `UserRecord`):
///
/// | old key | type | becomes |
/// | --- | --- | --- |
/// | `herald:<app>:user:{<user>}:devices` | hash: token -> device JSON | field `d`: the JSON values, one per line |
/// | `herald:<app>:user:{<user>}:presence` | sorted set: token -> expiry (ms) | field `o`: `<expiry> <token>` lines |
/// | `herald:<app>:user:{<user>}:prefs` | string: preferences JSON | field `p` |
/// | `herald:<app>:user:{<user>}:unread` | hash: `total`, `c:<conversation>` -> count | the same fields |
///
/// The user's other keys (`:mentions`, `:counted:<event>`) have the same form in both layouts and are left alone.
extension StateStore {
    /// The old keys' last parts, in the order of the migration script's KEYS after the state hash.
    static let legacyUserParts: [RedisKeys.UserPart] = [.devices, .presence, .preferences, .unread]

    /// Moves every user of `app` still stored in the 0.9 layout into their state hash, `batch` users per round
    /// trip. The old keys are found with `SCAN` on the node, or on every master of a Redis Cluster; each user is
    /// moved by one script (all of a user's keys share a hash slot), which is atomic, so the migration can be
    /// interrupted and run again, and a second run finds nothing to move.
    ///
    /// Per user, a field the state hash already holds wins over the old key (a newer version wrote it):
    /// - `d`: the old device entries (ordered by token), one per line, unless the state hash has `d`;
    /// - `o`: the old presence entries with an expiry after `now`, unless the state hash has `o`;
    /// - `p`: the old preferences, unless the state hash has `p`;
    /// - `total` and each `c:<conversation>` of the old unread hash, each unless the state hash has that field.
    /// An empty result writes no field. The old keys are then deleted; an old key of an unexpected type is left
    /// as it is and counted in `keysSkipped`.
    ///
    /// `progress` gets the totals so far after each round trip. Throws `RedisError` (when retryable, run it again).
    @discardableResult
    public func migrateLegacyUserKeys(
        app: String, batch: Int = 500, now: Int64, progress: (LegacyMigration) -> Void = { _ in }
    ) async throws -> LegacyMigration {
        let size = max(1, batch)
        var done = LegacyMigration()
        var pending: [String] = []
        var queued = Set<String>()
        // A key left in place is found again by every later SCAN page that names it: counted once.
        var skippedUsers = Set<String>()
        func flush() async throws {
            if pending.isEmpty { return }
            let results = try await migrateLegacyUsers(app: app, users: pending, now: now)
            for (user, result) in zip(pending, results) {
                if result.deleted > 0 { done.users += 1 }
                done.keysDeleted += result.deleted
                if result.skipped > 0, skippedUsers.insert(user).inserted { done.keysSkipped += result.skipped }
            }
            pending.removeAll(keepingCapacity: true)
            queued.removeAll(keepingCapacity: true)
            progress(done)
        }
        try await scanLegacyUserKeys(app: app) { keys in
            for (user, _) in keys where queued.insert(user).inserted {
                pending.append(user)
                if pending.count >= size { try await flush() }
            }
        }
        try await flush()
        return done
    }

    /// How many old (0.9 layout) user keys `app` has, found as `migrateLegacyUserKeys` finds them (a `SCAN` may
    /// name a key twice, so this is an estimate for progress, not an exact count).
    public func countLegacyUserKeys(app: String) async throws -> Int {
        var count = 0
        try await scanLegacyUserKeys(app: app) { count += $0.count }
        return count
    }

    /// Runs the migration script for each of `users` (distinct), in one pipelined round trip; per user, the old
    /// keys it deleted and those of an unexpected type it left.
    func migrateLegacyUsers(
        app: String, users: [String], now: Int64
    ) async throws -> [(deleted: Int, skipped: Int)] {
        let replies = try await LegacyScripts.migrate.run(on: connection, what: "migrate") { sha in
            var batch = RedisBatch(capacity: 64 + users.count * 400)
            for user in users {
                batch.command("EVALSHA", arguments: 8)  // SHA, 5 keys: the state hash and the 4 old ones, now
                batch.argument(sha)
                batch.argument("5")
                // The names as 0.9 wrote them, the state hash's included: a user whose id cannot be a hash tag
                // is moved under its hexadecimal name afterwards (`migrateUntaggableUserKeys`).
                batch.argument(RedisKeys.rawUser(app: app, user: user, .state))
                for part in Self.legacyUserParts { batch.argument(RedisKeys.rawUser(app: app, user: user, part)) }
                batch.argument(now)
            }
            return batch
        }
        return try zip(users, replies).map { user, reply in
            // On a Redis Cluster the old keys of an id that cannot be a hash tag are in different slots: one
            // script cannot move them; they are left in place and counted as skipped.
            if case .error(let message) = reply, message.hasPrefix("CROSSSLOT"), !RedisKeys.isTaggable(user) {
                return (0, 1)
            }
            guard let counts = try reply.orThrow("EVALSHA migrate").array, counts.count == 2,
                let deleted = counts[0].int, let skipped = counts[1].int
            else {
                throw RedisError(.unexpectedReply, "the migration script answered \(reply)")
            }
            return (Int(deleted), Int(skipped))
        }
    }

    /// Scans every node holding keys (each master of a cluster) for `app`'s old user keys and hands `page` each
    /// batch found, as (user, part) pairs.
    private func scanLegacyUserKeys(
        app: String, page: ([(user: String, part: RedisKeys.UserPart)]) async throws -> Void
    ) async throws {
        try await scanKeys(matching: Self.globEscaped("\(RedisKeys.prefix):\(app):user:") + "*") { keys in
            let found = keys.compactMap { Self.legacyUserKey($0, app: app) }
            if !found.isEmpty { try await page(found) }
        }
    }

    /// Scans every node holding keys (each master of a cluster) for the keys `pattern` matches (`SCAN MATCH`) and
    /// hands `page` each batch found (a key may come twice).
    func scanKeys(matching pattern: String, page: ([String]) async throws -> Void) async throws {
        for node in try await connection.masterConnections() {
            var cursor = "0"
            repeat {
                let reply = try await node.send(RedisCommand("SCAN", cursor, "MATCH", pattern, "COUNT", 1000))
                    .orThrow("SCAN")
                guard let parts = reply.array, parts.count == 2, let next = parts[0].text, let keys = parts[1].array
                else {
                    throw RedisError(.unexpectedReply, "SCAN answered \(reply)")
                }
                let names = keys.compactMap(\.text)
                if !names.isEmpty { try await page(names) }
                cursor = next
            } while cursor != "0"
        }
    }

    /// The user and part of an old user key of `app` (`herald:<app>:user:{<user>}:devices|presence|prefs|unread`),
    /// or nil for any other key.
    static func legacyUserKey(_ key: String, app: String) -> (user: String, part: RedisKeys.UserPart)? {
        let prefix = "\(RedisKeys.prefix):\(app):user:{".utf8
        let bytes = key.utf8
        guard bytes.starts(with: prefix) else { return nil }
        for part in legacyUserParts {
            let suffix = ("}:" + part.rawValue).utf8
            guard bytes.count >= prefix.count + suffix.count, bytes.reversed().starts(with: suffix.reversed())
            else { continue }
            let user = String(decoding: bytes.dropFirst(prefix.count).dropLast(suffix.count), as: UTF8.self)
            // The key must be exactly the one the layout builds for that user.
            if RedisKeys.rawUser(app: app, user: user, part) == key { return (user, part) }
        }
        return nil
    }

    /// `text` with the characters special in a `SCAN MATCH` pattern (`*?[]\`) escaped.
    static func globEscaped(_ text: String) -> String {
        var out = ""
        for character in text {
            if "*?[]\\".contains(character) { out.append("\\") }
            out.append(character)
        }
        return out
    }
}

/// What `StateStore.migrateUntaggableUserKeys` did.
public struct UntaggableMigration: Sendable, Hashable {
    /// Keys moved to their hexadecimal name (and deleted under the old one).
    public var keysMoved: Int
    /// Keys of an unexpected Redis type (not a hash), left in place untouched.
    public var keysSkipped: Int

    public init(keysMoved: Int = 0, keysSkipped: Int = 0) {
        self.keysMoved = keysMoved
        self.keysSkipped = keysSkipped
    }
}

/// The upgrade of the keys of users whose id cannot be a hash tag as it is (empty, or starting with `}`;
/// `RedisKeys.isTaggable`). Such a user's keys used to be named with the id as it is, `herald:<app>:user:{}x}:state`,
/// which spreads them over slots; they are now named with the id in hexadecimal,
/// `herald:<app>:user:hex{0x7d78}:state`, like every key of that user from now on.
extension StateStore {
    /// Moves the state hash and mention counts of every such user of `app` to their new names. The keys are found
    /// with `SCAN` (on every master of a Redis Cluster); each is read (`HGETALL`), its fields written into the new
    /// key unless that already has them (`HSETNX`: a field written since the upgrade wins), its TTL carried over if
    /// the new key has none, and it is deleted. The steps of one key are not atomic (on a cluster the two names are
    /// in different slots), but each is idempotent: an interrupted run can be run again, and a second run finds
    /// nothing. A user's replay markers (`:counted:<event>`) are left to expire. Throws `RedisError`.
    @discardableResult
    public func migrateUntaggableUserKeys(app: String) async throws -> UntaggableMigration {
        var done = UntaggableMigration()
        try await scanKeys(matching: Self.globEscaped("\(RedisKeys.prefix):\(app):user:{}") + "*") { keys in
            for key in keys {
                guard let (user, part) = Self.untaggableUserKey(key, app: app) else { continue }
                switch try await moveUserHash(from: key, to: RedisKeys.user(app: app, user: user, part)) {
                case true?: done.keysMoved += 1
                case false?: done.keysSkipped += 1
                case nil: break  // gone meanwhile: named twice by SCAN, or moved by a run beside this one
                }
            }
        }
        return done
    }

    /// The user and part of a key of `app` named the old way for an id `isTaggable` refuses
    /// (`herald:<app>:user:{<user>}:state|mentions`), or nil for any other key.
    static func untaggableUserKey(_ key: String, app: String) -> (user: String, part: RedisKeys.UserPart)? {
        let prefix = "\(RedisKeys.prefix):\(app):user:{".utf8
        let bytes = key.utf8
        guard bytes.starts(with: prefix) else { return nil }
        for part in [RedisKeys.UserPart.state, .mentions] {
            let suffix = ("}:" + part.rawValue).utf8
            guard bytes.count >= prefix.count + suffix.count, bytes.reversed().starts(with: suffix.reversed())
            else { continue }
            let user = String(decoding: bytes.dropFirst(prefix.count).dropLast(suffix.count), as: UTF8.self)
            if !RedisKeys.isTaggable(user), RedisKeys.rawUser(app: app, user: user, part) == key { return (user, part) }
        }
        return nil
    }

    /// Copies the hash `old` into `new` field by field (a field `new` has is kept), carries `old`'s TTL over when
    /// `new` has none, and deletes `old`. False, with nothing changed, when `old` is not a hash; nil when it is gone.
    private func moveUserHash(from old: String, to new: String) async throws -> Bool? {
        let kind = try await connection.send(RedisCommand("TYPE", old)).orThrow("TYPE")
        if kind.text == "none" { return nil }
        guard kind.text == "hash" else { return false }
        let fields = try await connection.send(RedisCommand("HGETALL", old)).orThrow("HGETALL").array ?? []
        let ttl = try await connection.send(RedisCommand("PTTL", old)).orThrow("PTTL").int ?? -1
        var commands: [RedisCommand] = []
        var index = 0
        while index + 1 < fields.count {
            if let field = fields[index].data, let value = fields[index + 1].data {
                commands.append(RedisCommand("HSETNX", new, field, value))
            }
            index += 2
        }
        if !commands.isEmpty {
            for reply in try await connection.pipeline(commands) { _ = try reply.orThrow("HSETNX") }
        }
        if ttl > 0, try await connection.send(RedisCommand("PTTL", new)).orThrow("PTTL").int == -1 {
            _ = try await connection.send(RedisCommand("PEXPIRE", new, ttl)).orThrow("PEXPIRE")
        }
        _ = try await connection.send(RedisCommand("DEL", old)).orThrow("DEL")
        return true
    }
}

enum LegacyScripts {
    /// KEYS: the user's state hash, their 0.9 devices hash, presence sorted set, preferences string, unread hash
    /// (one hash slot). ARGV: now (ms). Merges the old keys into the state hash (see
    /// `StateStore.migrateLegacyUserKeys`), deletes them, and returns {keys deleted, keys of an unexpected type}.
    ///
    /// Presence expiries are written as integer digits (`string.format('%d')`: Lua would print 1790000000000 as
    /// `1.79e+12`), at most 9e17 (`UserRecord.decodeOnline` reads up to 18 digits).
    static let migrate = LoadedScript(
        """
        local state = KEYS[1]
        local kinds = {'hash', 'zset', 'string', 'hash'}
        local found = {}
        local skipped = 0
        for i = 2, 5 do
          local kind = redis.call('TYPE', KEYS[i])['ok']
          if kind == kinds[i - 1] then found[i] = true elseif kind ~= 'none' then skipped = skipped + 1 end
        end
        if found[2] and redis.call('HEXISTS', state, 'd') == 0 then
          local flat = redis.call('HGETALL', KEYS[2])
          local entries = {}
          for i = 1, #flat, 2 do entries[#entries + 1] = {flat[i], flat[i + 1]} end
          table.sort(entries, function(a, b) return a[1] < b[1] end)
          local lines = {}
          for _, entry in ipairs(entries) do
            -- Compact JSON holds no raw line break; one would split the entry, and as JSON white space it can go.
            local line = string.gsub(entry[2], '[\\r\\n]', ' ')
            if string.find(line, '%S') then lines[#lines + 1] = line end
          end
          if #lines > 0 then redis.call('HSET', state, 'd', table.concat(lines, '\\n')) end
        end
        if found[3] and redis.call('HEXISTS', state, 'o') == 0 then
          local flat = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'WITHSCORES')
          local lines = {}
          for i = 1, #flat, 2 do
            local token = flat[i]
            local expiry = tonumber(flat[i + 1])
            if expiry ~= nil and token ~= '' and not string.find(token, '\\n', 1, true) then
              if expiry > 9e17 then expiry = 9e17 end
              lines[#lines + 1] = string.format('%d', expiry) .. ' ' .. token
            end
          end
          if #lines > 0 then redis.call('HSET', state, 'o', table.concat(lines, '\\n')) end
        end
        if found[4] and redis.call('HEXISTS', state, 'p') == 0 then
          local preferences = redis.call('GET', KEYS[4])
          if preferences and preferences ~= '' then redis.call('HSET', state, 'p', preferences) end
        end
        if found[5] then
          local flat = redis.call('HGETALL', KEYS[5])
          for i = 1, #flat, 2 do
            local field = flat[i]
            if field == 'total' or string.sub(field, 1, 2) == 'c:' then redis.call('HSETNX', state, field, flat[i + 1]) end
          end
        end
        local deleted = 0
        for i = 2, 5 do
          if found[i] then deleted = deleted + redis.call('DEL', KEYS[i]) end
        end
        return {deleted, skipped}
        """)
}
