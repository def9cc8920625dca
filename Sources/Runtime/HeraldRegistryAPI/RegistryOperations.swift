import Foundation
import HeraldCore
import HeraldKafka
import HeraldRedis
import HeraldTracing

// The registry operations, written once: the HTTP API (RegistryAPI) and heraldctl both turn their input into the
// same `herald.registry` records here and read state through the same calls. Writes are records on
// herald.registry, keyed by user id, so herald-registry applies one user's changes in the order they were made.

/// Where registry records go: herald.registry (`KafkaRegistrySink`), or straight to Redis in tests and tools.
public protocol RegistryRecordSink: Sendable {
    /// Returns once the record is stored for good (the broker acknowledged it).
    func publish(_ record: RegistryRecord) async throws
    /// The same, the record carrying the caller's trace context (`traceparent`/`tracestate` headers on
    /// herald.registry; docs/operations.md "Tracing"). A sink without headers publishes the record alone.
    func publish(_ record: RegistryRecord, trace: RegistryTrace?) async throws
}

extension RegistryRecordSink {
    public func publish(_ record: RegistryRecord, trace: RegistryTrace?) async throws {
        try await publish(record)
    }
}

/// A W3C trace context a caller sent with a registry write (the HTTP request's `traceparent` and `tracestate`
/// headers, heraldctl's `--traceparent`): the `herald.registry` record carries it, so herald-registry continues the
/// caller's trace (its sampler keeps the sampled flag). Only a valid `traceparent` makes one; a `tracestate` that is
/// not valid is dropped (HeraldTracing's `TraceContext` reads both).
public struct RegistryTrace: Sendable, Hashable {
    /// The `traceparent` value, as Herald writes it.
    public let traceparent: String
    public let tracestate: String?

    /// nil when `traceparent` is missing or not a valid W3C `traceparent`.
    public init?(traceparent: String?, tracestate: String? = nil) {
        guard let traceparent,
            let context = TraceContext(
                traceparent: Array(traceparent.utf8), tracestate: tracestate.map { Array($0.utf8) })
        else { return nil }
        self.traceparent = context.traceparent
        self.tracestate = context.traceState
    }

    /// The headers that carry it on a record.
    public var headers: [KafkaHeader] {
        var headers = [KafkaHeader(key: TraceContext.traceparentHeader, string: traceparent)]
        if let tracestate { headers.append(KafkaHeader(key: TraceContext.tracestateHeader, string: tracestate)) }
        return headers
    }
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
        try await publish(record, trace: nil)
    }

    public func publish(_ record: RegistryRecord, trace: RegistryTrace?) async throws {
        let value = StageCodec.encode(record)
        let report = try await producer.send(
            ProducerRecord(topic: topic, key: record.key, value: value, headers: trace?.headers ?? []))
        try report.get()
    }
}

/// The operations of the registry API and heraldctl (docs/registry-api.md): builders that validate input and
/// make records, and the reads.
public struct RegistryOperations: Sendable {
    public let sink: any RegistryRecordSink
    public let store: StateStore
    public let explain: ExplainStore
    /// The bounds of one user's stored preferences (checked before a patch is published).
    public let preferenceLimits: PreferenceLimits
    public let now: @Sendable () -> Int64
    /// send's replay window (the pipeline file's `idempotency.replay_window_seconds`): where the explain read
    /// finds the devices a routine delivery left no trail entry for.
    public var replayWindowMilliseconds = StateStore.defaultReplayWindowMilliseconds

    public init(
        sink: any RegistryRecordSink, store: StateStore, explain: ExplainStore,
        preferenceLimits: PreferenceLimits = PreferenceLimits(),
        now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }
    ) {
        self.sink = sink
        self.store = store
        self.explain = explain
        self.preferenceLimits = preferenceLimits
        self.now = now
    }

    /// Validates and publishes one record (a preference change is checked against `preferenceLimits` first), with
    /// the caller's trace context when it sent one.
    public func submit(_ record: RegistryRecord, trace: RegistryTrace? = nil) async throws {
        if let problem = record.validationError() { throw FieldError(field: "(record)", message: problem.detail) }
        if let outside = record.rangeError() { throw outside }
        if let over = try await exceedsLimits(record) { throw over.problem }
        try await sink.publish(record, trace: trace)
    }

    /// Why a `patch_preferences` or `set_preferences` record would take the user's stored preferences beyond
    /// `preferenceLimits`, judged against what is stored now; nil when it would not (or for another op). The
    /// patch script checks again when the record is applied, so a race between two writers cannot pass the limit.
    public func exceedsLimits(_ record: RegistryRecord) async throws -> PreferenceLimitError? {
        switch record.op {
        case .setPreferences:
            return record.preferences.flatMap { preferenceLimits.problem($0) }
        case .patchPreferences:
            guard let patch = record.patch, let user = record.user else { return nil }
            if patch.conversations.isEmpty && patch.set == PreferencePatch.Fields() { return nil }
            let stored = try await store.preferences(app: record.appID, user: user)
            return preferenceLimits.problem(patch.apply(to: stored))
        default:
            return nil
        }
    }

    // MARK: Record builders (pure; shared with heraldctl)

    /// `register_device` from a JSON body: `token` (required), `kind` (`apns`, `voip`, `fcm`, `webhook`) or
    /// CometChat's `platform`, `environment`, `bundle_id`, `provider_id`, `unique`.
    public static func registerRecord(
        app: String, user: String, body: some Collection<UInt8>,
        now: Int64
    ) throws(FieldError) -> RegistryRecord {
        let object = try JSONValue.bodyObject(body)
        var token: String?, kind: Device.Kind?, environment: APNsEnvironment?
        var bundleID: String?, providerID: String?, unique = false
        for (name, value) in object {
            switch name {
            case "token":
                if token != nil { throw FieldError(field: name, message: "give token or subscription, not both") }
                token = try Self.string(value, name)
            case "kind":
                let raw = try Self.string(value, name)
                guard let k = Device.Kind(rawValue: raw) else {
                    throw FieldError(
                        field: name, message: "expected apns, voip, fcm, webhook or webpush, got \"\(raw)\"")
                }
                if kind == .webpush && k != .webpush {
                    throw FieldError(field: name, message: "disagrees with subscription")
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
            case "subscription":
                // A browser's PushSubscription.toJSON(): a `webpush` device whose token is the subscription.
                if kind != nil && kind != .webpush { throw FieldError(field: name, message: "is for kind webpush") }
                if token != nil { throw FieldError(field: name, message: "give token or subscription, not both") }
                token = try Self.webPushSubscription(value).token
                kind = .webpush
            case "unique":
                guard case .bool(let b) = value else {
                    throw FieldError(field: name, message: "expected true or false, got \(value.typeName)")
                }
                unique = b
            default:
                throw FieldError(
                    field: name,
                    message:
                        "unknown field (known: bundle_id, environment, kind, platform, provider_id, subscription, token, unique)"
                )
            }
        }
        let k = kind ?? .apns
        guard let raw = token, !raw.isEmpty else { throw FieldError(field: "token", message: "missing") }
        let device = try Self.device(
            token: raw, kind: k, environment: environment, bundleID: bundleID,
            providerID: providerID, registeredAt: now)
        let record = RegistryRecord(
            op: .registerDevice, appID: app, user: user, device: device, unique: unique ? true : nil)
        if var outside = record.rangeError() {
            // The body's fields are the device's, at the top level.
            if outside.field.hasPrefix("device.") { outside.field.removeFirst("device.".count) }
            throw outside
        }
        return record
    }

    /// A device with its token checked (`Device.tokenProblem`); `apns` and `voip` tokens are lowercased.
    public static func device(
        token: String, kind: Device.Kind, environment: APNsEnvironment?, bundleID: String?,
        providerID: String?, registeredAt: Int64
    ) throws(FieldError) -> Device {
        let apple = kind == .apns || kind == .voip
        if let problem = Device.tokenProblem(token, kind: kind) { throw FieldError(field: "token", message: problem) }
        return Device(
            token: apple ? token.lowercased() : token, kind: kind, environment: environment, bundleID: bundleID,
            registeredAt: registeredAt, providerID: providerID)
    }

    /// A `webpush` device's subscription from `{"endpoint": ..., "keys": {"p256dh": ..., "auth": ...}}` (the
    /// browser's `PushSubscription.toJSON()`; `expirationTime` is accepted and ignored), checked
    /// (`WebPushSubscription.problem`).
    public static func webPushSubscription(_ value: JSONValue) throws(FieldError) -> WebPushSubscription {
        guard case .object(let fields) = value else {
            throw FieldError(field: "subscription", message: "expected an object, got \(value.typeName)")
        }
        var endpoint: String?, p256dh: String?, auth: String?
        for (name, item) in fields {
            switch name {
            case "endpoint": endpoint = try Self.string(item, "subscription.endpoint")
            case "expirationTime": break
            case "keys":
                guard case .object(let keys) = item else {
                    throw FieldError(field: "subscription.keys", message: "expected an object, got \(item.typeName)")
                }
                for (key, v) in keys {
                    switch key {
                    case "p256dh": p256dh = try Self.string(v, "subscription.keys.p256dh")
                    case "auth": auth = try Self.string(v, "subscription.keys.auth")
                    default:
                        throw FieldError(
                            field: "subscription.keys.\(key)", message: "unknown field (known: auth, p256dh)")
                    }
                }
            default:
                throw FieldError(
                    field: "subscription.\(name)", message: "unknown field (known: endpoint, expirationTime, keys)")
            }
        }
        guard let endpoint else { throw FieldError(field: "subscription.endpoint", message: "missing") }
        guard let p256dh else { throw FieldError(field: "subscription.keys.p256dh", message: "missing") }
        guard let auth else { throw FieldError(field: "subscription.keys.auth", message: "missing") }
        let subscription = WebPushSubscription(endpoint: endpoint, p256dh: p256dh, auth: auth)
        if let problem = subscription.problem { throw FieldError(field: "subscription", message: problem) }
        return subscription
    }

    /// `set_presence` from `{"online": ["<token>", ...], "ttl_ms": 120000}` (`ttl_ms` optional).
    public static func presenceRecord(
        app: String, user: String, body: some Collection<UInt8>
    ) throws(FieldError) -> RegistryRecord {
        let object = try JSONValue.bodyObject(body)
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
                let range = InputRanges.presenceTTLMillis
                guard case .number(let n) = value, let v = Int64(n) else {
                    throw FieldError(
                        field: name, message: "expected milliseconds, \(range.lowerBound) to \(range.upperBound)")
                }
                if let outside = InputRanges.check(v, in: range, field: name) { throw outside }
                ttl = v
            default:
                throw FieldError(field: name, message: "unknown field (known: online, ttl_ms)")
            }
        }
        guard let online else { throw FieldError(field: "online", message: "missing") }
        let record = RegistryRecord(op: .setPresence, appID: app, user: user, online: online, ttlMs: ttl)
        if let outside = record.rangeError() { throw outside }
        return record
    }

    /// `mark_read` from `{"conversation": "c1", "token": "<the reading device>"}` (both optional; `{}` or an empty
    /// body marks every conversation read), stamped `read_at` = `now`. The token's device gets no clear
    /// (docs/behaviour.md §6c).
    public static func markReadRecord(
        app: String, user: String, body: some Collection<UInt8>, now: Int64? = nil
    ) throws(FieldError) -> RegistryRecord {
        var conversation: String?
        var token: String?
        if body.contains(where: { !($0 == 0x20 || $0 == 0x0a || $0 == 0x0d || $0 == 0x09) }) {
            for (name, value) in try JSONValue.bodyObject(body) {
                switch name {
                case "conversation":
                    let c = try Self.string(value, name)
                    guard !c.isEmpty, c.utf8.count <= 256 else {
                        throw FieldError(field: name, message: "a conversation id is 1 to 256 bytes")
                    }
                    conversation = c
                case "token":
                    let t = try Self.string(value, name)
                    guard !t.isEmpty, t.utf8.count <= Device.maxTokenBytes else {
                        throw FieldError(
                            field: name, message: "the reading device's token is 1 to \(Device.maxTokenBytes) bytes")
                    }
                    token = t
                default:
                    throw FieldError(field: name, message: "unknown field (known: conversation, token)")
                }
            }
        }
        return RegistryRecord(
            op: .markRead, appID: app, user: user, token: token, conversation: conversation, readAt: now)
    }

    /// `set_members`, `add_members` or `remove_members` from `{"members": ["u1", "u2"]}`.
    public static func membersRecord(
        _ op: RegistryRecord.Op, app: String, conversation: String, body: some Collection<UInt8>
    ) throws(FieldError) -> RegistryRecord {
        var members: [String]?
        for (name, value) in try JSONValue.bodyObject(body) {
            switch name {
            case "members":
                guard case .array(let items) = value else {
                    throw FieldError(field: name, message: "expected an array of user ids, got \(value.typeName)")
                }
                guard items.count <= RegistryRecord.maxMembers else {
                    throw FieldError(field: name, message: "more than \(RegistryRecord.maxMembers) members")
                }
                var ids: [String] = []
                ids.reserveCapacity(items.count)
                for (i, item) in items.enumerated() {
                    let id = try Self.string(item, "members[\(i)]")
                    guard !id.isEmpty, id.utf8.count <= RegistryRecord.maxIDBytes else {
                        throw FieldError(
                            field: "members[\(i)]", message: "a user id is 1 to \(RegistryRecord.maxIDBytes) bytes")
                    }
                    ids.append(id)
                }
                members = ids
            default:
                throw FieldError(field: name, message: "unknown field (known: members)")
            }
        }
        guard let members else { throw FieldError(field: "members", message: "missing") }
        if op != .setMembers && members.isEmpty { throw FieldError(field: "members", message: "empty") }
        return RegistryRecord(op: op, appID: app, conversation: conversation, members: members)
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

    /// The user's devices, as `{"devices": [...]}` in the record form of docs/behaviour.md §3, whole tokens
    /// included (the caller registered them and needs them to remove one).
    public func devicesJSON(app: String, user: String) async throws -> JSONValue {
        let state = try await store.loadUser(app: app, user: user, now: now())
        var items: [JSONValue] = []
        for device in state.devices {
            var w = JSONWriter(capacity: 256)
            device.write(into: &w)
            items.append((try? JSONValue.parse(w.bytes)) ?? .null)
        }
        return .object([("app", .string(app)), ("user", .string(user)), ("devices", .array(items))])
    }

    /// The conversation's members, sorted.
    public func members(app: String, conversation: String) async throws -> [String] {
        try await store.members(app: app, conversation: conversation)
    }

    /// The decision about `user` for `event` (the latest decision about the user when `event` is nil) and that
    /// event's trail for them, as the JSON `heraldctl explain --user` prints too; nil when nothing is kept.
    /// - Parameter token: how a device token is shown (whole in the API; shortened by heraldctl unless asked).
    public func decision(
        app: String, user: String, event: String?, token: (String) -> String = { $0 }
    ) async throws -> JSONValue? {
        try await Self.decision(
            app: app, user: user, event: event, explain: explain, store: store,
            replayWindowMilliseconds: replayWindowMilliseconds, now: now(), token: token)
    }

    /// The explain answer the API and heraldctl give. A notification that went as expected leaves no trail entry,
    /// so the answer also draws on the user's latest decision (when it is this event's) and on send's delivery
    /// records for the devices the trail does not name (within `replayWindowMilliseconds`), marked
    /// `"source": "delivery_record"`.
    public static func decision(
        app: String, user: String, event: String?, explain: ExplainStore, store: StateStore,
        replayWindowMilliseconds: Int64, now: Int64, token: (String) -> String = { $0 }
    ) async throws -> JSONValue? {
        let eventID: String
        var trail: [ExplainEntry]
        if let event {
            eventID = event
            trail = try await explain.trail(app: app, eventID: event, now: now)
            if !trail.contains(where: { $0.user == user && $0.token == nil }),
                let latest = try await explain.lastDecision(app: app, user: user, now: now)?.decision,
                latest.eventID == event
            {
                trail.append(latest)
            }
        } else {
            guard let (latest, latestTrail) = try await explain.lastDecision(app: app, user: user, now: now) else {
                return nil
            }
            eventID = latest.eventID
            trail = latestTrail.contains { $0.user == user && $0.token == nil } ? latestTrail : latestTrail + [latest]
        }
        var delivered: [String] = []
        let decided = trail.first { $0.user == user && $0.token == nil }
        if decided == nil || decided?.decision == "deliver" {
            let named = Set(trail.filter { $0.user == user }.compactMap(\.token))
            let tokens = try await store.loadUser(app: app, user: user, now: now).devices.map(\.token)
                .filter { !named.contains($0) }
            let records = try await store.wasDelivered(
                app: app, pairs: tokens.map { DeliveryPair(eventID: eventID, token: $0) }, now: now,
                window: replayWindowMilliseconds)
            delivered = zip(tokens, records).filter(\.1).map(\.0)
        }
        return decisionJSON(app: app, event: eventID, user: user, trail: trail, delivered: delivered, token: token)
    }

    /// The explain answer about one user and one event from the event's trail; nil when the trail says nothing
    /// about the user (and the event was not dropped before recipients were known). Field names: `app`, `event`,
    /// `user`, `decision`, `reason`, `stage`, `at`, `class`, `event_step`, `devices` (docs/registry-api.md).
    /// `delivered`: device tokens send's delivery records show delivered (the decision was then `deliver`, even
    /// when a later event's decision has replaced it, as it was when the trail holds outcomes of the user's devices).
    public static func decisionJSON(
        app: String, event: String, user: String, trail: [ExplainEntry], delivered: [String] = [],
        token: (String) -> String = { $0 }
    ) -> JSONValue? {
        let eventStep = trail.first { $0.user == nil && $0.token == nil && $0.decision != "classified" }
        let classified = trail.first { $0.user == nil && $0.token == nil && $0.decision == "classified" }
        let decided =
            trail.first { $0.user == user && $0.token == nil } ?? (eventStep?.decision == "drop" ? eventStep : nil)
        var o: [(String, JSONValue)] = [("app", .string(app)), ("event", .string(event)), ("user", .string(user))]
        if let decided {
            o += [
                ("decision", .string(decided.decision)), ("reason", decided.reason.map(JSONValue.string) ?? .null),
                ("stage", .string(decided.stage)), ("at", .number(String(decided.at))),
            ]
        } else if !delivered.isEmpty || trail.contains(where: { $0.user == user && $0.token != nil }) {
            // A routine decision is not kept and a later event's decision replaced the latest one; send's device
            // outcomes (or its delivery records) show that suppress let the notification through.
            o += [("decision", .string("deliver")), ("reason", .null), ("stage", .string("suppress"))]
        } else {
            return nil
        }
        if let classified { o.append(("class", classified.reason.map(JSONValue.string) ?? .null)) }
        if let eventStep { o.append(("event_step", explainEntryJSON(eventStep, token: token))) }
        var devices = trail.filter { $0.user == user && $0.token != nil }.map { explainEntryJSON($0, token: token) }
        for t in delivered {
            devices.append(
                .object([
                    ("stage", .string("send")), ("decision", .string("delivered")), ("reason", .null),
                    ("token", .string(token(t))), ("source", .string("delivery_record")),
                ]))
        }
        o.append(("devices", .array(devices)))
        return .object(o)
    }

    /// One explain entry: `stage`, `decision`, `reason`, `at`, and when set `user`, `token`, `status`, `attempt`,
    /// `count`.
    public static func explainEntryJSON(_ e: ExplainEntry, token: (String) -> String = { $0 }) -> JSONValue {
        var o: [(String, JSONValue)] = [
            ("stage", .string(e.stage)), ("decision", .string(e.decision)),
            ("reason", e.reason.map(JSONValue.string) ?? .null), ("at", .number(String(e.at))),
        ]
        if let u = e.user { o.append(("user", .string(u))) }
        if let t = e.token { o.append(("token", .string(token(t)))) }
        if let s = e.status { o.append(("status", .number(String(s)))) }
        if let a = e.attempt { o.append(("attempt", .number(String(a)))) }
        if let c = e.count { o.append(("count", .number(String(c)))) }
        return .object(o)
    }

    // MARK: JSON helpers

    static func string(_ value: JSONValue, _ field: String) throws(FieldError) -> String {
        guard case .string(let s) = value else {
            throw FieldError(field: field, message: "expected a string, got \(value.typeName)")
        }
        return s
    }
}
