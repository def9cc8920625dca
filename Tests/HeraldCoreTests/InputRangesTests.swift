// The ranges at the edges (InputRanges) and the saturating arithmetic on times and TTLs (Saturating), at the
// limits of Int64.

import Foundation
import HeraldCore
import Testing

@Suite("Saturating arithmetic on times and TTLs")
struct SaturatingTests {
    @Test(
        "add caps at the Int64 limits",
        arguments: [
            (Int64(1), Int64(2), Int64(3)),
            (Int64.max, 1, Int64.max),
            (Int64.max, Int64.max, Int64.max),
            (Int64.max - 1, 1, Int64.max),
            (Int64.min, -1, Int64.min),
            (Int64.min, Int64.min, Int64.min),
            (Int64.max, Int64.min, -1),
            (1_732_000_000_000, 86_400_000, 1_732_086_400_000),
        ] as [(Int64, Int64, Int64)])
    func add(_ a: Int64, _ b: Int64, _ expected: Int64) {
        #expect(Saturating.add(a, b) == expected)
        #expect(Saturating.add(b, a) == expected)
    }

    @Test(
        "subtract caps at the Int64 limits",
        arguments: [
            (Int64(5), Int64(3), Int64(2)),
            (Int64.max, -1, Int64.max),
            (Int64.min, 1, Int64.min),
            (0, Int64.min, Int64.max),
            (-1, Int64.min, Int64.max),
            (Int64.max, Int64.max, 0),
        ] as [(Int64, Int64, Int64)])
    func subtract(_ a: Int64, _ b: Int64, _ expected: Int64) {
        #expect(Saturating.subtract(a, b) == expected)
    }

    @Test(
        "multiply caps at the Int64 limits, with the sign of the exact product",
        arguments: [
            (Int64(3), Int64(1000), Int64(3000)),
            (Int64.max, 1000, Int64.max),
            (Int64.max / 1000 + 1, 1000, Int64.max),
            (Int64.max / 1000, 1000, Int64.max / 1000 * 1000),
            (Int64.min, 1000, Int64.min),
            (Int64.min, -1, Int64.max),
            (-9_223_372_036_854_776, 1000, Int64.min),
            (Int64.max, -1000, Int64.min),
            (0, Int64.max, 0),
        ] as [(Int64, Int64, Int64)])
    func multiply(_ a: Int64, _ b: Int64, _ expected: Int64) {
        #expect(Saturating.multiply(a, b) == expected)
    }

    @Test("an APNs expiry in seconds at Int64.max is Int64.max milliseconds")
    func secondsToMilliseconds() {
        #expect(Saturating.milliseconds(fromSeconds: .max) == .max)
        #expect(Saturating.milliseconds(fromSeconds: .min) == .min)
        #expect(Saturating.milliseconds(fromSeconds: 1_732_000_000) == 1_732_000_000_000)
    }

    @Test("a burst's due time and flush at Int64 limits do not trap")
    func coalescingAtTheLimits() {
        let policy = CoalescePolicy(windowMilliseconds: 60_000, updateMilliseconds: 10_000)
        let held = BurstState(count: 2, shown: 1, shownAt: .max, lastAt: .max, pending: true)
        #expect(Coalescing.due(held, policy: policy) == .max)
        #expect(Coalescing.flush(held, now: .max, policy: policy) == .show(count: 2))
        var open = held
        open.pending = false
        #expect(Coalescing.due(open, policy: policy) == .max)
        #expect(Coalescing.flush(open, now: 0, policy: policy) == .wait)
    }

    @Test("a read at Int64.max gives a clear whose expiry is capped, not a trap")
    func readSyncExpiry() throws {
        let event = ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: .max)
        let device = Device(token: String(repeating: "a", count: 64), bundleID: "com.example.chat")
        let app = AppConfig(credentials: [APNsCredential(bundleID: "com.example.chat")])
        let requests = try Renderer.render(
            event: event, recipient: "u2", state: UserState(devices: [device]), targets: [device], app: app,
            now: Date())
        #expect(requests.count == 1)
        #expect(requests.first.map { $0.expiration > Int64.max / 1000 } == true)
    }

    @Test("backoff after an attempt counter at Int.min or Int.max is a delay, not a trap")
    func backoffAtTheLimits() {
        let policy = BackoffPolicy(initialDelay: .seconds(1), maxDelay: .seconds(60), jitter: 0, maxAttempts: 3)
        #expect(policy.delay(afterAttempt: .min, unit: 0) == .seconds(1))
        #expect(policy.delay(afterAttempt: .max, unit: 0) == .seconds(60))
        // A maximum delay configured beyond Int64 nanoseconds (HERALD_SEND_RETRY_MAX_MS has no upper bound) saturates.
        let huge = BackoffPolicy(
            initialDelay: .seconds(Int64.max / 2), maxDelay: .seconds(Int64.max), jitter: 0, maxAttempts: 3)
        #expect(huge.delay(afterAttempt: 40, unit: 0) == .nanoseconds(Int64.max))
    }
}

@Suite("Ranges at the edges")
struct InputRangesTests {
    static let template =
        #"{"event_id":"e1","app_id":"app1","kind":"message","created_at":@,"sender":{"id":"u1"},"conversation":{"id":"c1","type":"group"},"message":{"id":"m","type":"text","text":"hi"}}"#

    static func admission(createdAt: String) -> Admission {
        Ingest.admit(Array(template.replacing("@", with: createdAt).utf8))
    }

    @Test(
        "created_at: inside 2000-2200 is admitted, an integer outside is out_of_range naming the field",
        arguments: [
            ("946684800000", nil),  // 2000-01-01
            ("7258118400000", nil),  // 2200-01-01
            ("1732000000000", nil),
            ("946684799999", "out_of_range"),
            ("7258118400001", "out_of_range"),
            ("0", "out_of_range"),
            ("-1", "out_of_range"),
            ("9223372036854775807", "out_of_range"),
            ("-9223372036854775808", "out_of_range"),
            ("1732000000", "out_of_range"),  // seconds, not milliseconds
            ("1.5", "invalid"),
            ("1e308", "invalid"),
            ("9223372036854775808", "invalid"),
        ] as [(String, String?)])
    func createdAt(_ value: String, _ reason: String?) {
        switch Self.admission(createdAt: value) {
        case .admit:
            #expect(reason == nil, "\(value) admitted")
        case .drop(let drop, let detail):
            #expect(drop.rawValue == reason, "\(value): \(detail)")
            #expect(detail.hasPrefix("created_at"), "\(detail)")
        }
    }

    static func record(_ json: String) throws -> RegistryRecord {
        try StageCodec.decode(RegistryRecord.self, from: Array(json.utf8))
    }

    static let hex = String(repeating: "e", count: 64)

    @Test(
        "herald.registry: each number and size outside its range names its field",
        arguments: [
            (#""op":"set_presence","online":["\#(hex)"],"ttl_ms":9223372036854775807"#, "ttl_ms"),
            (#""op":"set_presence","online":["\#(hex)"],"ttl_ms":0"#, "ttl_ms"),
            (#""op":"set_presence","online":["\#(hex)"],"ttl_ms":86400001"#, "ttl_ms"),
            (#""op":"set_presence","online":["\#(hex)"],"ttl_ms":-1"#, "ttl_ms"),
            (#""op":"set_presence","online":[""]"#, "online[0]"),
            (#""op":"set_presence","online":["\#(String(repeating: "a", count: 4097))"]"#, "online[0]"),
            (#""op":"mark_read","conversation":"c1","read_at":9223372036854775807"#, "read_at"),
            (#""op":"mark_read","conversation":"c1","read_at":5"#, "read_at"),
            (#""op":"set_unread","unread":{"total":-1}"#, "unread.total"),
            (#""op":"set_unread","unread":{"total":1000000001}"#, "unread.total"),
            (
                #""op":"set_unread","unread":{"total":1,"conversations":{"c1":9223372036854775807}}"#,
                "unread.conversations.c1"
            ),
            (
                #""op":"register_device","device":{"token":"\#(hex)","bundle_id":"\#(String(repeating: "b", count: 257))"}"#,
                "device.bundle_id"
            ),
            (
                #""op":"register_device","device":{"token":"\#(hex)","kind":"fcm","provider_id":"\#(String(repeating: "p", count: 257))"}"#,
                "device.provider_id"
            ),
            (#""op":"register_device","device":{"token":"\#(hex)","registered_at":-1}"#, "device.registered_at"),
            (
                #""op":"register_device","device":{"token":"\#(hex)","registered_at":9223372036854775807}"#,
                "device.registered_at"
            ),
        ])
    func registryOutside(_ fields: String, _ field: String) throws {
        let record = try Self.record(#"{"app_id":"app1","user":"u2",\#(fields)}"#)
        #expect(record.validationError() == nil)
        let error = try #require(record.rangeError())
        #expect(error.field == field && error.reason == "out_of_range", "\(error)")
    }

    @Test(
        "herald.registry: values at the limits pass",
        arguments: [
            #""op":"set_presence","online":["\#(hex)"],"ttl_ms":86400000"#,
            #""op":"set_presence","online":["\#(hex)"],"ttl_ms":1"#,
            #""op":"mark_read","conversation":"c1","read_at":7258118400000"#,
            #""op":"set_unread","unread":{"total":1000000000,"conversations":{"c1":0}}"#,
            #""op":"register_device","device":{"token":"\#(hex)","bundle_id":"\#(String(repeating: "b", count: 256))","registered_at":0}"#,
        ])
    func registryInside(_ fields: String) throws {
        let record = try Self.record(#"{"app_id":"app1","user":"u2",\#(fields)}"#)
        #expect(record.rangeError() == nil)
    }

    @Test("set_unread with more conversations than a user may keep is out_of_range")
    func tooManyUnreadConversations() {
        let counts = Dictionary(uniqueKeysWithValues: (0...InputRanges.unreadConversations).map { ("c\($0)", 1) })
        let record = RegistryRecord(
            op: .setUnread, appID: "app1", user: "u2", unread: Unread(total: 1, conversations: counts))
        #expect(record.rangeError()?.field == "unread.conversations")
    }
}
