// The one JSON codec of Herald's records (the stage records, the DLQ record, the registry and token-feedback
// records, the state fixture and what Redis stores of it): written with JSONWriter and read with the strict JSON
// parser of JSON.swift, each record by exactly one pair of functions here. Field names are snake_case, the names
// of docs/behaviour.md §3 and §10. The records between stages travel in their binary form (BinaryRecord.swift) and
// are read in either form; everything a person or a tool reads (the DLQ, the registry topic, Redis, fixtures)
// is this JSON.

/// A record with Herald's JSON form.
public protocol JSONRecord: Sendable {
    /// Appends the record as one JSON object.
    func write(into w: inout JSONWriter)
    /// Reads the record from a parsed JSON value; the error names the offending field.
    init(json: JSONValue) throws(StageRecordError)
}

extension JSONRecord {
    /// The JSON form (what tools show and what a person may publish by hand).
    public func jsonBytes() -> [UInt8] {
        var w = JSONWriter(capacity: 2048)
        write(into: &w)
        return w.bytes
    }

    public static func fromJSON(_ bytes: some Collection<UInt8>) throws(StageRecordError) -> Self {
        try decoded { () throws(JSONParseError) in try JSONValue.parse(bytes) }
    }

    /// The record of the document `parse` gives, with its errors as `StageRecordError`s.
    static func decoded(_ parse: () throws(JSONParseError) -> JSONValue) throws(StageRecordError) -> Self {
        let value: JSONValue
        do {
            value = try parse()
        } catch {
            throw StageRecordError(record: "\(Self.self)", detail: "(record): not valid JSON: \(error.description)")
        }
        do {
            return try Self(json: value)
        } catch {
            throw StageRecordError(record: "\(Self.self)", detail: error.detail)
        }
    }
}

/// A record a stage puts on Kafka.
public protocol StageRecord: JSONRecord {
    /// The bytes put on Kafka: the binary form for the records between stages (`BinaryRecord`), JSON otherwise.
    func wireBytes() -> [UInt8]
    /// Reads what `wireBytes` wrote; records with a binary form also accept their JSON form.
    static func fromWire(_ bytes: [UInt8]) throws(StageRecordError) -> Self
}

extension StageRecord {
    public func wireBytes() -> [UInt8] { jsonBytes() }
    public static func fromWire(_ bytes: [UInt8]) throws(StageRecordError) -> Self { try fromJSON(bytes) }
}

extension StageRecord where Self: BinaryRecord {
    public func wireBytes() -> [UInt8] { BinaryRecordFormat.encode(self) }

    public static func fromWire(_ bytes: [UInt8]) throws(StageRecordError) -> Self {
        BinaryRecordFormat.isBinary(bytes) ? try BinaryRecordFormat.decode(Self.self, from: bytes) : try fromJSON(bytes)
    }
}

/// Encoding and decoding of Herald's records.
public enum StageCodec {
    /// Encodes a stage record in its wire form (binary between stages, JSON for the DLQ).
    public static func encode<T: StageRecord>(_ record: T) -> [UInt8] { record.wireBytes() }

    /// Decodes a stage record from its wire form (binary or JSON); the error names the offending path.
    public static func decode<T: StageRecord>(
        _ type: T.Type, from bytes: some Collection<UInt8>
    ) throws(StageRecordError) -> T {
        try T.fromWire(Array(bytes))
    }

    /// Encodes a record as JSON (registry and token-feedback records, fixtures, preferences).
    public static func encode<T: JSONRecord>(_ record: T) -> [UInt8] { record.jsonBytes() }

    /// Decodes a record from JSON; the error names the offending path.
    public static func decode<T: JSONRecord>(
        _ type: T.Type, from bytes: some Collection<UInt8>
    ) throws(StageRecordError) -> T {
        try T.fromJSON(bytes)
    }
}

// MARK: Reading helpers

/// A JSON object being read, with its path for errors.
struct RecordReader {
    let pairs: [(String, JSONValue)]
    let path: String

    init(_ value: JSONValue, path: String) throws(StageRecordError) {
        guard case .object(let p) = value else {
            throw StageRecordError(
                record: "", detail: "\(path.isEmpty ? "(record)" : path): expected object, got \(value.typeName)")
        }
        pairs = p
        self.path = path
    }

    func sub(_ key: String) -> String { path.isEmpty ? key : path + "." + key }

    func fail(_ key: String, _ message: String) -> StageRecordError {
        StageRecordError(record: "", detail: "\(sub(key)): \(message)")
    }

    func value(_ key: String) -> JSONValue? {
        for (k, v) in pairs where k == key { return v == .null ? nil : v }
        return nil
    }

    func string(_ key: String) throws(StageRecordError) -> String? {
        guard let v = value(key) else { return nil }
        guard case .string(let s) = v else { throw fail(key, "expected string, got \(v.typeName)") }
        return s
    }

    func requiredString(_ key: String) throws(StageRecordError) -> String {
        guard let s = try string(key) else { throw fail(key, "missing") }
        return s
    }

    func int(_ key: String) throws(StageRecordError) -> Int64? {
        guard let v = value(key) else { return nil }
        guard let i = v.int64Value else {
            throw fail(
                key,
                v.typeName == "number"
                    ? "expected a 64-bit integer, got \(v.serialized)" : "expected integer, got \(v.typeName)")
        }
        return i
    }

    func stringMap<V>(
        _ key: String, _ read: (JSONValue, String) throws(StageRecordError) -> V
    ) throws(StageRecordError) -> [String: V]? {
        guard let o = try object(key) else { return nil }
        var out: [String: V] = [:]
        for (k, v) in o.pairs { out[k] = try read(v, o.sub(k)) }
        return out
    }

    func bool(_ key: String) throws(StageRecordError) -> Bool? {
        guard let v = value(key) else { return nil }
        guard case .bool(let b) = v else { throw fail(key, "expected boolean, got \(v.typeName)") }
        return b
    }

    func object(_ key: String) throws(StageRecordError) -> RecordReader? {
        guard let v = value(key) else { return nil }
        return try RecordReader(v, path: sub(key))
    }

    func array(_ key: String) throws(StageRecordError) -> [JSONValue]? {
        guard let v = value(key) else { return nil }
        guard case .array(let a) = v else { throw fail(key, "expected array, got \(v.typeName)") }
        return a
    }

    func stringArray(_ key: String) throws(StageRecordError) -> [String]? {
        guard let items = try array(key) else { return nil }
        var out: [String] = []
        out.reserveCapacity(items.count)
        for (n, item) in items.enumerated() {
            guard case .string(let s) = item else {
                throw StageRecordError(record: "", detail: "\(sub(key))[\(n)]: expected string, got \(item.typeName)")
            }
            out.append(s)
        }
        return out
    }

    func enumValue<E: RawRepresentable>(_ key: String, _ type: E.Type) throws(StageRecordError) -> E?
    where E.RawValue == String {
        guard let raw = try string(key) else { return nil }
        guard let v = E(rawValue: raw) else { throw fail(key, "unknown value \"\(raw)\"") }
        return v
    }
}

// MARK: State

extension Device: JSONRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"token\":"); w.string(token)
        w.raw(",\"kind\":"); w.string(kind.rawValue)
        // Left out when the registration named none, so that it stays unnamed when read back.
        if let registeredEnvironment { w.raw(",\"environment\":"); w.string(registeredEnvironment.rawValue) }
        if let bundleID { w.raw(",\"bundle_id\":"); w.string(bundleID) }
        w.raw(",\"registered_at\":"); w.int(registeredAt)
        if let providerID { w.raw(",\"provider_id\":"); w.string(providerID) }
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) { try self.init(json: json, path: "device") }

    /// `kind` may be given as CometChat's platform name instead (`platform`: `FCM_ANDROID`, `APNS_iOS_VOIP`, ...).
    init(json: JSONValue, path: String) throws(StageRecordError) {
        let r = try RecordReader(json, path: path)
        var kind = try r.enumValue("kind", Kind.self)
        if kind == nil, let platform = try r.string("platform") {
            guard let k = PushPlatform.kind(for: platform) else {
                throw r.fail("platform", "unknown platform \(platform) (expected a CometChat PushPlatforms name)")
            }
            kind = k
        }
        self.init(
            token: try r.requiredString("token"), kind: kind ?? .apns,
            environment: try r.enumValue("environment", APNsEnvironment.self),
            bundleID: try r.string("bundle_id"), registeredAt: try r.int("registered_at") ?? 0,
            providerID: try r.string("provider_id"))
    }

    /// A device as the state store keeps it (what `write(into:)` writes: one flat object of strings and one
    /// integer), read straight from the bytes without building a JSON tree: resolve reads every recipient's
    /// devices. Anything else (another key, `null`, a duplicate key, a number that is not a plain integer, not
    /// JSON at all) goes through `fromJSON`, so the result, or the error, is always what `fromJSON` gives.
    public static func fromStoredJSON(_ bytes: some Collection<UInt8>) throws(StageRecordError) -> Device {
        let array = Array(bytes)
        return try fromStoredJSON(array, in: 0..<array.count)
    }

    /// `fromStoredJSON` of `range` of `bytes` (one line of a stored field, read without copying it out first).
    public static func fromStoredJSON(_ bytes: [UInt8], in range: Range<Int>) throws(StageRecordError) -> Device {
        if let device = readFlat(bytes, range) { return device }
        return try fromJSON(range == bytes.indices ? bytes : Array(bytes[range]))
    }

    private static func readFlat(_ bytes: [UInt8], _ range: Range<Int>) -> Device? {
        var p = JSONParser(bytes, range: range)
        guard p.take("{") else { return nil }
        var token: String?
        var kind: Kind?
        var environment: APNsEnvironment?
        var bundleID: String?
        var registeredAt: Int64?
        var providerID: String?
        var seen: UInt8 = 0
        while true {
            // The key matched on its bytes: one of the six, written without escapes (any other key is for fromJSON).
            guard let key = p.memberKey() else { return nil }
            p.skipSpace()
            let bit: UInt8
            if p.isKey(key, "token") {
                bit = 1; token = p.flatString()
            } else if p.isKey(key, "kind") {
                bit = 2; kind = p.flatString().flatMap(Kind.init(rawValue:))
            } else if p.isKey(key, "environment") {
                bit = 4; environment = p.flatString().flatMap(APNsEnvironment.init(rawValue:))
            } else if p.isKey(key, "bundle_id") {
                bit = 8; bundleID = p.flatString()
            } else if p.isKey(key, "provider_id") {
                bit = 16; providerID = p.flatString()
            } else if p.isKey(key, "registered_at") {
                bit = 32
                guard let n = p.flatInteger() else { return nil }
                registeredAt = n
            } else {
                return nil
            }
            guard seen & bit == 0 else { return nil }
            seen |= bit
            // A string key whose value was not a plain string (or an unknown kind or environment) is for fromJSON.
            if bit == 1 && token == nil || bit == 2 && kind == nil || bit == 4 && environment == nil
                || bit == 8 && bundleID == nil || bit == 16 && providerID == nil
            {
                return nil
            }
            if p.take(",") { continue }
            guard p.take("}") else { return nil }
            break
        }
        p.skipSpace()
        guard p.i == range.upperBound, let token else { return nil }
        return Device(
            token: token, kind: kind ?? .apns, environment: environment, bundleID: bundleID,
            registeredAt: registeredAt ?? 0, providerID: providerID)
    }

    static func writeList(_ devices: [Device], into w: inout JSONWriter) {
        w.byte(UInt8(ascii: "["))
        for (n, d) in devices.enumerated() {
            if n > 0 { w.byte(UInt8(ascii: ",")) }
            d.write(into: &w)
        }
        w.byte(UInt8(ascii: "]"))
    }

    static func readList(_ items: [JSONValue], path: String) throws(StageRecordError) -> [Device] {
        var out: [Device] = []
        out.reserveCapacity(items.count)
        for (n, item) in items.enumerated() { out.append(try Device(json: item, path: "\(path)[\(n)]")) }
        return out
    }
}

extension UserState: JSONRecord {
    /// Appends the state in the state fixture shape (docs/behaviour.md §3).
    public func write(into w: inout JSONWriter) {
        w.raw("{\"devices\":")
        Device.writeList(devices, into: &w)
        w.raw(",\"online\":"); w.stringArray(online)
        w.raw(",\"preferences\":"); preferences.write(into: &w)
        w.raw(",\"unread\":"); unread.write(into: &w)
        w.byte(UInt8(ascii: "}"))
    }
}

extension Preferences: JSONRecord {
    /// Appends the preferences in the state fixture shape (also what Redis stores).
    public func write(into w: inout JSONWriter) {
        let p = self
        // A field the user never set is left out, so that it stays unset when read back (docs/behaviour.md §3).
        var first = true
        func field(_ name: StaticString, _ w: inout JSONWriter) {
            w.byte(UInt8(ascii: first ? "{" : ",")); first = false
            w.key(name)
        }
        if !p.unset.contains(.trigger) { field("trigger", &w); w.string(p.trigger.rawValue) }
        if !p.conversations.isEmpty {
            field("conversations", &w); w.byte(UInt8(ascii: "{"))
            for (n, (id, c)) in p.conversations.sorted(by: { $0.key < $1.key }).enumerated() {
                if n > 0 { w.byte(UInt8(ascii: ",")) }
                w.key(id)
                w.raw("{\"trigger\":"); w.string(c.trigger.rawValue)
                w.raw(",\"muted\":"); w.bool(c.muted)
                w.byte(UInt8(ascii: "}"))
            }
            w.byte(UInt8(ascii: "}"))
        }
        if let d = p.dnd {
            field("dnd", &w)
            d.write(into: &w)
        }
        if let s = p.snooze {
            field("snooze", &w)
            s.write(into: &w)
        }
        if !p.unset.contains(.template) { field("template", &w); w.string(p.template.rawValue) }
        if !p.unset.contains(.displayStyle) { field("display_style", &w); w.string(p.displayStyle.rawValue) }
        if let name = p.displayName { field("display_name", &w); w.string(name) }
        if let name = p.nickname { field("nickname", &w); w.string(name) }
        if !p.languages.isEmpty { field("languages", &w); w.stringArray(p.languages) }
        field("badge", &w); w.bool(p.badge)
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        self = try Preferences(reader: RecordReader(json, path: "preferences"))
    }
}

extension UserState {
    public init(json: JSONValue) throws(StageRecordError) { try self.init(json: json, path: "state") }

    /// Reads a state in the fixture shape; absent fields take their defaults (a user without `devices` has none:
    /// a user known by preferences alone, whom an every-recipient webhook still reaches).
    public init(json: JSONValue, path: String) throws(StageRecordError) {
        let r = try RecordReader(json, path: path)
        let devices = try r.array("devices") ?? []
        self.init(
            devices: try Device.readList(devices, path: r.sub("devices")), online: try r.stringArray("online") ?? [])
        if let p = try r.object("preferences") { preferences = try Preferences(reader: p) }
        if let u = try r.object("unread") { unread = try Unread(reader: u) }
    }
}

extension Unread {
    init(reader u: RecordReader) throws(StageRecordError) {
        // No `total`: nothing set the total, so it is unknown (no badge, docs/behaviour.md §7).
        self.init(total: try u.int("total").map { Int(clamping: $0) })
        if let convs = try u.object("conversations") {
            for (id, value) in convs.pairs {
                guard let count = value.int64Value else {
                    throw convs.fail(id, "expected integer, got \(value.typeName)")
                }
                conversations[id] = Int(count)
            }
        }
        mentionTotal = Int(try u.int("mention_total") ?? 0)
        if let convs = try u.object("mention_conversations") {
            for (id, value) in convs.pairs {
                guard let count = value.int64Value else {
                    throw convs.fail(id, "expected integer, got \(value.typeName)")
                }
                mentionConversations[id] = Int(count)
            }
        }
        storedMentionedConversations = try u.int("mentioned_conversations").map { Int(clamping: $0) }
    }

    func write(into w: inout JSONWriter) {
        w.byte(UInt8(ascii: "{"))
        var first = true
        if let storedTotal { w.raw("\"total\":"); w.int(storedTotal); first = false }
        if !conversations.isEmpty {
            w.raw(first ? "\"conversations\":{" : ",\"conversations\":{")
            first = false
            for (n, (id, count)) in conversations.sorted(by: { $0.key < $1.key }).enumerated() {
                if n > 0 { w.byte(UInt8(ascii: ",")) }
                w.key(id); w.int(count)
            }
            w.byte(UInt8(ascii: "}"))
        }
        // Herald-kept mention counts (docs/behaviour.md §12), only when not zero.
        if mentionTotal != 0 {
            w.raw(first ? "\"mention_total\":" : ",\"mention_total\":"); w.int(mentionTotal)
            first = false
        }
        if !mentionConversations.isEmpty {
            w.raw(first ? "\"mention_conversations\":{" : ",\"mention_conversations\":{")
            for (n, (id, count)) in mentionConversations.sorted(by: { $0.key < $1.key }).enumerated() {
                if n > 0 { w.byte(UInt8(ascii: ",")) }
                w.key(id); w.int(count)
            }
            w.byte(UInt8(ascii: "}"))
            first = false
        }
        if let n = storedMentionedConversations {
            w.raw(first ? "\"mentioned_conversations\":" : ",\"mentioned_conversations\":"); w.int(n)
        }
        w.byte(UInt8(ascii: "}"))
    }
}

extension StateFixture: JSONRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"users\":{")
        for (n, (id, state)) in users.sorted(by: { $0.key < $1.key }).enumerated() {
            if n > 0 { w.byte(UInt8(ascii: ",")) }
            w.key(id); state.write(into: &w)
        }
        w.raw("},\"conversations\":{")
        for (n, (id, c)) in conversations.sorted(by: { $0.key < $1.key }).enumerated() {
            if n > 0 { w.byte(UInt8(ascii: ",")) }
            w.key(id); w.raw("{\"members\":"); w.stringArray(c.members); w.byte(UInt8(ascii: "}"))
        }
        w.raw("}}")
    }

    public init(json: JSONValue) throws(StageRecordError) {
        let r = try RecordReader(json, path: "")
        self.init(
            users: try r.stringMap("users") { (v, path) throws(StageRecordError) in try UserState(json: v, path: path) }
                ?? [:],
            conversations: try r.stringMap("conversations") { (v, path) throws(StageRecordError) in
                ConversationState(members: try RecordReader(v, path: path).stringArray("members") ?? [])
            } ?? [:])
    }
}

extension Preferences {
    /// Stored preferences of which only `conversations`' settings are needed (resolve's read: the conversations a
    /// user is notified in). The others are checked but never built, so a user with settings in hundreds of
    /// conversations costs little more than one with a few; text `fromJSON` refuses is refused the same way.
    public static func fromJSON(
        _ bytes: some Collection<UInt8>, conversations: [String]
    ) throws(StageRecordError) -> Preferences {
        try decoded { () throws(JSONParseError) in
            try JSONValue.parse(bytes, pruning: "conversations", keeping: conversations)
        }
    }

    /// Stored preferences as the state store keeps them, read straight from the bytes when they are in the shape
    /// `write(into:)` gives (each key once, each value a plain string, integer, boolean or list of strings, each
    /// conversation's setting as `{"trigger":...,"muted":...}`), without building a JSON tree: resolve reads every
    /// recipient's. Anything else goes through `fromJSON`, so the result, or the error, is always what `fromJSON`
    /// gives (with `conversations`, what `fromJSON(_:conversations:)` gives).
    public static func fromStoredJSON(
        _ bytes: some Collection<UInt8>, conversations: [String]? = nil
    ) throws(StageRecordError) -> Preferences {
        let array = Array(bytes)
        if let prefs = readFlat(array, keeping: conversations) { return prefs }
        if let conversations { return try fromJSON(array, conversations: conversations) }
        return try fromJSON(array)
    }

    private static func readFlat(_ bytes: [UInt8], keeping: [String]?) -> Preferences? {
        // Straight-line reads on the parser (no closures over it: a captured variable is checked for exclusive
        // access on every use).
        var p = JSONParser(bytes)
        var prefs = Preferences()
        var seen: UInt16 = 0
        guard p.take("{") else { return nil }
        var more = !p.take("}")
        while more {
            guard let name = p.memberKey() else { return nil }
            let bit: UInt16
            if p.isKey(name, "trigger") {
                bit = 1
                guard let v = p.plainString().flatMap(PushTrigger.init(rawValue:)) else { return nil }
                prefs.trigger = v
            } else if p.isKey(name, "conversations") {
                bit = 2
                guard p.take("{") else { return nil }
                var moreConversations = !p.take("}")
                while moreConversations {
                    guard let id = p.memberKey(), p.take("{"), p.key("trigger"),
                        let trigger = p.plainString().flatMap(ConversationTrigger.init(rawValue:)), p.take(","),
                        p.key("muted"), let muted = p.plainBool(), p.take("}")
                    else { return nil }
                    // ASCII ids only: Swift compares and keys strings by canonical equivalence, not by bytes.
                    let idBytes = bytes[id]
                    guard idBytes.allSatisfy({ $0 < 0x80 }) else { return nil }
                    if keeping?.contains(where: { $0.utf8.elementsEqual(idBytes) }) ?? true {
                        prefs.conversations[String(decoding: idBytes, as: UTF8.self)] = ConversationPreference(
                            trigger: trigger, muted: muted)
                    }
                    if p.take(",") { continue }
                    guard p.take("}") else { return nil }
                    moreConversations = false
                }
            } else if p.isKey(name, "dnd") {
                bit = 4
                guard p.take("{"), p.key("start"), let start = p.plainString().flatMap(ClockTime.init), p.take(","),
                    p.key("end"), let end = p.plainString().flatMap(ClockTime.init), p.take(","), p.key("timezone"),
                    let zone = p.plainString(), p.take("}")
                else { return nil }
                prefs.dnd = DoNotDisturb(start: start, end: end, timezone: zone)
            } else if p.isKey(name, "snooze") {
                bit = 8
                guard p.take("{"), p.key("start"), let start = p.plainInteger(), p.take(","), p.key("end"),
                    let end = p.plainInteger(), p.take("}")
                else { return nil }
                prefs.snooze = Snooze(start: start, end: end)
            } else if p.isKey(name, "template") {
                bit = 16
                guard let v = p.plainString().flatMap(TemplateChoice.init(rawValue:)) else { return nil }
                prefs.template = v
            } else if p.isKey(name, "display_style") {
                bit = 32
                switch p.plainString() {
                case "summary": prefs.displayStyle = .summary
                case "simple_banner", "simple", "simple banner": prefs.displayStyle = .simpleBanner
                default: return nil
                }
            } else if p.isKey(name, "display_name") {
                bit = 64
                guard let v = p.plainString() else { return nil }
                prefs.displayName = v
            } else if p.isKey(name, "languages") {
                bit = 128
                guard p.take("[") else { return nil }
                var languages: [String] = []
                if !p.take("]") {
                    repeat {
                        guard let v = p.plainString() else { return nil }
                        languages.append(v)
                    } while p.take(",")
                    guard p.take("]") else { return nil }
                }
                prefs.languages = Array(languages.prefix(Preferences.maxLanguages))
            } else if p.isKey(name, "badge") {
                bit = 256
                guard let v = p.plainBool() else { return nil }
                prefs.badge = v
            } else if p.isKey(name, "nickname") {
                bit = 512
                guard let v = p.plainString() else { return nil }
                prefs.nickname = v
            } else {
                return nil
            }
            guard seen & bit == 0 else { return nil }
            seen |= bit
            if p.take(",") { continue }
            guard p.take("}") else { return nil }
            more = false
        }
        p.skipSpace()
        return p.i == bytes.count ? prefs : nil
    }

    init(reader p: RecordReader) throws(StageRecordError) {
        var prefs = Preferences()
        // Absent trigger, template and display style stay unset (the app's user_defaults may fill them).
        if let v = try p.enumValue("trigger", PushTrigger.self) { prefs.trigger = v }
        if let convs = try p.object("conversations") {
            for (id, value) in convs.pairs {
                let c = try RecordReader(value, path: convs.sub(id))
                prefs.conversations[id] = ConversationPreference(
                    trigger: try c.enumValue("trigger", ConversationTrigger.self) ?? .default,
                    muted: try c.bool("muted") ?? false)
            }
        }
        if let d = try p.object("dnd") {
            guard let start = ClockTime(try d.requiredString("start")) else { throw d.fail("start", "expected HH:mm") }
            guard let end = ClockTime(try d.requiredString("end")) else { throw d.fail("end", "expected HH:mm") }
            prefs.dnd = DoNotDisturb(start: start, end: end, timezone: try d.string("timezone") ?? "UTC")
        }
        if let s = try p.object("snooze") {
            guard let start = try s.int("start") else { throw s.fail("start", "missing") }
            guard let end = try s.int("end") else { throw s.fail("end", "missing") }
            prefs.snooze = Snooze(start: start, end: end)
        }
        if let v = try p.enumValue("template", TemplateChoice.self) { prefs.template = v }
        if let style = try p.string("display_style") {
            switch style {
            case "summary": prefs.displayStyle = .summary
            case "simple_banner", "simple", "simple banner": prefs.displayStyle = .simpleBanner
            default: throw p.fail("display_style", "unknown value \"\(style)\"")
            }
        }
        prefs.displayName = try p.string("display_name")
        prefs.nickname = try p.string("nickname")
        prefs.languages = Array((try p.stringArray("languages") ?? []).prefix(Preferences.maxLanguages))
        prefs.badge = try p.bool("badge") ?? true
        self = prefs
    }

}

// MARK: Records

func readEvent(_ r: RecordReader) throws(StageRecordError) -> ChatEvent {
    guard let v = r.value("event") else { throw r.fail("event", "missing") }
    do {
        return try ChatEvent(validating: v)
    } catch {
        throw StageRecordError(record: "", detail: "event.\(error.field): \(error.message)")
    }
}

extension IngestedRecord: StageRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"event\":"); w.value(event.json)
        w.raw(",\"ingested_at\":"); w.int(ingestedAt)
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        let r = try RecordReader(json, path: "")
        self.init(event: try readEvent(r), ingestedAt: try r.int("ingested_at") ?? 0)
    }
}

extension ResolvedRecord: StageRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"event\":"); w.value(event.json)
        w.raw(",\"recipient\":"); w.string(recipient)
        w.raw(",\"state\":"); state.write(into: &w)
        if let senderDisplayName { w.raw(",\"sender_display_name\":"); w.string(senderDisplayName) }
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        let r = try RecordReader(json, path: "")
        guard let state = r.value("state") else { throw r.fail("state", "missing") }
        self.init(
            event: try readEvent(r), recipient: try r.requiredString("recipient"),
            state: try UserState(json: state), senderDisplayName: try r.string("sender_display_name"))
    }
}

extension DeliverableRecord: StageRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"event\":"); w.value(event.json)
        w.raw(",\"recipient\":"); w.string(recipient)
        w.raw(",\"state\":"); state.write(into: &w)
        w.raw(",\"targets\":"); Device.writeList(targets, into: &w)
        if let senderDisplayName { w.raw(",\"sender_display_name\":"); w.string(senderDisplayName) }
        if let burst { w.raw(",\"burst\":"); w.int(burst) }
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        let r = try RecordReader(json, path: "")
        guard let state = r.value("state") else { throw r.fail("state", "missing") }
        guard let targets = try r.array("targets") else { throw r.fail("targets", "missing") }
        self.init(
            event: try readEvent(r), recipient: try r.requiredString("recipient"),
            state: try UserState(json: state), targets: try Device.readList(targets, path: "targets"),
            senderDisplayName: try r.string("sender_display_name"))
        burst = try r.int("burst").map { Int(clamping: $0) }
    }
}

extension PushRequest {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"token\":"); w.string(token)
        w.raw(",\"environment\":"); w.string(environment.rawValue)
        w.raw(",\"push_type\":"); w.string(pushType.rawValue)
        w.raw(",\"topic\":"); w.string(topic)
        w.raw(",\"priority\":"); w.int(priority)
        w.raw(",\"collapse_id\":")
        if let collapseID { w.string(collapseID) } else { w.null() }
        w.raw(",\"expiration\":"); w.int(expiration)
        w.raw(",\"apns_id\":"); w.string(apnsID)
        w.raw(",\"payload\":"); w.string(String(decoding: payload, as: UTF8.self))
        if provider != .apns { w.raw(",\"provider\":"); w.string(provider.rawValue) }
        if let providerID { w.raw(",\"provider_id\":"); w.string(providerID) }
        if !guesses.isEmpty {
            var names: [String] = []
            if guesses.contains(.environment) { names.append("environment") }
            if guesses.contains(.topic) { names.append("topic") }
            if guesses.contains(.otherEnvironment) { names.append("other_environment") }
            w.raw(",\"guessed\":"); w.stringArray(names)
        }
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue, path: String = "request") throws(StageRecordError) {
        let r = try RecordReader(json, path: path)
        guard let pushType = try r.enumValue("push_type", PushType.self) else { throw r.fail("push_type", "missing") }
        guard let priority = try r.int("priority") else { throw r.fail("priority", "missing") }
        self.init(
            token: try r.requiredString("token"),
            environment: try r.enumValue("environment", APNsEnvironment.self) ?? .production,
            pushType: pushType, topic: try r.requiredString("topic"), priority: Int(priority),
            collapseID: try r.string("collapse_id"), expiration: try r.int("expiration") ?? 0,
            apnsID: try r.requiredString("apns_id"), payload: Array(try r.requiredString("payload").utf8),
            provider: try r.enumValue("provider", PushProvider.self) ?? .apns, providerID: try r.string("provider_id"))
        for name in try r.stringArray("guessed") ?? [] {
            switch name {
            case "environment": guesses.insert(.environment)
            case "topic": guesses.insert(.topic)
            case "other_environment": guesses.insert(.otherEnvironment)
            default: throw r.fail("guessed", "unknown \(name) (environment, topic, other_environment)")
            }
        }
    }
}

extension OutboundRecord: StageRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"event_id\":"); w.string(eventID)
        w.raw(",\"app_id\":"); w.string(appID)
        w.raw(",\"recipient\":"); w.string(recipient)
        w.raw(",\"request\":"); request.write(into: &w)
        w.raw(",\"attempt\":"); w.int(attempt)
        if let notBefore { w.raw(",\"not_before\":"); w.int(notBefore) }
        if let eventCreatedAt { w.raw(",\"event_created_at\":"); w.int(eventCreatedAt) }
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        let r = try RecordReader(json, path: "")
        guard let request = r.value("request") else { throw r.fail("request", "missing") }
        self.init(
            eventID: try r.requiredString("event_id"), appID: try r.requiredString("app_id"),
            recipient: try r.requiredString("recipient"), request: try PushRequest(json: request),
            attempt: Int(try r.int("attempt") ?? 1), notBefore: try r.int("not_before"),
            eventCreatedAt: try r.int("event_created_at"))
    }
}

extension DLQRecord: StageRecord {
    public func write(into w: inout JSONWriter) {
        w.raw("{\"original\":"); w.string(original)
        if let sourceTopic { w.raw(",\"source_topic\":"); w.string(sourceTopic) }
        if let sourcePartition { w.raw(",\"source_partition\":"); w.int(Int64(sourcePartition)) }
        if let sourceOffset { w.raw(",\"source_offset\":"); w.int(sourceOffset) }
        if let targetTopic { w.raw(",\"target_topic\":"); w.string(targetTopic) }
        if truncated {
            w.raw(",\"truncated\":true")
            if let originalSize { w.raw(",\"original_size\":"); w.int(originalSize) }
            if let originalSHA256 { w.raw(",\"original_sha256\":"); w.string(originalSHA256) }
        }
        w.raw(",\"stage\":"); w.string(stage)
        w.raw(",\"reason\":"); w.string(reason)
        w.raw(",\"detail\":"); w.string(detail)
        w.raw(",\"time\":"); w.int(time)
        w.byte(UInt8(ascii: "}"))
    }

    public init(json: JSONValue) throws(StageRecordError) {
        let r = try RecordReader(json, path: "")
        self.init(
            encodedOriginal: try r.requiredString("original"), sourceTopic: try r.string("source_topic"),
            sourcePartition: try r.int("source_partition").map { Int32(clamping: $0) },
            sourceOffset: try r.int("source_offset"), targetTopic: try r.string("target_topic"),
            originalSize: try r.int("original_size").map { Int($0) },
            originalSHA256: try r.string("original_sha256"), truncated: try r.bool("truncated") ?? false,
            stage: try r.requiredString("stage"), reason: try r.requiredString("reason"),
            detail: try r.string("detail") ?? "", time: try r.int("time") ?? 0)
    }
}

extension DoNotDisturb {
    /// `{"start":"HH:MM","end":"HH:MM","timezone":...}`: a preference's and a preference patch's form.
    public func write(into w: inout JSONWriter) {
        w.raw("{\"start\":"); w.string(start.description)
        w.raw(",\"end\":"); w.string(end.description)
        w.raw(",\"timezone\":"); w.string(timezone)
        w.byte(UInt8(ascii: "}"))
    }
}

extension Snooze {
    /// `{"start":ms,"end":ms}`: a preference's and a preference patch's form.
    public func write(into w: inout JSONWriter) {
        w.raw("{\"start\":"); w.int(start)
        w.raw(",\"end\":"); w.int(end)
        w.byte(UInt8(ascii: "}"))
    }
}
