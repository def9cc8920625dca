/// The Redis key layout of the state in docs/behaviour.md §3, built in one place (documented in docs/redis-keys.md).
///
/// Every key starts with `herald:<app>:`. The user id or conversation id sits in a Redis Cluster hash tag
/// (`{...}`) so that all keys of one user (or one conversation) land in the same slot: the atomic scripts
/// (register with eviction, dead-token removal) touch a user's devices and presence together.
///
/// | key | type | content |
/// | --- | --- | --- |
/// | `herald:<app>:user:{<user>}:devices` | hash | device token -> device JSON (`token`, `kind`, `environment`, `bundle_id`, `registered_at`) |
/// | `herald:<app>:user:{<user>}:presence` | sorted set | online device token -> expiry (ms since epoch) |
/// | `herald:<app>:user:{<user>}:prefs` | string | preferences JSON (state fixture field names) |
/// | `herald:<app>:user:{<user>}:unread` | hash | `total` -> count, `c:<conversation>` -> count |
/// | `herald:<app>:conv:{<conversation>}:members` | set | user ids |
/// | `herald:<app>:token:{<token>}:owner` | string | the user the token is registered to (one owner per app) |
/// | `herald:<app>:fanout:{<event>}` | string | resolve's paged fan-out: cursor after the last acknowledged page, or `done` |
/// | `herald:<app>:delivered:<event>:<token>` | string | `p:<owner>:<expires>` (claimed) or `1` (delivered), with a TTL |
public enum RedisKeys {
    public static let prefix = "herald"

    /// The last part of a user's keys, `herald:<app>:user:{<user>}:<part>`.
    public enum UserPart: String, Sendable {
        case devices, presence, unread, mentions
        case preferences = "prefs"
        case lastDecision = "last_decision"
    }

    public static func user(app: String, user: String, _ part: UserPart) -> String {
        "\(prefix):\(app):user:{\(user)}:\(part.rawValue)"
    }
    public static func devices(app: String, user: String) -> String { Self.user(app: app, user: user, .devices) }
    public static func presence(app: String, user: String) -> String { Self.user(app: app, user: user, .presence) }
    public static func preferences(app: String, user: String) -> String {
        Self.user(app: app, user: user, .preferences)
    }
    public static func unread(app: String, user: String) -> String { Self.user(app: app, user: user, .unread) }
    public static func members(app: String, conversation: String) -> String {
        "\(prefix):\(app):conv:{\(conversation)}:members"
    }
    public static func tokenOwner(app: String, token: String) -> String { "\(prefix):\(app):token:{\(token)}:owner" }
    /// How far resolve's paged fan-out of an event got: an SSCAN cursor, or `done` (string, with a TTL).
    public static func fanOut(app: String, eventId: String) -> String { "\(prefix):\(app):fanout:{\(eventId)}" }
    public static func delivered(app: String, eventId: String, token: String) -> String {
        "\(prefix):\(app):delivered:\(eventId):\(token)"
    }

    /// Field of the unread hash holding the total.
    public static let unreadTotalField = "total"
    /// Field of the unread hash holding one conversation's count.
    public static func unreadField(conversation: String) -> String { "c:\(conversation)" }
}

/// The same keys written into a `RedisBatch` piece by piece (the hot paths), beside the functions above so the
/// layout stays in one place; RedisBatchTests hold the two to the same bytes.
extension RedisBatch {
    /// `RedisKeys.user(app:user:_:)` as one argument.
    mutating func userKey(app: String, user: String, _ part: RedisKeys.UserPart) {
        argument(RedisKeys.prefix, ":", app, ":user:{", user, "}:", part.rawValue)
    }

    /// `RedisKeys.delivered(app:eventId:token:)` as one argument.
    mutating func deliveredKey(app: String, eventId: String, token: String) {
        argument(RedisKeys.prefix, ":", app, ":delivered:", eventId, ":", token)
    }
}
