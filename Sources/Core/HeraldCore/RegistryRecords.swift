// Records the registry stage consumes: state updates from the chat back end
// (`herald.registry`) and dead tokens reported by send (`herald.token-feedback`).
// Field names follow the state fixture of docs/behaviour.md §3 (snake_case).

/// `herald.registry`: one state update. Keyed by user id (by conversation id for the member ops),
/// so the updates of one user (or one conversation's members) are applied in the order the chat back end sent them.
///
/// ```json
/// {"op": "register_device", "app_id": "app1", "user": "u2", "unique": false,
///  "device": {"token": "…", "kind": "apns", "environment": "production", "bundle_id": "com.example.chat", "registered_at": 1732000000000}}
/// {"op": "unregister_device", "app_id": "app1", "user": "u2", "token": "…"}
/// {"op": "unregister_all", "app_id": "app1", "user": "u2"}
/// {"op": "set_preferences", "app_id": "app1", "user": "u2", "preferences": {"trigger": "mention_only", ...}}
/// {"op": "set_presence", "app_id": "app1", "user": "u2", "online": ["<token>"], "ttl_ms": 120000}
/// {"op": "set_unread", "app_id": "app1", "user": "u2", "unread": {"total": 5, "conversations": {"c1": 2}}}
/// {"op": "set_members", "app_id": "app1", "conversation": "c1", "members": ["u1", "u2"]}
/// {"op": "add_members", "app_id": "app1", "conversation": "c1", "members": ["u3"]}
/// {"op": "remove_members", "app_id": "app1", "conversation": "c1", "members": ["u1"]}
/// {"op": "patch_preferences", "app_id": "app1", "user": "u2", "patch": {"set": {"trigger": "off"}, "clear": ["dnd"]}}
/// {"op": "mark_read", "app_id": "app1", "user": "u2", "conversation": "c1", "token": "<the reading device>", "read_at": 1732000000000}
/// ```
public struct RegistryRecord: Sendable, Hashable {
    public enum Op: String, Sendable, Hashable, CaseIterable {
        case registerDevice = "register_device"
        case unregisterDevice = "unregister_device"
        case unregisterAll = "unregister_all"
        case setPreferences = "set_preferences"
        case setPresence = "set_presence"
        case setUnread = "set_unread"
        case setMembers = "set_members"
        /// Adds `members` to the conversation's members.
        case addMembers = "add_members"
        /// Removes `members` from the conversation's members.
        case removeMembers = "remove_members"
        /// Some preference fields, applied field by field (`PreferencePatch`).
        case patchPreferences = "patch_preferences"
        /// Resets the Herald-kept unread and mention counts: of `conversation`, or all of them without one; and clears
        /// the conversation's notifications on the user's other devices (docs/behaviour.md §6c).
        case markRead = "mark_read"
    }

    public var op: Op
    public var appID: String
    /// The user the update is about (every op but the member ops).
    public var user: String?
    /// `register_device`.
    public var device: Device?
    /// `register_device`: make this the user's only token of its kind (Sendbird's `unique: true`); absent is false.
    public var unique: Bool?
    /// `unregister_device`; `mark_read`: the device that read (it gets no clear).
    public var token: String?
    /// `set_preferences`: the whole preferences object (it replaces the stored one).
    public var preferences: Preferences?
    /// `set_presence`: the tokens of the user's devices that hold a live connection now.
    public var online: [String]?
    /// `set_presence`: how long the online entries live unless refreshed (default: the pipeline's presence TTL).
    public var ttlMs: Int64?
    /// `set_unread`.
    public var unread: Unread?
    /// The member ops; `mark_read` (absent: every conversation).
    public var conversation: String?
    public var members: [String]?
    /// `patch_preferences`.
    public var patch: PreferencePatch?
    /// `mark_read`: when the user read, epoch milliseconds (set by the API and heraldctl); it names the read, so a
    /// redelivered record clears with the same notification id.
    public var readAt: Int64?

    public init(
        op: Op, appID: String, user: String? = nil, device: Device? = nil, unique: Bool? = nil, token: String? = nil,
        preferences: Preferences? = nil, online: [String]? = nil, ttlMs: Int64? = nil, unread: Unread? = nil,
        conversation: String? = nil, members: [String]? = nil, patch: PreferencePatch? = nil, readAt: Int64? = nil
    ) {
        self.op = op
        self.appID = appID
        self.user = user
        self.device = device
        self.unique = unique
        self.token = token
        self.preferences = preferences
        self.online = online
        self.ttlMs = ttlMs
        self.unread = unread
        self.conversation = conversation
        self.members = members
        self.patch = patch
        self.readAt = readAt
    }

    /// True for the ops about a conversation's members (no `user`; keyed by the conversation).
    public var isMemberOp: Bool { op == .setMembers || op == .addMembers || op == .removeMembers }

    /// The Kafka key: the user, or the conversation for the member ops.
    public var key: String { isMemberOp ? (conversation ?? appID) : (user ?? conversation ?? appID) }

    /// Longest app, user, conversation or member id, in bytes (the API's limit too).
    public static let maxIDBytes = 256
    /// Most members one member record may carry.
    public static let maxMembers = 10_000

    /// What makes the record unusable, if anything (checked before anything is written; the API, heraldctl and
    /// herald-registry apply the same rules): a field the op needs and lacks, an id longer than `maxIDBytes`, a
    /// device token of the wrong form (`Device.tokenProblem`), more than `maxMembers` members, more presence
    /// tokens than a user may have devices.
    public func validationError() -> StageRecordError? {
        func missing(_ field: String) -> StageRecordError {
            StageRecordError(record: "RegistryRecord", detail: "\(field): missing for op \(op.rawValue)")
        }
        func invalid(_ detail: String) -> StageRecordError {
            StageRecordError(record: "RegistryRecord", detail: detail)
        }
        if appID.isEmpty { return invalid("app_id: empty") }
        if appID.utf8.count > Self.maxIDBytes { return invalid("app_id: longer than \(Self.maxIDBytes) bytes") }
        if !isMemberOp, (user ?? "").isEmpty { return missing("user") }
        if let user, user.utf8.count > Self.maxIDBytes {
            return invalid("user: longer than \(Self.maxIDBytes) bytes")
        }
        if let conversation, conversation.utf8.count > Self.maxIDBytes {
            return invalid("conversation: longer than \(Self.maxIDBytes) bytes")
        }
        switch op {
        case .registerDevice:
            guard let device else { return missing("device") }
            if device.token.isEmpty { return invalid("device.token: empty") }
            if let problem = Device.tokenProblem(device.token, kind: device.kind) {
                return invalid("device.token: \(problem)")
            }
        case .unregisterDevice:
            if (token ?? "").isEmpty { return missing("token") }
            if let token, token.utf8.count > Device.maxTokenBytes {
                return invalid("token: longer than \(Device.maxTokenBytes) bytes")
            }
        case .unregisterAll:
            break
        case .setPreferences:
            if preferences == nil { return missing("preferences") }
        case .setPresence:
            guard let online else { return missing("online") }
            if online.count > 4 * Device.maxPerUser {
                return invalid("online: more than \(4 * Device.maxPerUser) tokens")
            }
        case .setUnread:
            if unread == nil { return missing("unread") }
        case .setMembers, .addMembers, .removeMembers:
            if (conversation ?? "").isEmpty { return missing("conversation") }
            guard let members else { return missing("members") }
            if op != .setMembers && members.isEmpty { return invalid("members: empty (nothing to change)") }
            if members.count > Self.maxMembers { return invalid("members: more than \(Self.maxMembers)") }
            if let bad = members.firstIndex(where: { $0.isEmpty || $0.utf8.count > Self.maxIDBytes }) {
                return invalid("members[\(bad)]: a user id is 1 to \(Self.maxIDBytes) bytes")
            }
        case .patchPreferences:
            guard let patch else { return missing("patch") }
            if patch.isEmpty { return invalid("patch: changes nothing") }
            let touched = patch.conversations.count + patch.removeConversations.count
            if touched > PreferencePatch.maxConversations {
                return invalid("patch: more than \(PreferencePatch.maxConversations) conversations")
            }
            if let long = (Array(patch.conversations.keys) + patch.removeConversations).first(where: {
                $0.isEmpty || $0.utf8.count > Self.maxIDBytes
            }) {
                return invalid(
                    "patch.conversations: a conversation id is 1 to \(Self.maxIDBytes) bytes (\(long.utf8.count))")
            }
        case .markRead:
            if let conversation, conversation.isEmpty {
                return StageRecordError(
                    record: "RegistryRecord", detail: "conversation: empty (leave it out to mark everything read)")
            }
            if let token, token.isEmpty || token.utf8.count > Device.maxTokenBytes {
                return invalid("token: 1 to \(Device.maxTokenBytes) bytes (the device that read)")
            }
        }
        return nil
    }
}

/// `herald.token-feedback`: APNs said a token is dead. Keyed by user id. The registry removes the
/// token unless it was registered again after `deadSince`.
public struct TokenFeedbackRecord: Sendable, Hashable {
    public var appID: String
    public var user: String
    public var token: String
    /// APNs's reason (`Unregistered`, `BadDeviceToken`, `DeviceTokenNotForTopic`, ...).
    public var reason: String
    /// Since when the token is dead, epoch milliseconds: 410's `timestamp`, else the time of the answer.
    public var deadSince: Int64

    public init(appID: String, user: String, token: String, reason: String, deadSince: Int64) {
        self.appID = appID
        self.user = user
        self.token = token
        self.reason = reason
        self.deadSince = deadSince
    }

    public var key: String { user }
}

// MARK: JSON (the one codec of both records)

extension RegistryRecord: JSONRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"op\":"); w.string(op.rawValue)
        w.raw(",\"app_id\":"); w.string(appID)
        if let user { w.raw(",\"user\":"); w.string(user) }
        if let device { w.raw(",\"device\":"); device.write(into: &w) }
        if let unique { w.raw(",\"unique\":"); w.bool(unique) }
        if let token { w.raw(",\"token\":"); w.string(token) }
        if let preferences { w.raw(",\"preferences\":"); preferences.write(into: &w) }
        if let online { w.raw(",\"online\":"); w.stringArray(online) }
        if let ttlMs { w.raw(",\"ttl_ms\":"); w.int(ttlMs) }
        if let unread { w.raw(",\"unread\":"); unread.write(into: &w) }
        if let conversation { w.raw(",\"conversation\":"); w.string(conversation) }
        if let members { w.raw(",\"members\":"); w.stringArray(members) }
        if let patch { w.raw(",\"patch\":"); patch.write(into: &w) }
        if let readAt { w.raw(",\"read_at\":"); w.int(readAt) }
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        let r = try RecordReader(json, path: "")
        guard let op = try r.enumValue("op", Op.self) else { throw r.fail("op", "missing") }
        self.init(
            op: op, appID: try r.requiredString("app_id"), user: try r.string("user"),
            device: try r.value("device").map { v throws(StageRecordError) in try Device(json: v, path: "device") },
            unique: try r.bool("unique"), token: try r.string("token"),
            preferences: try r.object("preferences").map { p throws(StageRecordError) in try Preferences(reader: p) },
            online: try r.stringArray("online"), ttlMs: try r.int("ttl_ms"),
            unread: try r.object("unread").map { u throws(StageRecordError) in try Unread(reader: u) },
            conversation: try r.string("conversation"), members: try r.stringArray("members"),
            patch: try r.object("patch").map { p throws(StageRecordError) in try PreferencePatch(reader: p) },
            readAt: try r.int("read_at"))
    }
}

extension TokenFeedbackRecord: JSONRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"app_id\":"); w.string(appID)
        w.raw(",\"user\":"); w.string(user)
        w.raw(",\"token\":"); w.string(token)
        w.raw(",\"reason\":"); w.string(reason)
        w.raw(",\"dead_since\":"); w.int(deadSince)
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        let r = try RecordReader(json, path: "")
        guard let deadSince = try r.int("dead_since") else { throw r.fail("dead_since", "missing") }
        self.init(
            appID: try r.requiredString("app_id"), user: try r.requiredString("user"),
            token: try r.requiredString("token"), reason: try r.requiredString("reason"), deadSince: deadSince)
    }
}
