// The chat event (docs/behaviour.md §2), its validation, and its normalised JSON.
// `ChatEvent.decode(_:)` is the one entry point from raw bytes: it never traps
// and throws a `FieldError` naming the offending field.

public enum ConversationType: String, Sendable, Hashable, CaseIterable {
    case direct, group, open, supergroup
}

public enum MessageType: String, Sendable, Hashable, CaseIterable {
    case text, file, admin
}

public enum MentionType: String, Sendable, Hashable, CaseIterable {
    case users, channel
}

/// One chat event: a message, a call, a reaction or a group action.
public struct ChatEvent: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable, CaseIterable {
        case message, call, reaction
        case groupAction = "group_action"
        /// A message was edited: a notification with the new text (docs/behaviour.md §7).
        case messageEdited = "message_edited"
        /// A message was deleted: a background update, nothing shown.
        case messageDeleted = "message_deleted"
        /// A user read a conversation (or everything): Herald's own kind, made by herald-registry from a `mark_read`
        /// record for the user's other devices (docs/behaviour.md §6c); never accepted on `chat.events`.
        case conversationRead = "conversation_read"

        /// The kinds a chat back end publishes on `chat.events` (docs/event-schema.json): all but Herald's own.
        public static let published: [Kind] = allCases.filter { $0 != .conversationRead }

        /// Whether the event is about a message (and carries the `message` block).
        public var isMessage: Bool { self == .message || self == .messageEdited || self == .messageDeleted }
    }

    public struct Sender: Sendable, Hashable {
        public var id: String
        public var name: String?
        public var profileURL: String?
        public init(id: String, name: String? = nil, profileURL: String? = nil) {
            self.id = id; self.name = name; self.profileURL = profileURL
        }
    }

    public struct Conversation: Sendable, Hashable {
        public var id: String
        public var type: ConversationType
        public var name: String?
        public var customType: String?
        /// Sendbird's `channel_type` of this conversation (`messaging`, `group_messaging` or `chat`); nil: the
        /// app's setting (`sendbird.group_channel_type`) for a group, `messaging` for a direct conversation.
        public var channelType: String?
        /// The group's avatar; in a direct conversation, the receiver's (CometChat's `receiverAvatar`).
        public var avatarURL: String?
        /// Members who hid the conversation from their list (Sendbird's `mentioned_users.is_hidden`).
        public var hiddenBy: [String]

        /// Sendbird's channel types.
        public static let channelTypes = ["messaging", "group_messaging", "chat"]

        public init(
            id: String, type: ConversationType, name: String? = nil, customType: String? = nil,
            channelType: String? = nil, avatarURL: String? = nil, hiddenBy: [String] = []
        ) {
            self.id = id; self.type = type; self.name = name; self.customType = customType
            self.channelType = channelType; self.avatarURL = avatarURL; self.hiddenBy = hiddenBy
        }
    }

    public struct File: Sendable, Hashable {
        public var name: String?
        public var mimeType: String?
        public var url: String?
        public init(name: String? = nil, mimeType: String? = nil, url: String? = nil) {
            self.name = name; self.mimeType = mimeType; self.url = url
        }
    }

    public struct Message: Sendable, Hashable {
        public var id: String
        public var type: MessageType
        public var text: String
        public var customType: String
        public var data: String
        public var file: File?
        public var mentions: [String]
        public var mentionType: MentionType
        public var language: String?
        /// Language tag to translated text, sorted by tag for stable output.
        public var translations: [(String, String)]
        /// The message's metadata (a JSON object of the chat back end's, CometChat's `data.metadata`).
        public var metadata: JSONValue?
        /// Further files of the message (CometChat's `data.attachments`); `file` is the first one's place.
        public var attachments: [File]

        public init(
            id: String, type: MessageType = .text, text: String = "", customType: String = "",
            data: String = "", file: File? = nil, mentions: [String] = [], mentionType: MentionType = .users,
            language: String? = nil, translations: [(String, String)] = [], metadata: JSONValue? = nil,
            attachments: [File] = []
        ) {
            self.id = id; self.type = type; self.text = text; self.customType = customType; self.data = data
            self.file = file; self.mentions = mentions; self.mentionType = mentionType; self.language = language
            self.translations = translations.sorted { $0.0 < $1.0 }
            self.metadata = metadata; self.attachments = attachments
        }

        public func translation(_ language: String) -> String? {
            for (k, v) in translations where k == language { return v }
            let wanted = Language.normalize(language)
            for (k, v) in translations where Language.normalize(k) == wanted { return v }
            return nil
        }

        public static func == (a: Message, b: Message) -> Bool {
            a.id == b.id && a.type == b.type && a.text == b.text && a.customType == b.customType && a.data == b.data
                && a.file == b.file && a.mentions == b.mentions && a.mentionType == b.mentionType
                && a.language == b.language && a.translations.map(\.0) == b.translations.map(\.0)
                && a.translations.map(\.1) == b.translations.map(\.1) && a.metadata == b.metadata
                && a.attachments == b.attachments
        }

        public func hash(into h: inout Hasher) {
            h.combine(id); h.combine(text); h.combine(type)
        }
    }

    public enum CallType: String, Sendable, Hashable, CaseIterable { case audio, video }

    public enum CallAction: String, Sendable, Hashable, CaseIterable {
        case initiated, cancelled, unanswered, ongoing, rejected, ended, busy
    }

    public struct Call: Sendable, Hashable {
        public var action: CallAction
        public var sessionID: String
        public var type: CallType
        public init(action: CallAction, sessionID: String, type: CallType) {
            self.action = action; self.sessionID = sessionID; self.type = type
        }
    }

    public struct Reaction: Sendable, Hashable {
        public var emoji: String
        public var messageID: String?
        public init(emoji: String, messageID: String? = nil) { self.emoji = emoji; self.messageID = messageID }
    }

    /// CometChat group actions; `kicked` is read as `removed`.
    public enum GroupActionKind: String, Sendable, Hashable, CaseIterable {
        case joined, left, added, removed, banned, unbanned
    }

    public struct GroupAction: Sendable, Hashable {
        public var action: GroupActionKind
        public var actorName: String
        public init(action: GroupActionKind, actorName: String) { self.action = action; self.actorName = actorName }
    }

    /// Easemob `em_apns_ext`.
    public struct APNsExtension: Sendable, Hashable {
        public var pushContent: String?
        public var category: String?
        public var sound: String?
        /// `em_push_sound: null`: no sound at all (iOS 8 and later stay silent), not even the app's default.
        public var soundSilenced: Bool
        public var mutableContent: Bool
        public var titleLocKey: String?
        public var titleLocArgs: [String]?
        public var bodyLocKey: String?
        public var bodyLocArgs: [String]?
        /// Copied verbatim to the payload's top-level `e` (any JSON value; usually a string).
        public var extern: JSONValue?

        public init(
            pushContent: String? = nil, category: String? = nil, sound: String? = nil,
            mutableContent: Bool = false, titleLocKey: String? = nil, titleLocArgs: [String]? = nil,
            bodyLocKey: String? = nil, bodyLocArgs: [String]? = nil, extern: JSONValue? = nil,
            soundSilenced: Bool = false
        ) {
            self.pushContent = pushContent; self.category = category; self.sound = sound
            self.soundSilenced = soundSilenced
            self.mutableContent = mutableContent; self.titleLocKey = titleLocKey; self.titleLocArgs = titleLocArgs
            self.bodyLocKey = bodyLocKey; self.bodyLocArgs = bodyLocArgs; self.extern = extern
        }

        var isEmpty: Bool { self == APNsExtension() }
    }

    /// Easemob message `ext`.
    public struct Extension: Sendable, Hashable {
        public var ignoreNotification: Bool
        public var forceNotification: Bool
        public var apns: APNsExtension
        public init(
            ignoreNotification: Bool = false, forceNotification: Bool = false,
            apns: APNsExtension = APNsExtension()
        ) {
            self.ignoreNotification = ignoreNotification; self.forceNotification = forceNotification; self.apns = apns
        }
    }

    /// The event's values, behind one reference (`CopyOnWrite`): events are copied into caches, records,
    /// decisions and results, and a copy is then one retain.
    struct Values: Sendable, Hashable {
        var eventID: String
        var appID: String
        var kind: Kind
        var createdAt: Int64?
        var sender: Sender
        var conversation: Conversation
        var recipients: [String]?
        var message: Message?
        var call: Call?
        var reaction: Reaction?
        var groupAction: GroupAction?
        var ext: Extension
        var digest: DigestSummary? = nil
    }

    private var values: CopyOnWrite<Values>

    public var eventID: String {
        get { values.value.eventID }
        set { values.modify { $0.eventID = newValue } }
        _modify { yield &values.value.eventID }
    }
    public var appID: String {
        get { values.value.appID }
        set { values.modify { $0.appID = newValue } }
        _modify { yield &values.value.appID }
    }
    public var kind: Kind {
        get { values.value.kind }
        set { values.modify { $0.kind = newValue } }
        _modify { yield &values.value.kind }
    }
    /// Milliseconds since the epoch; the time the suppression rules use when present.
    public var createdAt: Int64? {
        get { values.value.createdAt }
        set { values.modify { $0.createdAt = newValue } }
        _modify { yield &values.value.createdAt }
    }
    public var sender: Sender {
        get { values.value.sender }
        set { values.modify { $0.sender = newValue } }
        _modify { yield &values.value.sender }
    }
    public var conversation: Conversation {
        get { values.value.conversation }
        set { values.modify { $0.conversation = newValue } }
        _modify { yield &values.value.conversation }
    }
    /// Explicit recipients; `nil` means the conversation's members.
    public var recipients: [String]? {
        get { values.value.recipients }
        set { values.modify { $0.recipients = newValue } }
        _modify { yield &values.value.recipients }
    }
    public var message: Message? {
        get { values.value.message }
        set { values.modify { $0.message = newValue } }
        _modify { yield &values.value.message }
    }
    public var call: Call? {
        get { values.value.call }
        set { values.modify { $0.call = newValue } }
        _modify { yield &values.value.call }
    }
    public var reaction: Reaction? {
        get { values.value.reaction }
        set { values.modify { $0.reaction = newValue } }
        _modify { yield &values.value.reaction }
    }
    public var groupAction: GroupAction? {
        get { values.value.groupAction }
        set { values.modify { $0.groupAction = newValue } }
        _modify { yield &values.value.groupAction }
    }
    public var ext: Extension {
        get { values.value.ext }
        set { values.modify { $0.ext = newValue } }
        _modify { yield &values.value.ext }
    }
    /// A digest's counts (docs/behaviour.md §6d): set only on the event of a digest push suppress makes when a user's
    /// Do Not Disturb or snooze ends; never accepted on `chat.events`.
    public var digest: DigestSummary? {
        get { values.value.digest }
        set { values.modify { $0.digest = newValue } }
        _modify { yield &values.value.digest }
    }

    public init(
        eventID: String, appID: String, kind: Kind = .message, createdAt: Int64? = nil, sender: Sender,
        conversation: Conversation, recipients: [String]? = nil, message: Message? = nil, call: Call? = nil,
        reaction: Reaction? = nil, groupAction: GroupAction? = nil, ext: Extension = Extension()
    ) {
        values = CopyOnWrite(
            Values(
                eventID: eventID, appID: appID, kind: kind, createdAt: createdAt, sender: sender,
                conversation: conversation, recipients: recipients, message: message, call: call,
                reaction: reaction, groupAction: groupAction, ext: ext))
    }

    // MARK: Limits (documented in docs/core.md)

    public enum Limits {
        /// Largest accepted event, in bytes.
        public static let eventBytes = 1 << 20
        /// Longest id or name (event id, app id, user ids, conversation id, names), in UTF-8 bytes.
        public static let idBytes = 256
        /// Longest message text, push content, translation or data, in UTF-8 bytes.
        public static let textBytes = 65_536
        /// Longest URL, in UTF-8 bytes.
        public static let urlBytes = 2_048
        /// Most explicit recipients or mentions.
        public static let recipients = 10_000
        /// Largest `message.metadata`, serialized, in bytes.
        public static let metadataBytes = 2_048
        /// Most `message.attachments`.
        public static let attachments = 10
    }

    // MARK: Decoding

    /// Decodes and validates one event from raw bytes (UTF-8 JSON).
    public static func decode(_ bytes: some Collection<UInt8>) throws(FieldError) -> ChatEvent {
        var ignored: [EventDecodeWarning] = []
        return try decode(bytes, warnings: &ignored)
    }

    /// Decodes and validates one event, reporting the values accepted in a vendor REST form (`warnings`).
    public static func decode(
        _ bytes: some Collection<UInt8>,
        warnings: inout [EventDecodeWarning]
    ) throws(FieldError) -> ChatEvent {
        guard bytes.count <= Limits.eventBytes else {
            throw FieldError(field: "(event)", message: "larger than \(Limits.eventBytes) bytes")
        }
        let value: JSONValue
        do {
            value = try JSONValue.parse(bytes)
        } catch {
            throw FieldError(field: "(event)", message: "not valid JSON: \(error.description)")
        }
        return try ChatEvent(validating: value, warnings: &warnings)
    }

    /// Validates an already parsed JSON value.
    public init(validating json: JSONValue) throws(FieldError) {
        var ignored: [EventDecodeWarning] = []
        try self.init(validating: json, warnings: &ignored)
    }

    /// Validates an already parsed JSON value, reporting the values accepted in a vendor REST form.
    public init(validating json: JSONValue, warnings: inout [EventDecodeWarning]) throws(FieldError) {
        let notes = DecodeNotes()
        defer { warnings += notes.warnings }
        let root = try Fields(json, path: "", notes: notes)
        self.init(eventID: "", appID: "", sender: Sender(id: ""), conversation: Conversation(id: "", type: .direct))
        eventID = try root.id("event_id")
        appID = try root.id("app_id")
        let kindRaw = try root.requiredString("kind", limit: Limits.idBytes)
        guard let k = Kind(rawValue: kindRaw) else {
            throw FieldError(
                field: "kind",
                message:
                    "unknown kind \"\(kindRaw)\" (message, call, reaction, group_action, message_edited, message_deleted)"
            )
        }
        kind = k
        createdAt = try root.optionalTimestamp("created_at")

        let s = try root.requiredObject("sender")
        sender = Sender(
            id: try s.id("id"), name: try s.optionalString("name", limit: Limits.idBytes),
            profileURL: try s.optionalString("profile_url", limit: Limits.urlBytes))

        let c = try root.requiredObject("conversation")
        let convID: String
        if c.has("id") {
            convID = try c.id("id")
        } else if c.has("url") {
            convID = try c.id("url")
        } else {
            throw FieldError(field: "conversation.id", message: "missing")
        }
        let typeRaw = try c.requiredString("type", limit: Limits.idBytes)
        guard let ct = ConversationType(rawValue: typeRaw) else {
            throw FieldError(
                field: "conversation.type", message: "unknown type \"\(typeRaw)\" (direct, group, open, supergroup)")
        }
        let channelType = try c.optionalString("channel_type", limit: Limits.idBytes)
        if let channelType, !Conversation.channelTypes.contains(channelType) {
            throw FieldError(
                field: "conversation.channel_type",
                message: "unknown channel type \"\(channelType)\" (messaging, group_messaging, chat)")
        }
        conversation = Conversation(
            id: convID, type: ct, name: try c.optionalString("name", limit: Limits.idBytes),
            customType: try c.optionalString("custom_type", limit: Limits.idBytes), channelType: channelType,
            avatarURL: try c.optionalString("avatar_url", limit: Limits.urlBytes),
            hiddenBy: try c.optionalIDArray("hidden_by") ?? [])

        recipients = try root.optionalIDArray("recipients")

        if let m = try root.optionalObject("message") {
            message = try Self.decodeMessage(m)
        } else {
            message = nil
        }
        if let cl = try root.optionalObject("call") {
            let a = try cl.requiredString("action", limit: Limits.idBytes)
            guard let action = CallAction(rawValue: a) else {
                throw FieldError(field: "call.action", message: "unknown action \"\(a)\"")
            }
            let t = try cl.optionalString("type", limit: Limits.idBytes) ?? "audio"
            guard let type = CallType(rawValue: t) else {
                throw FieldError(field: "call.type", message: "unknown call type \"\(t)\" (audio, video)")
            }
            call = Call(action: action, sessionID: try cl.id("session_id"), type: type)
        } else {
            call = nil
        }
        if let r = try root.optionalObject("reaction") {
            let emoji = try r.requiredString("emoji", limit: Limits.idBytes)
            guard !emoji.isEmpty else { throw FieldError(field: "reaction.emoji", message: "empty") }
            reaction = Reaction(emoji: emoji, messageID: try r.optionalString("message_id", limit: Limits.idBytes))
        } else {
            reaction = nil
        }
        if let g = try root.optionalObject("group_action") {
            var a = try g.requiredString("action", limit: Limits.idBytes)
            if a == "kicked" { a = "removed" }
            guard let action = GroupActionKind(rawValue: a) else {
                throw FieldError(
                    field: "group_action.action",
                    message: "unknown action \"\(a)\" (joined, left, added, removed, banned, unbanned)")
            }
            groupAction = GroupAction(
                action: action, actorName: try g.requiredString("actor_name", limit: Limits.idBytes))
        } else {
            groupAction = nil
        }

        if let d = try root.optionalObject("digest") { digest = try DigestSummary(validating: d) }

        switch kind {
        case .message where message == nil, .messageEdited where message == nil, .messageDeleted where message == nil:
            throw FieldError(field: "message", message: "missing (required when kind is \(kind.rawValue))")
        case .call where call == nil:
            throw FieldError(field: "call", message: "missing (required when kind is call)")
        case .reaction where reaction == nil:
            throw FieldError(field: "reaction", message: "missing (required when kind is reaction)")
        case .groupAction where groupAction == nil:
            throw FieldError(field: "group_action", message: "missing (required when kind is group_action)")
        default: break
        }

        if let e = try root.optionalObject("ext") {
            var x = Extension()
            x.ignoreNotification = try e.optionalBool("em_ignore_notification") ?? false
            x.forceNotification = try e.optionalBool("em_force_notification") ?? false
            if let a = try e.optionalObject("em_apns_ext") {
                var p = APNsExtension()
                p.pushContent = try a.optionalString("em_push_content", limit: Limits.textBytes)
                p.category = try a.optionalString("em_push_category", limit: Limits.idBytes)
                p.sound = try a.optionalString("em_push_sound", limit: Limits.idBytes)
                p.soundSilenced = a.value("em_push_sound") == .null
                p.mutableContent = try a.optionalBool("em_push_mutable_content") ?? false
                p.titleLocKey = try a.optionalString("em_push_title_loc_key", limit: Limits.idBytes)
                p.titleLocArgs = try a.optionalStringArray("em_push_title_loc_args")
                p.bodyLocKey = try a.optionalString("em_push_body_loc_key", limit: Limits.idBytes)
                p.bodyLocArgs = try a.optionalStringArray("em_push_body_loc_args")
                if let ext = a.value("extern"), ext != .null {
                    let size = ext.serialized.utf8.count
                    guard size <= 2_048 else {
                        throw FieldError(field: "ext.em_apns_ext.extern", message: "larger than 2048 bytes")
                    }
                    p.extern = ext
                }
                x.apns = p
            }
            ext = x
        } else {
            ext = Extension()
        }
    }

    static func decodeMessage(_ m: Fields) throws(FieldError) -> Message {
        let id = try m.id("id")
        let typeRaw = try m.optionalString("type", limit: Limits.idBytes) ?? "text"
        guard let type = MessageType(rawValue: typeRaw) else {
            throw FieldError(
                field: "message.type", message: "unknown type \"\(typeRaw)\" (text, file, admin)")
        }
        func readFile(_ f: Fields) throws(FieldError) -> File {
            File(
                name: try f.optionalString("name", limit: Limits.idBytes),
                mimeType: try f.optionalString("mime_type", limit: Limits.idBytes),
                url: try f.optionalString("url", limit: Limits.urlBytes))
        }
        var file: File?
        if let f = try m.optionalObject("file") { file = try readFile(f) }
        var attachments: [File] = []
        if let v = m.value("attachments"), v != .null {
            guard case .array(let items) = v else {
                throw FieldError(field: "message.attachments", message: "expected array, got \(v.typeName)")
            }
            guard items.count <= Limits.attachments else {
                throw FieldError(field: "message.attachments", message: "more than \(Limits.attachments) items")
            }
            for (n, item) in items.enumerated() {
                guard case .object = item else {
                    throw FieldError(
                        field: "message.attachments[\(n)]", message: "expected object, got \(item.typeName)")
                }
                attachments.append(try readFile(try Fields(item, path: "message.attachments[\(n)]", notes: m.notes)))
            }
        }
        var metadata: JSONValue?
        if let v = m.value("metadata"), v != .null {
            guard case .object = v else {
                throw FieldError(field: "message.metadata", message: "expected object, got \(v.typeName)")
            }
            guard v.serialized.utf8.count <= Limits.metadataBytes else {
                throw FieldError(field: "message.metadata", message: "larger than \(Limits.metadataBytes) bytes")
            }
            metadata = v
        }
        if type == .file && file == nil {
            throw FieldError(field: "message.file", message: "missing (required when message.type is file)")
        }
        let mtRaw = try m.optionalString("mention_type", limit: Limits.idBytes) ?? "users"
        guard let mentionType = MentionType(rawValue: mtRaw) else {
            throw FieldError(
                field: "message.mention_type", message: "unknown mention type \"\(mtRaw)\" (users, channel)")
        }
        var translations: [(String, String)] = []
        if let t = try m.optionalObject("translations") {
            for (k, v) in t.pairs {
                guard case .string(let s) = v else {
                    throw FieldError(
                        field: "message.translations.\(k)", message: "expected string, got \(v.typeName)")
                }
                guard !k.isEmpty, k.utf8.count <= 35 else {
                    throw FieldError(field: "message.translations", message: "invalid language tag \"\(k)\"")
                }
                guard s.utf8.count <= Limits.textBytes else {
                    throw FieldError(
                        field: "message.translations.\(k)", message: "longer than \(Limits.textBytes) bytes")
                }
                translations.append((k, s))
            }
        }
        return Message(
            id: id, type: type,
            text: try m.optionalString("text", limit: Limits.textBytes) ?? "",
            customType: try m.optionalString("custom_type", limit: Limits.idBytes) ?? "",
            data: try m.optionalString("data", limit: Limits.textBytes) ?? "",
            file: file,
            mentions: try m.optionalIDArray("mentions") ?? [],
            mentionType: mentionType,
            language: try m.optionalString("language", limit: 35),
            translations: translations, metadata: metadata, attachments: attachments)
    }

    // MARK: Encoding (the normalised event on herald.ingested)

    /// The normalised event as JSON, with the field names of docs/behaviour.md §2.
    public var json: JSONValue {
        var o: [(String, JSONValue)] = [
            ("event_id", .string(eventID)), ("app_id", .string(appID)), ("kind", .string(kind.rawValue)),
        ]
        if let createdAt { o.append(("created_at", .number(String(createdAt)))) }
        var s: [(String, JSONValue)] = [("id", .string(sender.id))]
        if let n = sender.name { s.append(("name", .string(n))) }
        if let p = sender.profileURL { s.append(("profile_url", .string(p))) }
        o.append(("sender", .object(s)))
        var c: [(String, JSONValue)] = [
            ("id", .string(conversation.id)), ("type", .string(conversation.type.rawValue)),
        ]
        if let n = conversation.name { c.append(("name", .string(n))) }
        if let t = conversation.customType { c.append(("custom_type", .string(t))) }
        if let t = conversation.channelType { c.append(("channel_type", .string(t))) }
        if let a = conversation.avatarURL { c.append(("avatar_url", .string(a))) }
        if !conversation.hiddenBy.isEmpty { c.append(("hidden_by", .array(conversation.hiddenBy.map { .string($0) }))) }
        o.append(("conversation", .object(c)))
        if let recipients { o.append(("recipients", .array(recipients.map { .string($0) }))) }
        if let m = message {
            var mo: [(String, JSONValue)] = [
                ("id", .string(m.id)), ("type", .string(m.type.rawValue)), ("text", .string(m.text)),
                ("custom_type", .string(m.customType)), ("data", .string(m.data)),
            ]
            func fileJSON(_ f: File) -> JSONValue {
                var fo: [(String, JSONValue)] = []
                if let n = f.name { fo.append(("name", .string(n))) }
                if let t = f.mimeType { fo.append(("mime_type", .string(t))) }
                if let u = f.url { fo.append(("url", .string(u))) }
                return .object(fo)
            }
            if let f = m.file { mo.append(("file", fileJSON(f))) }
            if !m.attachments.isEmpty { mo.append(("attachments", .array(m.attachments.map(fileJSON)))) }
            if let md = m.metadata { mo.append(("metadata", md)) }
            mo.append(("mentions", .array(m.mentions.map { .string($0) })))
            mo.append(("mention_type", .string(m.mentionType.rawValue)))
            if let l = m.language { mo.append(("language", .string(l))) }
            if !m.translations.isEmpty {
                mo.append(("translations", .object(m.translations.map { ($0.0, .string($0.1)) })))
            }
            o.append(("message", .object(mo)))
        }
        if let cl = call {
            o.append(
                (
                    "call",
                    .object([
                        ("action", .string(cl.action.rawValue)), ("session_id", .string(cl.sessionID)),
                        ("type", .string(cl.type.rawValue)),
                    ])
                ))
        }
        if let r = reaction {
            var ro: [(String, JSONValue)] = [("emoji", .string(r.emoji))]
            if let id = r.messageID { ro.append(("message_id", .string(id))) }
            o.append(("reaction", .object(ro)))
        }
        if let g = groupAction {
            o.append(
                (
                    "group_action",
                    .object([("action", .string(g.action.rawValue)), ("actor_name", .string(g.actorName))])
                ))
        }
        var e: [(String, JSONValue)] = [
            ("em_ignore_notification", .bool(ext.ignoreNotification)),
            ("em_force_notification", .bool(ext.forceNotification)),
        ]
        let a = ext.apns
        if !a.isEmpty {
            var ao: [(String, JSONValue)] = []
            if let v = a.pushContent { ao.append(("em_push_content", .string(v))) }
            if let v = a.category { ao.append(("em_push_category", .string(v))) }
            if let v = a.sound {
                ao.append(("em_push_sound", .string(v)))
            } else if a.soundSilenced {
                ao.append(("em_push_sound", .null))
            }
            if a.mutableContent { ao.append(("em_push_mutable_content", .bool(true))) }
            if let v = a.titleLocKey { ao.append(("em_push_title_loc_key", .string(v))) }
            if let v = a.titleLocArgs { ao.append(("em_push_title_loc_args", .array(v.map { .string($0) }))) }
            if let v = a.bodyLocKey { ao.append(("em_push_body_loc_key", .string(v))) }
            if let v = a.bodyLocArgs { ao.append(("em_push_body_loc_args", .array(v.map { .string($0) }))) }
            if let v = a.extern { ao.append(("extern", v)) }
            e.append(("em_apns_ext", .object(ao)))
        }
        o.append(("ext", .object(e)))
        if let digest { o.append(("digest", digest.json)) }
        return .object(o)
    }

    /// The normalised event as compact JSON bytes.
    public var jsonBytes: [UInt8] {
        var w = JSONWriter(capacity: 1024)
        w.value(json)
        return w.bytes
    }

    // MARK: Derived facts the rules use

    /// Whether `user` is mentioned (explicitly, or by a channel-wide mention).
    public func mentions(_ user: String) -> Bool {
        switch kind {
        case .call, .reaction:
            // A call rings, and a reaction answers, the recipient personally.
            return true
        case .groupAction, .conversationRead:
            return false
        case .message, .messageEdited, .messageDeleted:
            guard let m = message else { return false }
            return m.mentionType == .channel || m.mentions.contains(user)
        }
    }

    /// The time the suppression rules evaluate: `created_at`, else `now`.
    public func ruleTime(now: Int64) -> Int64 { createdAt ?? now }
}

/// A value accepted in a vendor REST form rather than the schema's (docs/behaviour.md §2, lenient input):
/// e.g. `1` for `true`, `"1741847453000"` for a timestamp. Ingest counts them per field
/// (`herald_ingest_warnings_total{field}`) instead of dead-lettering the event.
public struct EventDecodeWarning: Sendable, Hashable, CustomStringConvertible {
    public var field: String
    public var message: String
    public init(field: String, message: String) { self.field = field; self.message = message }
    public var description: String { "\(field): \(message)" }
}

/// Collects the warnings of one decode (shared by the nested `Fields` of one event).
final class DecodeNotes {
    var warnings: [EventDecodeWarning] = []
}

/// A JSON object under validation, with its path for error messages.
struct Fields {
    let pairs: [(String, JSONValue)]
    let path: String
    let notes: DecodeNotes

    init(_ value: JSONValue, path: String, notes: DecodeNotes = DecodeNotes()) throws(FieldError) {
        guard case .object(let p) = value else {
            throw FieldError(
                field: path.isEmpty ? "(event)" : path, message: "expected object, got \(value.typeName)")
        }
        pairs = p
        self.path = path
        self.notes = notes
    }

    func warn(_ key: String, _ message: String) {
        notes.warnings.append(EventDecodeWarning(field: field(key), message: message))
    }

    func field(_ key: String) -> String { path.isEmpty ? key : path + "." + key }

    func has(_ key: String) -> Bool {
        guard let v = value(key) else { return false }
        return v != .null
    }

    func value(_ key: String) -> JSONValue? {
        for (k, v) in pairs where k == key { return v }
        return nil
    }

    func optionalString(_ key: String, limit: Int) throws(FieldError) -> String? {
        guard let v = value(key) else { return nil }
        switch v {
        case .null: return nil
        case .string(let s):
            guard s.utf8.count <= limit else {
                throw FieldError(field: field(key), message: "longer than \(limit) bytes")
            }
            return s
        default:
            throw FieldError(field: field(key), message: "expected string, got \(v.typeName)")
        }
    }

    func requiredString(_ key: String, limit: Int) throws(FieldError) -> String {
        guard let s = try optionalString(key, limit: limit) else {
            throw FieldError(field: field(key), message: "missing")
        }
        return s
    }

    /// A non-empty identifier. Numbers are accepted and kept as written (chat
    /// back ends often send numeric message ids).
    func id(_ key: String) throws(FieldError) -> String {
        guard let v = value(key), v != .null else {
            throw FieldError(field: field(key), message: "missing")
        }
        let s: String
        switch v {
        case .string(let x): s = x
        case .number(let n) where Int64(n) != nil: s = n
        default: throw FieldError(field: field(key), message: "expected string, got \(v.typeName)")
        }
        guard !s.isEmpty else { throw FieldError(field: field(key), message: "empty") }
        guard s.utf8.count <= ChatEvent.Limits.idBytes else {
            throw FieldError(field: field(key), message: "longer than \(ChatEvent.Limits.idBytes) bytes")
        }
        return s
    }

    func optionalBool(_ key: String) throws(FieldError) -> Bool? {
        guard let v = value(key) else { return nil }
        switch v {
        case .null: return nil
        case .bool(let b): return b
        // Vendor REST APIs send flags as 1/0 or as strings; the meaning is clear, so accept with a warning.
        case .number("1"), .number("0"):
            warn(key, "number \(v.serialized) read as a boolean")
            return v == .number("1")
        case .string(let s) where ["true", "false", "1", "0"].contains(s.lowercased()):
            warn(key, "string \"\(s)\" read as a boolean")
            return s.lowercased() == "true" || s == "1"
        default: throw FieldError(field: field(key), message: "expected boolean, got \(v.typeName)")
        }
    }

    func optionalTimestamp(_ key: String) throws(FieldError) -> Int64? {
        guard let v = value(key) else { return nil }
        switch v {
        case .null: return nil
        case .number(let n):
            guard let i = Int64(n) else {
                throw FieldError(
                    field: field(key),
                    message: "expected milliseconds since the epoch (a non-negative integer), got \(n)")
            }
            // A negative time is a number outside its range (`InputRanges.timestampMillis`), not a malformed one.
            if i < 0, let outside = InputRanges.check(i, in: InputRanges.timestampMillis, field: field(key)) {
                throw outside
            }
            return i
        case .string(let s) where !s.isEmpty && s.utf8.count <= 19 && s.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }):
            // CometChat's `sentAt` is a string of digits; the meaning is clear.
            guard let i = Int64(s) else {
                throw FieldError(
                    field: field(key), message: "expected milliseconds since the epoch, got \"\(s)\"")
            }
            warn(key, "numeric string read as a timestamp")
            return i
        default:
            throw FieldError(field: field(key), message: "expected number, got \(v.typeName)")
        }
    }

    func optionalObject(_ key: String) throws(FieldError) -> Fields? {
        guard let v = value(key), v != .null else { return nil }
        return try Fields(v, path: field(key), notes: notes)
    }

    func requiredObject(_ key: String) throws(FieldError) -> Fields {
        guard let f = try optionalObject(key) else {
            throw FieldError(field: field(key), message: "missing")
        }
        return f
    }

    func optionalStringArray(_ key: String) throws(FieldError) -> [String]? {
        guard let v = value(key), v != .null else { return nil }
        guard case .array(let items) = v else {
            throw FieldError(field: field(key), message: "expected array, got \(v.typeName)")
        }
        guard items.count <= 64 else { throw FieldError(field: field(key), message: "more than 64 items") }
        var out: [String] = []
        for (n, item) in items.enumerated() {
            guard case .string(let s) = item else {
                throw FieldError(
                    field: "\(field(key))[\(n)]", message: "expected string, got \(item.typeName)")
            }
            guard s.utf8.count <= ChatEvent.Limits.idBytes else {
                throw FieldError(
                    field: "\(field(key))[\(n)]", message: "longer than \(ChatEvent.Limits.idBytes) bytes")
            }
            out.append(s)
        }
        return out
    }

    func optionalIDArray(_ key: String) throws(FieldError) -> [String]? {
        guard let v = value(key), v != .null else { return nil }
        guard case .array(let items) = v else {
            throw FieldError(field: field(key), message: "expected array, got \(v.typeName)")
        }
        guard items.count <= ChatEvent.Limits.recipients else {
            throw FieldError(field: field(key), message: "more than \(ChatEvent.Limits.recipients) items")
        }
        var out: [String] = []
        out.reserveCapacity(items.count)
        for (n, item) in items.enumerated() {
            let s: String
            switch item {
            case .string(let x): s = x
            case .number(let x) where Int64(x) != nil: s = x
            default:
                throw FieldError(
                    field: "\(field(key))[\(n)]", message: "expected string, got \(item.typeName)")
            }
            guard !s.isEmpty, s.utf8.count <= ChatEvent.Limits.idBytes else {
                throw FieldError(
                    field: "\(field(key))[\(n)]",
                    message: s.isEmpty ? "empty" : "longer than \(ChatEvent.Limits.idBytes) bytes")
            }
            out.append(s)
        }
        return out
    }
}
