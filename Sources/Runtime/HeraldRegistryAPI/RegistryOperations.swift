import Foundation
import HeraldCore
import HeraldKafka
import HeraldRedis

// The registry operations, written once: the HTTP API (RegistryAPI) and heraldctl both turn their input into the
// same `herald.registry` records here and read state through the same calls. Writes are records on
// herald.registry, keyed by user id, so herald-registry applies one user's changes in the order they were made.

/// Where registry records go: herald.registry (`KafkaRegistrySink`), or straight to Redis in tests and tools.
public protocol RegistryRecordSink: Sendable {
    /// Returns once the record is stored for good (the broker acknowledged it).
    func publish(_ record: RegistryRecord) async throws
}

/// herald.registry through an idempotent producer; keyed by `RegistryRecord.key` (the user id).
public struct KafkaRegistrySink: RegistryRecordSink {
    public let producer: KafkaProducer
    public let topic: String

    public init(producer: KafkaProducer, topic: String) {
        self.producer = producer
        self.topic = topic
    }

    public func publish(_ record: RegistryRecord) async throws {
        let value = try StageCodec.encode(record)
        let report = try await producer.send(ProducerRecord(topic: topic, key: record.key, value: value))
        try report.get()
    }
}

/// The operations of the registry API and heraldctl (docs/registry-api.md): builders that validate input and
/// make records, and the reads.
public struct RegistryOperations: Sendable {
    public let sink: any RegistryRecordSink
    public let store: StateStore
    public let explain: ExplainStore
    public let now: @Sendable () -> Int64
    /// send's replay window (the pipeline file's `idempotency.replay_window_seconds`): where the explain read
    /// finds the devices a routine delivery left no trail entry for.
    public var replayWindowMilliseconds = StateStore.defaultReplayWindowMilliseconds

    public init(
        sink: any RegistryRecordSink, store: StateStore, explain: ExplainStore,
        now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }
    ) {
        self.sink = sink
        self.store = store
        self.explain = explain
        self.now = now
    }

    /// Validates and publishes one record.
    public func submit(_ record: RegistryRecord) async throws {
        if let problem = record.validationError() { throw FieldError(field: "(record)", message: problem.detail) }
        try await sink.publish(record)
    }

    // MARK: Record builders (pure; shared with heraldctl)

    /// `register_device` from a JSON body: `token` (required), `kind` (`apns`, `voip`, `fcm`, `webhook`) or
    /// CometChat's `platform`, `environment`, `bundle_id`, `provider_id`, `unique`.
    public static func registerRecord(
        app: String, user: String, body: some Collection<UInt8>,
        now: Int64
    ) throws(FieldError) -> RegistryRecord {
        let object = try Self.object(body)
        var token: String?, kind: Device.Kind?, environment = APNsEnvironment.production
        var bundleID: String?, providerID: String?, unique = false
        for (name, value) in object {
            switch name {
            case "token": token = try Self.string(value, name)
            case "kind":
                let raw = try Self.string(value, name)
                guard let k = Device.Kind(rawValue: raw) else {
                    throw FieldError(field: name, message: "expected apns, voip, fcm or webhook, got \"\(raw)\"")
                }
                kind = k
            case "platform":
                let raw = try Self.string(value, name)
                guard let k = PushPlatform.kind(for: raw) else {
                    throw FieldError(
                        field: name, message: "unknown platform \"\(raw)\" (a CometChat PushPlatforms name)")
                }
                if kind != nil && kind != k { throw FieldError(field: name, message: "disagrees with kind") }
                kind = k
            case "environment":
                let raw = try Self.string(value, name)
                guard let e = APNsEnvironment(rawValue: raw) else {
                    throw FieldError(field: name, message: "expected production or sandbox, got \"\(raw)\"")
                }
                environment = e
            case "bundle_id": bundleID = try Self.string(value, name)
            case "provider_id": providerID = try Self.string(value, name)
            case "unique":
                guard case .bool(let b) = value else {
                    throw FieldError(field: name, message: "expected true or false, got \(value.typeName)")
                }
                unique = b
            default:
                throw FieldError(
                    field: name,
                    message: "unknown field (known: bundle_id, environment, kind, platform, provider_id, token, unique)"
                )
            }
        }
        let k = kind ?? .apns
        guard let raw = token, !raw.isEmpty else { throw FieldError(field: "token", message: "missing") }
        let device = try Self.device(
            token: raw, kind: k, environment: environment, bundleID: bundleID,
            providerID: providerID, registeredAt: now)
        return RegistryRecord(op: .registerDevice, appID: app, user: user, device: device, unique: unique ? true : nil)
    }

    /// A device with its token checked: hex (lowercased) for `apns` and `voip`, no spaces and at most 4096 bytes
    /// for the others.
    public static func device(
        token: String, kind: Device.Kind, environment: APNsEnvironment, bundleID: String?,
        providerID: String?, registeredAt: Int64
    ) throws(FieldError) -> Device {
        let apple = kind == .apns || kind == .voip
        if apple {
            guard token.utf8.count <= 200, token.allSatisfy(\.isHexDigit) else {
                throw FieldError(field: "token", message: "an \(kind.rawValue) token is hex digits (at most 200)")
            }
        } else {
            guard token.utf8.count <= 4096, !token.contains(where: { $0.isWhitespace }) else {
                throw FieldError(field: "token", message: "a registration token has no spaces and at most 4096 bytes")
            }
        }
        return Device(
            token: apple ? token.lowercased() : token, kind: kind, environment: environment, bundleID: bundleID,
            registeredAt: registeredAt, providerID: providerID)
    }

    /// `set_presence` from `{"online": ["<token>", ...], "ttl_ms": 120000}` (`ttl_ms` optional).
    public static func presenceRecord(
        app: String, user: String, body: some Collection<UInt8>
    ) throws(FieldError) -> RegistryRecord {
        let object = try Self.object(body)
        var online: [String]?, ttl: Int64?
        for (name, value) in object {
            switch name {
            case "online":
                guard case .array(let items) = value else {
                    throw FieldError(field: name, message: "expected an array of tokens, got \(value.typeName)")
                }
                guard items.count <= 4 * Device.maxPerUser else {
                    throw FieldError(field: name, message: "too many tokens")
                }
                var tokens: [String] = []
                for (i, item) in items.enumerated() { tokens.append(try Self.string(item, "online[\(i)]")) }
                online = tokens
            case "ttl_ms":
                guard case .number(let n) = value, let v = Int64(n), v > 0, v <= 86_400_000 else {
                    throw FieldError(field: name, message: "expected milliseconds, 1 to 86400000")
                }
                ttl = v
            default:
                throw FieldError(field: name, message: "unknown field (known: online, ttl_ms)")
            }
        }
        guard let online else { throw FieldError(field: "online", message: "missing") }
        return RegistryRecord(op: .setPresence, appID: app, user: user, online: online, ttlMs: ttl)
    }

    /// `mark_read` from `{"conversation": "c1"}`, or `{}` / an empty body for every conversation.
    public static func markReadRecord(
        app: String, user: String, body: some Collection<UInt8>
    ) throws(FieldError) -> RegistryRecord {
        var conversation: String?
        if body.contains(where: { !($0 == 0x20 || $0 == 0x0a || $0 == 0x0d || $0 == 0x09) }) {
            for (name, value) in try Self.object(body) {
                switch name {
                case "conversation":
                    let c = try Self.string(value, name)
                    guard !c.isEmpty, c.utf8.count <= 256 else {
                        throw FieldError(field: name, message: "a conversation id is 1 to 256 bytes")
                    }
                    conversation = c
                default:
                    throw FieldError(field: name, message: "unknown field (known: conversation)")
                }
            }
        }
        return RegistryRecord(op: .markRead, appID: app, user: user, conversation: conversation)
    }

    /// `patch_preferences` from the PATCH body (`PreferencePatch.parse`).
    public static func patchRecord(
        app: String, user: String, body: some Collection<UInt8>
    ) throws(FieldError) -> RegistryRecord {
        RegistryRecord(op: .patchPreferences, appID: app, user: user, patch: try PreferencePatch.parse(body))
    }

    // MARK: Reads

    /// The user's stored preferences with the defaults filled in.
    /// The stored preferences with every field written (those never set show the built-in value).
    public func preferences(app: String, user: String) async throws -> Preferences {
        var preferences = try await store.preferences(app: app, user: user)
        preferences.unset = []
        return preferences
    }

    /// Unread and mention counts (Herald-kept when the app counts; `set_unread` values otherwise).
    public func counts(app: String, user: String) async throws -> Unread {
        let state = try await store.loadUser(app: app, user: user, now: now())
        return try await store.withMentionCounts(app: app, user: user, unread: state.unread)
    }

    /// The latest decision about the user and that event's trail for them, as JSON; nil when none is kept. The
    /// devices that took the notification as expected have no trail entry: they come from send's delivery records
    /// (within the replay window), marked `"source": "delivery_record"`.
    public func lastDecision(app: String, user: String) async throws -> JSONValue? {
        let at = now()
        guard let (decision, trail) = try await explain.lastDecision(app: app, user: user, now: at) else { return nil }
        func entry(_ e: ExplainEntry) -> JSONValue {
            var o: [(String, JSONValue)] = [
                ("stage", .string(e.stage)), ("decision", .string(e.decision)),
                ("reason", e.reason.map(JSONValue.string) ?? .null), ("at", .number(String(e.at))),
            ]
            if let t = e.token { o.append(("token", .string(t))) }
            if let s = e.status { o.append(("status", .number(String(s)))) }
            if let a = e.attempt { o.append(("attempt", .number(String(a)))) }
            if let c = e.count { o.append(("count", .number(String(c)))) }
            return .object(o)
        }
        let userEntry = trail.first { $0.user == user && $0.token == nil } ?? decision
        let eventStep = trail.first { $0.user == nil && $0.token == nil && $0.decision != "classified" }
        let classified = trail.first { $0.user == nil && $0.token == nil && $0.decision == "classified" }
        var o: [(String, JSONValue)] = [
            ("app_id", .string(app)), ("user", .string(user)), ("event_id", .string(decision.eventID)),
            ("decision", .string(userEntry.decision)), ("reason", userEntry.reason.map(JSONValue.string) ?? .null),
            ("stage", .string(userEntry.stage)), ("at", .number(String(userEntry.at))),
        ]
        if let classified { o.append(("class", classified.reason.map(JSONValue.string) ?? .null)) }
        if let eventStep { o.append(("event_step", entry(eventStep))) }
        var devices = trail.filter { $0.user == user && $0.token != nil }.map(entry)
        if userEntry.decision == "deliver" {
            let explained = Set(trail.compactMap(\.token))
            let tokens = try await store.loadUser(app: app, user: user, now: at).devices.map(\.token)
                .filter { !explained.contains($0) }
            let records = try await store.wasDelivered(
                app: app, pairs: tokens.map { DeliveryKey(eventId: decision.eventID, token: $0) }, now: at,
                window: replayWindowMilliseconds)
            for (token, delivered) in zip(tokens, records) where delivered {
                devices.append(
                    .object([
                        ("stage", .string("send")), ("decision", .string("delivered")), ("reason", .null),
                        ("token", .string(token)), ("source", .string("delivery_record")),
                    ]))
            }
        }
        o.append(("devices", .array(devices)))
        return .object(o)
    }

    // MARK: JSON helpers

    static func object(_ body: some Collection<UInt8>) throws(FieldError) -> [(String, JSONValue)] {
        let root: JSONValue
        do {
            root = try JSONValue.parse(body)
        } catch {
            throw FieldError(field: "(body)", message: "not valid JSON: \(error)")
        }
        guard case .object(let pairs) = root else {
            throw FieldError(field: "(body)", message: "expected a JSON object, got \(root.typeName)")
        }
        var seen = Set<String>()
        for (k, _) in pairs where !seen.insert(k).inserted { throw FieldError(field: k, message: "given twice") }
        return pairs
    }

    static func string(_ value: JSONValue, _ field: String) throws(FieldError) -> String {
        guard case .string(let s) = value else {
            throw FieldError(field: field, message: "expected a string, got \(value.typeName)")
        }
        return s
    }
}
