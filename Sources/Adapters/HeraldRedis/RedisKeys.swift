import HeraldCore

/// The Redis key layout of the state in docs/behaviour.md §3, built in one place (documented in docs/redis-keys.md).
///
/// Every key starts with `herald:<app>:`. The user id or conversation id sits in a Redis Cluster hash tag
/// (`{...}`) so that all keys of one user (or one conversation) land in the same slot: the counting script touches a
/// user's state hash, mention counts and marker together.
///
/// Redis hashes the bytes between a key's first `{` and the first `}` after it, and the whole key when there are
/// none. A user id that is empty or starts with `}` would leave `{}` empty and spread the user's keys over slots, so
/// such an id is written in hexadecimal instead (`herald:<app>:user:hex{0x<hex of its UTF-8>}:state`): any
/// id keeps all of one user's keys in one slot. Every other id is written as it is (its tag may end early at a `}`
/// inside it; that still holds for all of the user's keys).
///
/// | key | type | content |
/// | --- | --- | --- |
/// | `herald:<app>:user:{<user>}:state` (`user:hex{0x<hex>}:state` for an id `isTaggable` refuses) | hash | devices `d`, presence `o`, preferences `p`, unread `total` and `c:<conversation>` (`UserRecord`) |
/// | `herald:<app>:user:{<user>}:mentions` | hash | `total` -> unread mentions, `c:<conversation>` -> per conversation |
/// | `herald:<app>:conv:{<conversation>}:members` | set | user ids |
/// | `herald:<app>:token:{<token>}:owner` | string | the user the token is registered to (one owner per app) |
/// | `herald:<app>:fanout:{<event>}` | string | resolve's paged fan-out: cursor after the last acknowledged page, or `done` |
/// | `herald:<app>:delivered:{d<shard>}:<window>` | hash | 8-byte fingerprint of (event, token) -> claim number (`ClaimNumbers`), or `1` |
/// | `herald:<app>:claims:{c<block>}` | string | when the block was taken (8 bytes), then a bit per claim number: delivered |
/// | `herald:<app>:explain:{e<shard>}:<hour>` | list | the compact explain trail: one line per entry (`ExplainEntry.writeLine`) |
/// | `herald:<app>:last_decision:{l<shard>}` | hash | user -> their latest user-level explain entry (one line) |
/// | `herald:<app>:burst:{b<shard>}` | hash | burst field -> burst state, and the latest held record (Bursts.swift) |
/// | `herald:<app>:burst_due:{b<shard>}` | sorted set | burst field -> when the flush timer looks at it next |
/// | `herald:<app>:user:{<user>}:digest` | hash | the user's digest when Do Not Disturb or a snooze ends (Digests.swift) |
/// | `herald:<app>:digest_due:{g<shard>}` | sorted set | user -> when their digest is due |
/// | `herald:<app>:translation:{t:<app>}:<target>:<message id>` | string | a translator's answer (Translations.swift) |
/// | `herald:<app>:translations:{t:<app>}` | sorted set | `<target>:<message id>` -> when kept: the app's bound |
public enum RedisKeys {
    public static let prefix = "herald"

    /// The last part of a user's keys, `herald:<app>:user:{<user>}:<part>`.
    public enum UserPart: String, Sendable {
        case state, devices, presence, unread, mentions
        case preferences = "prefs"
    }

    public static func user(app: String, user: String, _ part: UserPart) -> String {
        userPrefix(app: app, user: user) + part.rawValue
    }

    /// What a user's keys start with: `herald:<app>:user:{<user>}:`, or `herald:<app>:user:hex{0x<hex>}:` for an id
    /// that cannot be a hash tag as it is (`isTaggable`).
    public static func userPrefix(app: String, user: String) -> String {
        isTaggable(user)
            ? "\(prefix):\(app):user:{\(user)}:" : "\(prefix):\(app):user:hex{0x\(hexadecimal(user))}:"
    }

    /// Whether `id` inside `{...}` makes a hash tag that holds all of its keys in one slot: not empty and not
    /// starting with `}` (which would make the tag `{}`, and Redis would hash each whole key).
    public static func isTaggable(_ id: String) -> Bool {
        guard let first = id.utf8.first else { return false }
        return first != UInt8(ascii: "}")
    }

    /// The lowercase hexadecimal of `text`'s UTF-8 bytes.
    static func hexadecimal(_ text: String) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(text.utf8.count * 2)
        for byte in text.utf8 {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// A user key as written before untaggable ids were written in hexadecimal (and by Herald 0.9, for its four
    /// parts): the id in the tag as it is. Read only by the upgrades (StateMigration.swift).
    static func rawUser(app: String, user: String, _ part: UserPart) -> String {
        "\(prefix):\(app):user:{\(user)}:\(part.rawValue)"
    }
    /// The user's state hash: devices, presence, preferences and unread counts (`UserRecord`).
    public static func userState(app: String, user: String) -> String { Self.user(app: app, user: user, .state) }
    // The layout of Herald 0.9, four keys per user, read only by the upgrade (`migrateLegacyUserKeys`).
    public static func devices(app: String, user: String) -> String { Self.user(app: app, user: user, .devices) }
    public static func presence(app: String, user: String) -> String { Self.user(app: app, user: user, .presence) }
    public static func preferences(app: String, user: String) -> String {
        Self.user(app: app, user: user, .preferences)
    }
    public static func unread(app: String, user: String) -> String { Self.user(app: app, user: user, .unread) }
    /// The pub/sub channel of the idle doorbell of a Kafka topic between stages (docs/kafka.md, "Idle backoff"):
    /// whatever produced to the topic publishes on it, so idle consumers of the topic fetch at once. A channel, not
    /// a key: it holds no data.
    public static func doorbellChannel(topic: String) -> String { "herald:doorbell:" + topic }

    /// Rings the doorbell of each of `topics` once (`PUBLISH channel ""`), for a tool that wrote to topics between
    /// stages; best effort: returns the topics whose ring Redis did not take.
    public static func ringDoorbells(_ topics: Set<String>, on connection: RedisConnection) async -> [String] {
        var failed: [String] = []
        for topic in topics.sorted() {
            let reply = try? await connection.send("PUBLISH", doorbellChannel(topic: topic), "")
            if reply?.int == nil { failed.append(topic) }
        }
        return failed
    }

    public static func members(app: String, conversation: String) -> String {
        "\(prefix):\(app):conv:{\(conversation)}:members"
    }
    public static func tokenOwner(app: String, token: String) -> String { "\(prefix):\(app):token:{\(token)}:owner" }
    /// How far resolve's paged fan-out of an event got: an SSCAN cursor, or `done` (string, with a TTL).
    public static func fanOut(app: String, eventId: String) -> String { "\(prefix):\(app):fanout:{\(eventId)}" }

    // MARK: Records that grow with traffic, kept compact (docs/redis-keys.md)
    //
    // They are spread over a fixed number of shards (a hash tag each, so each shard is one Redis Cluster slot) and
    // cut by time, so each key holds many small entries (Redis keeps a small hash as one listpack) and whole keys
    // expire, instead of one key per event or per notification.

    /// Shards of the idempotency records per replay window, by event, unless the pipeline file sets
    /// `idempotency.shards`: all devices of one event share a shard.
    public static let deliveredShards: UInt64 = 1024
    /// Shards of the explain trail's hourly logs, by event, unless the pipeline file sets `explain.log_shards`.
    public static let explainShards: UInt64 = 256
    /// Shards of the users' latest decisions, by user, unless the pipeline file sets `explain.last_decision_shards`.
    public static let lastDecisionShards: UInt64 = 1024
    /// The explain trail's logs are cut by the hour of the decision.
    public static let explainHourMilliseconds: Int64 = 3_600_000

    /// FNV-1a 64 of `text`'s bytes, continuing from `hash`.
    static func fnv(_ text: String, _ hash: UInt64 = FNV1a.offsetBasis) -> UInt64 {
        FNV1a.hash(text, continuing: hash)
    }

    /// The idempotency shard of an event, of `shards`.
    public static func deliveredShard(eventId: String, of shards: UInt64 = deliveredShards) -> UInt64 {
        fnv(eventId) % shards
    }
    /// The idempotency records of one shard and replay window (`now / window`).
    public static func delivered(app: String, shard: UInt64, window: Int64) -> String {
        "\(prefix):\(app):delivered:{d\(shard)}:\(window)"
    }
    /// One block of claim numbers: 8 bytes of the time it was taken (ms, big-endian), then one bit per number of
    /// the block, set once the pair that number claimed was delivered.
    public static func claimBlock(app: String, block: Int64) -> String { "\(prefix):\(app):claims:{c\(block)}" }
    /// FNV-1a 64 over `first`'s bytes, a zero byte and `second`'s bytes.
    static func fnv(_ first: String, then second: String) -> UInt64 { FNV1a.hash(first, then: second) }

    /// The field of an (event, token) pair in its shard: 8 bytes of FNV-1a 64 over the event id, a zero byte and
    /// the token (the token itself is not stored).
    public static func deliveredField(eventId: String, token: String) -> [UInt8] {
        withUnsafeBytes(of: fnv(eventId, then: token).bigEndian) { Array($0) }
    }

    /// The explain shard of an event, of `shards`.
    public static func explainShard(eventId: String, of shards: UInt64 = explainShards) -> UInt64 {
        fnv(eventId) % shards
    }
    /// One shard's explain log for the hour `hour` (epoch ms / `explainHourMilliseconds`).
    public static func explainLog(app: String, shard: UInt64, hour: Int64) -> String {
        "\(prefix):\(app):explain:{e\(shard)}:\(hour)"
    }

    /// The last-decision shard of a user, of `shards`.
    public static func lastDecisionShard(user: String, of shards: UInt64 = lastDecisionShards) -> UInt64 {
        fnv(user) % shards
    }
    /// One shard of the users' latest decisions (field: the user id).
    public static func lastDecisions(app: String, shard: UInt64) -> String {
        "\(prefix):\(app):last_decision:{l\(shard)}"
    }

    /// Field of the state hash holding the unread total.
    public static let unreadTotalField = "total"
    /// Field of the state hash holding one conversation's unread count.
    public static func unreadField(conversation: String) -> String { "c:\(conversation)" }
}

/// The same keys written into a `RedisBatch` piece by piece (the hot paths), beside the functions above so the
/// layout stays in one place; RedisBatchTests hold the two to the same bytes.
extension RedisBatch {
    /// `RedisKeys.user(app:user:_:)` as one argument.
    mutating func userKey(app: String, user: String, _ part: RedisKeys.UserPart) {
        if RedisKeys.isTaggable(user) {
            argument(RedisKeys.prefix, ":", app, ":user:{", user, "}:", part.rawValue)
        } else {
            argument(RedisKeys.prefix, ":", app, ":user:hex{0x", RedisKeys.hexadecimal(user), "}:", part.rawValue)
        }
    }

    /// `RedisKeys.members(app:conversation:)` as one argument.
    mutating func membersKey(app: String, conversation: String) {
        argument(RedisKeys.prefix, ":", app, ":conv:{", conversation, "}:members")
    }
}
