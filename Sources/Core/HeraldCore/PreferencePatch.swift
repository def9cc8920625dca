// A change to some of a user's preferences (docs/behaviour.md §3), applied field by field so that two writers who
// change different fields never lose each other's change. The registry API's PATCH body, `heraldctl prefs set`
// and the `patch_preferences` record of herald.registry all become one `PreferencePatch`; the Redis adapter
// applies it inside one Lua script (docs/redis-keys.md), `apply(to:)` is the same rule in Swift.

import Foundation

/// Which preference fields to set, which to clear (back to the default), and per conversation which of
/// `trigger` / `muted` to set or which conversation entries to remove. Fields not named keep their stored value.
///
/// The record form (`patch` of a `patch_preferences` record, and what the Lua script reads):
/// ```json
/// {"set": {"trigger": "mention_only", "dnd": {"start": "22:00", "end": "08:00", "timezone": "Asia/Seoul"}},
///  "clear": ["snooze"], "conversations": {"c1": {"muted": true}}, "remove_conversations": ["c2"]}
/// ```
public struct PreferencePatch: Sendable, Hashable {
    /// Preference fields to set; nil means "leave as stored".
    public struct Fields: Sendable, Hashable {
        public var trigger: PushTrigger?
        public var dnd: DoNotDisturb?
        public var snooze: Snooze?
        public var template: TemplateChoice?
        public var displayStyle: DisplayStyle?
        public var displayName: String?
        public var nickname: String?
        public var languages: [String]?
        public var badge: Bool?

        public init() {}
    }

    /// One conversation's fields to set.
    public struct ConversationFields: Sendable, Hashable {
        public var trigger: ConversationTrigger?
        public var muted: Bool?

        public init(trigger: ConversationTrigger? = nil, muted: Bool? = nil) {
            self.trigger = trigger
            self.muted = muted
        }
    }

    /// The fields a patch may clear. A cleared `trigger`, `template` or `display_style` is unset again (the app's
    /// `user_defaults`, else the built-in default); a cleared `badge` is back to on; a cleared `dnd`, `snooze`,
    /// `display_name`, `nickname` or `languages` is absent.
    public enum Field: String, Sendable, Hashable, CaseIterable {
        case trigger, dnd, snooze, template, languages, badge
        case displayStyle = "display_style"
        case displayName = "display_name"
        case nickname
    }

    public var set: Fields
    public var clear: [Field]
    public var conversations: [String: ConversationFields]
    public var removeConversations: [String]

    public init(
        set: Fields = Fields(), clear: [Field] = [], conversations: [String: ConversationFields] = [:],
        removeConversations: [String] = []
    ) {
        self.set = set
        self.clear = clear
        self.conversations = conversations
        self.removeConversations = removeConversations
    }

    /// True when the patch changes nothing.
    public var isEmpty: Bool {
        self.set == Fields() && clear.isEmpty && conversations.isEmpty && removeConversations.isEmpty
    }

    /// The patch applied to `preferences`: what the Lua script stores (docs/redis-keys.md), in Swift.
    public func apply(to preferences: Preferences) -> Preferences {
        var p = preferences
        if let v = set.trigger { p.trigger = v }
        if let v = set.dnd { p.dnd = v }
        if let v = set.snooze { p.snooze = v }
        if let v = set.template { p.template = v }
        if let v = set.displayStyle { p.displayStyle = v }
        if let v = set.displayName { p.displayName = v }
        if let v = set.nickname { p.nickname = v }
        if let v = set.languages { p.languages = Array(v.prefix(Preferences.maxLanguages)) }
        if let v = set.badge { p.badge = v }
        for field in clear {
            switch field {
            case .trigger: p.trigger = .all; p.unset.insert(.trigger)
            case .dnd: p.dnd = nil
            case .snooze: p.snooze = nil
            case .template: p.template = .default; p.unset.insert(.template)
            case .languages: p.languages = []
            case .badge: p.badge = true
            case .displayStyle: p.displayStyle = .summary; p.unset.insert(.displayStyle)
            case .displayName: p.displayName = nil
            case .nickname: p.nickname = nil
            }
        }
        for (id, fields) in conversations {
            var c = p.conversation(id)
            if let t = fields.trigger { c.trigger = t }
            if let m = fields.muted { c.muted = m }
            p.conversations[id] = c
        }
        for id in removeConversations { p.conversations[id] = nil }
        return p
    }

    /// Most conversations one patch may touch.
    public static let maxConversations = 1000

    /// Reads the API's PATCH body: an object with any of the preference fields of docs/behaviour.md §3, each
    /// set to its new value, or to `null` to clear it; `conversations` maps a conversation id to
    /// `{"trigger": ..., "muted": ...}` (either or both) or to `null` to remove that conversation's settings.
    /// An unknown field or a value of the wrong form is a `FieldError` naming the field.
    public static func parse(_ body: some Collection<UInt8>) throws(FieldError) -> PreferencePatch {
        var patch = PreferencePatch()
        for (key, value) in try JSONValue.bodyObject(body) {
            if case .null = value {
                if key == "conversations" {
                    throw FieldError(field: key, message: "cannot be null (give the conversations to change)")
                }
                guard let field = Field(rawValue: key) else { throw unknownField(key) }
                patch.clear.append(field)
                continue
            }
            switch key {
            case "trigger": patch.set.trigger = try enumValue(value, key, PushTrigger.self)
            case "template": patch.set.template = try enumValue(value, key, TemplateChoice.self)
            case "display_style":
                let raw = try string(value, key)
                switch raw {
                case "summary": patch.set.displayStyle = .summary
                case "simple_banner", "simple": patch.set.displayStyle = .simpleBanner
                default: throw FieldError(field: key, message: "expected summary or simple_banner, got \"\(raw)\"")
                }
            case "display_name":
                if let name = try name(value, key) {
                    patch.set.displayName = name
                } else {
                    patch.clear.append(.displayName)
                }
            case "nickname":
                if let name = try name(value, key) { patch.set.nickname = name } else { patch.clear.append(.nickname) }
            case "badge": patch.set.badge = try bool(value, key)
            case "languages":
                guard case .array(let items) = value else {
                    throw FieldError(field: key, message: "expected an array of language codes, got \(value.typeName)")
                }
                guard items.count <= Preferences.maxLanguages else {
                    throw FieldError(field: key, message: "at most \(Preferences.maxLanguages) languages")
                }
                var languages: [String] = []
                for (i, item) in items.enumerated() {
                    let code = try string(item, "\(key)[\(i)]")
                    guard !code.isEmpty, code.utf8.count <= 35,
                        code.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") })
                    else {
                        throw FieldError(
                            field: "\(key)[\(i)]", message: "expected a language code such as \"fr\" or \"zh-Hans\"")
                    }
                    languages.append(code)
                }
                if languages.isEmpty { patch.clear.append(.languages) } else { patch.set.languages = languages }
            case "dnd": patch.set.dnd = try dnd(value)
            case "snooze": patch.set.snooze = try snooze(value)
            case "conversations":
                guard case .object(let entries) = value else {
                    throw FieldError(
                        field: key, message: "expected an object of conversation id -> settings, got \(value.typeName)")
                }
                guard entries.count <= maxConversations else {
                    throw FieldError(field: key, message: "at most \(maxConversations) conversations per request")
                }
                for (id, entry) in entries {
                    let path = "conversations.\(id)"
                    guard !id.isEmpty, id.utf8.count <= 256 else {
                        throw FieldError(field: path, message: "a conversation id is 1 to 256 bytes")
                    }
                    if case .null = entry {
                        patch.removeConversations.append(id)
                        continue
                    }
                    guard case .object(let fields) = entry else {
                        throw FieldError(
                            field: path,
                            message: "expected {\"trigger\": ..., \"muted\": ...} or null, got \(entry.typeName)")
                    }
                    var c = ConversationFields()
                    for (name, v) in fields {
                        switch name {
                        case "trigger": c.trigger = try enumValue(v, "\(path).trigger", ConversationTrigger.self)
                        case "muted": c.muted = try bool(v, "\(path).muted")
                        default:
                            throw FieldError(field: "\(path).\(name)", message: "unknown field (known: muted, trigger)")
                        }
                    }
                    if c == ConversationFields() {
                        throw FieldError(
                            field: path,
                            message: "give trigger and/or muted, or null to remove the conversation's settings")
                    }
                    patch.conversations[id] = c
                }
            default:
                throw unknownField(key)
            }
        }
        if patch.isEmpty { throw FieldError(field: "(body)", message: "names no preference field") }
        return patch
    }

    private static func unknownField(_ key: String) -> FieldError {
        let known = (Field.allCases.map(\.rawValue) + ["conversations"]).sorted().joined(separator: ", ")
        return FieldError(field: key, message: "unknown field (known: \(known))")
    }

    private static func string(_ value: JSONValue, _ field: String) throws(FieldError) -> String {
        guard case .string(let s) = value else {
            throw FieldError(field: field, message: "expected a string, got \(value.typeName)")
        }
        return s
    }

    /// A name field (`display_name`, `nickname`): at most 256 bytes; nil for the empty string, which clears it.
    private static func name(_ value: JSONValue, _ field: String) throws(FieldError) -> String? {
        let name = try string(value, field)
        guard name.utf8.count <= 256 else { throw FieldError(field: field, message: "longer than 256 bytes") }
        return name.isEmpty ? nil : name
    }

    private static func bool(_ value: JSONValue, _ field: String) throws(FieldError) -> Bool {
        guard case .bool(let b) = value else {
            throw FieldError(field: field, message: "expected true or false, got \(value.typeName)")
        }
        return b
    }

    private static func int64(_ value: JSONValue, _ field: String) throws(FieldError) -> Int64 {
        guard case .number(let n) = value, let i = Int64(n), i >= 0 else {
            throw FieldError(
                field: field, message: "expected epoch milliseconds (a non-negative integer), got \(value.serialized)")
        }
        return i
    }

    private static func enumValue<E: RawRepresentable & CaseIterable>(
        _ value: JSONValue, _ field: String,
        _ type: E.Type
    ) throws(FieldError) -> E where E.RawValue == String {
        let raw = try string(value, field)
        guard let v = E(rawValue: raw) else {
            throw FieldError(
                field: field,
                message: "expected one of \(E.allCases.map(\.rawValue).joined(separator: ", ")), got \"\(raw)\"")
        }
        return v
    }

    private static func dnd(_ value: JSONValue) throws(FieldError) -> DoNotDisturb {
        guard case .object(let fields) = value else {
            throw FieldError(
                field: "dnd", message: "expected {\"start\": \"HH:mm\", \"end\": \"HH:mm\", \"timezone\": ...} or null")
        }
        var start: ClockTime?, end: ClockTime?, zone = "UTC"
        for (name, v) in fields {
            switch name {
            case "start", "end":
                let raw = try string(v, "dnd.\(name)")
                guard let t = ClockTime(raw) else {
                    throw FieldError(
                        field: "dnd.\(name)", message: "expected HH:mm between 00:00 and 24:00, got \"\(raw)\"")
                }
                if name == "start" { start = t } else { end = t }
            case "timezone":
                zone = try string(v, "dnd.timezone")
                guard TimeZone(identifier: zone) != nil else {
                    throw FieldError(field: "dnd.timezone", message: "unknown IANA time zone \"\(zone)\"")
                }
            default:
                throw FieldError(field: "dnd.\(name)", message: "unknown field (known: end, start, timezone)")
            }
        }
        guard let start else { throw FieldError(field: "dnd.start", message: "missing") }
        guard let end else { throw FieldError(field: "dnd.end", message: "missing") }
        return DoNotDisturb(start: start, end: end, timezone: zone)
    }

    private static func snooze(_ value: JSONValue) throws(FieldError) -> Snooze {
        guard case .object(let fields) = value else {
            throw FieldError(field: "snooze", message: "expected {\"start\": ms, \"end\": ms} or null")
        }
        var start: Int64?, end: Int64?
        for (name, v) in fields {
            switch name {
            case "start": start = try int64(v, "snooze.start")
            case "end": end = try int64(v, "snooze.end")
            default: throw FieldError(field: "snooze.\(name)", message: "unknown field (known: end, start)")
            }
        }
        guard let start else { throw FieldError(field: "snooze.start", message: "missing") }
        guard let end else { throw FieldError(field: "snooze.end", message: "missing") }
        guard start <= end else { throw FieldError(field: "snooze.end", message: "before snooze.start") }
        return Snooze(start: start, end: end)
    }
}

// MARK: JSON (the record form: `patch` of a `patch_preferences` record, and what the Lua script reads)

extension PreferencePatch: JSONRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"set\":{")
        var first = true
        func field(_ name: String, _ w: inout JSONWriter) {
            if !first { w.byte(UInt8(ascii: ",")) }
            first = false
            w.key(name)
        }
        if let v = set.trigger { field("trigger", &w); w.string(v.rawValue) }
        if let d = set.dnd {
            field("dnd", &w)
            d.write(into: &w)
        }
        if let v = set.snooze {
            field("snooze", &w)
            v.write(into: &w)
        }
        if let v = set.template { field("template", &w); w.string(v.rawValue) }
        if let v = set.displayStyle { field("display_style", &w); w.string(v.rawValue) }
        if let v = set.displayName { field("display_name", &w); w.string(v) }
        if let v = set.nickname { field("nickname", &w); w.string(v) }
        if let v = set.languages { field("languages", &w); w.stringArray(v) }
        if let v = set.badge { field("badge", &w); w.bool(v) }
        w.raw("},\"clear\":"); w.stringArray(clear.map(\.rawValue))
        w.raw(",\"conversations\":{")
        for (n, (id, c)) in conversations.sorted(by: { $0.key < $1.key }).enumerated() {
            if n > 0 { w.byte(UInt8(ascii: ",")) }
            w.key(id)
            w.byte(UInt8(ascii: "{"))
            if let t = c.trigger { w.raw("\"trigger\":"); w.string(t.rawValue) }
            if let m = c.muted {
                if c.trigger != nil { w.byte(UInt8(ascii: ",")) }
                w.raw("\"muted\":"); w.bool(m)
            }
            w.byte(UInt8(ascii: "}"))
        }
        w.raw("},\"remove_conversations\":"); w.stringArray(removeConversations)
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        try self.init(reader: RecordReader(json, path: "patch"))
    }

    init(reader r: RecordReader) throws(StageRecordError) {
        var patch = PreferencePatch()
        if let f = try r.object("set") {
            // The stored preference form: read through the preferences' own reader, field by field.
            let stored = try Preferences(reader: f)
            if f.value("trigger") != nil { patch.set.trigger = stored.trigger }
            if f.value("dnd") != nil { patch.set.dnd = stored.dnd }
            if f.value("snooze") != nil { patch.set.snooze = stored.snooze }
            if f.value("template") != nil { patch.set.template = stored.template }
            if f.value("display_style") != nil { patch.set.displayStyle = stored.displayStyle }
            if f.value("display_name") != nil { patch.set.displayName = stored.displayName }
            if f.value("nickname") != nil { patch.set.nickname = stored.nickname }
            if f.value("languages") != nil { patch.set.languages = stored.languages }
            if f.value("badge") != nil { patch.set.badge = stored.badge }
        }
        for (n, name) in (try r.stringArray("clear") ?? []).enumerated() {
            guard let field = Field(rawValue: name) else { throw r.fail("clear[\(n)]", "unknown field \"\(name)\"") }
            patch.clear.append(field)
        }
        if let convs = try r.object("conversations") {
            for (id, value) in convs.pairs {
                let c = try RecordReader(value, path: convs.sub(id))
                patch.conversations[id] = ConversationFields(
                    trigger: try c.enumValue("trigger", ConversationTrigger.self), muted: try c.bool("muted"))
            }
        }
        patch.removeConversations = try r.stringArray("remove_conversations") ?? []
        self = patch
    }
}
