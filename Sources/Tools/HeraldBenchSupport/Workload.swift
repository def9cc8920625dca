// The bench's users, conversations and events, and what Herald must do with them.
// Users are written to Redis directly (pipelined); each event's outcome is predicted with
// HeraldCore's own rules (Suppression.decide, Renderer.render) on the same state and pipeline.
import Foundation
import HeraldConfig
import HeraldCore
import HeraldKafka
import HeraldRedis
import Synchronization

package struct WorkloadOptions {
    package var users = 10_000
    package var conversationSize = 50
    package var dnd = 0.1
    package var muted = 0.1
    package var online = 0.1
    package var profile = "compact"  // compact (app1) | sendbird (app2) | cometchat (app3)
    package var textBytes = 60
    /// Conversations outside the run each user is also in, as a chat user in many channels is: Redis holds an
    /// unread count for each (and the total), and the user's preferences a push setting for one in five.
    package var otherConversations = 0
    package var tag = String(UInt64.random(in: 0..<(1 << 40)), radix: 36)

    package init() {}

    /// The Markdown table rows the reports show for these options (users, conversation size, preference mix,
    /// payload profile).
    package var scenarioRows: String {
        var s = "| users | \(users) (one APNs token each) |\n"
        s += "| conversation size | \(conversationSize) |\n"
        s += String(
            format: "| preference mix | %.0f %% DND, %.0f %% muted, %.0f %% online |\n", dnd * 100, muted * 100,
            online * 100)
        s += "| payload profile | \(profile) (\(appID)), text \(textBytes) bytes |\n"
        if otherConversations > 0 {
            s +=
                "| other conversations per user (unread counts; a push setting in one in five) | \(otherConversations) |\n"
        }
        return s
    }

    package var appID: String {
        switch profile {
        case "sendbird": return "app2"
        case "cometchat": return "app3"
        default: return "app1"
        }
    }
}

/// One event ready to publish, with its predicted outcome.
package struct PlannedEvent {
    package var key: String
    package var bytes: [UInt8]
    package var eventID: String
    package var createdAt: Int64
    package var kind: NotificationKind
    package var notifications: [String]  // apns-ids
    package var suppressed: [String: Int]  // reason -> recipients
    package var renderErrors: Int
}

package final class Workload {
    package let options: WorkloadOptions
    package let appID: String
    package let app: AppConfig
    /// The pipeline file's `kafka.properties` (the bench's producer uses them too, e.g. on Tansu's S3 engine).
    package let kafkaProperties: [String: String]
    /// The pipeline file's topic names.
    package let topics: TopicNames
    package private(set) var users: [String] = []
    package private(set) var states: [String: UserState] = [:]
    package private(set) var conversations: [(id: String, members: [String])] = []
    package let text: String
    /// Mixed priorities: a callee with one VoIP token and a direct-message pair.
    package let callee: String, caller: String, dmSender: String, dmRecipient: String

    package init(options: WorkloadOptions, pipelineFile: String, now: Int64) throws {
        self.options = options
        appID = options.appID
        let loaded: LoadedPipeline
        do { loaded = try PipelineLoader.load(path: pipelineFile) } catch {
            throw BenchError("cannot load \(pipelineFile): \(error)")
        }
        app = loaded.config.apps.app(appID)
        kafkaProperties = loaded.config.kafka.properties
        topics = loaded.config.kafka.topics
        let t = options.tag
        let words = ["trail", "summit", "water", "meet", "seven", "bring", "maps", "snacks", "north", "ridge"]
        var s = ""
        var w = 0
        while s.utf8.count < options.textBytes { s += (s.isEmpty ? "" : " ") + words[w % words.count]; w += 1 }
        text = String(s.prefix(options.textBytes))
        callee = "vc-\(t)"; caller = "vr-\(t)"; dmSender = "da-\(t)"; dmRecipient = "db-\(t)"

        // A DND window around now in UTC (it covers the whole run), muted = this user's group muted.
        let minuteNow = Int((now / 60_000) % 1440)
        let dnd = DoNotDisturb(
            start: ClockTime(hour: ((minuteNow + 1440 - 180) % 1440) / 60),
            end: ClockTime(hour: ((minuteNow + 600) % 1440) / 60), timezone: "UTC")
        let size = max(2, options.conversationSize)
        let convCount = max(1, (options.users + size - 1) / size)
        for k in 0..<convCount {
            let members = (0..<size).map { k * size + $0 }.filter { $0 < options.users }.map { "u\(t)-\($0)" }
            if members.count >= 2 { conversations.append(("g\(t)-\(k)", members)) }
        }
        for i in 0..<options.users {
            let user = "u\(t)-\(i)"
            users.append(user)
            let token = Self.token(tag: t, index: i, salt: 0)
            var state = UserState(devices: [Device(token: token, kind: .apns, registeredAt: now - 1000)])
            // Exclusive categories from a hash of the index: dnd, muted, online, else plain.
            let u = Double((UInt64(i) &* 0x9E37_79B9_7F4A_7C15) >> 11) / Double(1 << 53)
            if u < options.dnd {
                state.preferences.dnd = dnd
            } else if u < options.dnd + options.muted {
                state.preferences.conversations["g\(t)-\(i / size)"] = ConversationPreference(
                    trigger: .default, muted: true)
            } else if u < options.dnd + options.muted + options.online {
                state.online = [token]
            }
            if options.otherConversations > 0 {
                for k in 0..<options.otherConversations {
                    state.unread.conversations["side-\(k)"] = k % 5 + 1
                    if k % 5 == 0 {
                        state.preferences.conversations["side-\(k)"] = ConversationPreference(
                            trigger: k % 10 == 0 ? .mentionOnly : .off)
                    }
                }
                state.unread.total = state.unread.conversations.values.reduce(0, +)
            }
            states[user] = state
        }
        states[callee] = UserState(devices: [
            Device(token: Self.token(tag: t, index: 1, salt: 7), kind: .voip, registeredAt: now - 1000)
        ])
        states[caller] = UserState(devices: [
            Device(token: Self.token(tag: t, index: 2, salt: 7), kind: .apns, registeredAt: now - 1000)
        ])
        states[dmSender] = UserState(devices: [
            Device(token: Self.token(tag: t, index: 3, salt: 7), kind: .apns, registeredAt: now - 1000)
        ])
        states[dmRecipient] = UserState(devices: [
            Device(token: Self.token(tag: t, index: 4, salt: 7), kind: .apns, registeredAt: now - 1000)
        ])
    }

    /// 64 hex characters, unique per (tag, index, salt).
    package static func token(tag: String, index: Int, salt: Int) -> String {
        var h: UInt64 = 0xCBF2_9CE4_8422_2325
        for b in "\(tag):\(index):\(salt)".utf8 { h = (h ^ UInt64(b)) &* 0x100_0000_01B3 }
        var out = ""
        var x = h
        for _ in 0..<4 {
            x = x &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            out += String(format: "%016llx", x ^ h)
        }
        return out
    }

    /// Writes every user's state hash and every conversation's members to Redis in pipelined batches.
    package func load(redisURL: String, now: Int64) async throws {
        let conn = RedisConnection(configuration: try RedisConfiguration(url: redisURL))
        defer { conn.close() }
        var batch: [RedisCommand] = []
        func flush() async throws {
            guard !batch.isEmpty else { return }
            for r in try await conn.pipeline(batch) { _ = try r.orThrow() }
            batch.removeAll(keepingCapacity: true)
        }
        for (user, state) in states {
            let key = RedisKeys.userState(app: appID, user: user)
            batch.append(RedisCommand("DEL", key))
            var fields: [any RedisArgument] = [key]
            if !state.devices.isEmpty {
                fields += [UserRecord.devicesField, UserRecord.encodeDevices(state.devices)]
            }
            if state.preferences != Preferences() {
                fields += [UserRecord.preferencesField, state.preferences.jsonBytes()]
            }
            if !state.unread.conversations.isEmpty {
                fields += [RedisKeys.unreadTotalField, String(state.unread.total)]
                for (id, count) in state.unread.conversations {
                    fields += [RedisKeys.unreadField(conversation: id), String(count)]
                }
            }
            if !state.online.isEmpty {
                fields += [UserRecord.onlineField, UserRecord.encodeOnline(state.online, expiry: now + 86_400_000)]
            }
            if fields.count > 1 { batch.append(RedisCommand("HSET", fields)) }
            if batch.count >= 5000 { try await flush() }
        }
        for c in conversations {
            let mk = RedisKeys.members(app: appID, conversation: c.id)
            batch.append(RedisCommand("DEL", mk))
            // In pieces: a million-member conversation is not one command.
            var start = 0
            while start < c.members.count {
                let end = min(c.members.count, start + 10_000)
                batch.append(RedisCommand("SADD", [mk] + c.members[start..<end]))
                start = end
                if batch.count >= 50 { try await flush() }
            }
            if batch.count >= 5000 { try await flush() }
        }
        try await flush()
    }

    package func groupEvent(_ n: Int, createdAt: Int64) -> PlannedEvent {
        let c = conversations[n % conversations.count]
        let sender = c.members[(n / conversations.count) % c.members.count]
        let id = "b\(options.tag)-\(n)"
        let json =
            #"{"event_id":"\#(id)","app_id":"\#(appID)","kind":"message","created_at":\#(createdAt),"#
            + #""sender":{"id":"\#(sender)","name":"Bench \#(sender)"},"#
            + #""conversation":{"id":"\#(c.id)","type":"group","name":"Bench group"},"#
            + #""message":{"id":"m\#(id)","type":"text","text":"\#(text)"}}"#
        return plan(
            key: c.id, json: json, id: id, createdAt: createdAt, kind: .group,
            // Resolve fans out to the members but the sender (not counted as a suppression).
            candidates: c.members.filter { $0 != sender })
    }

    package func callEvent(_ n: Int, createdAt: Int64) -> PlannedEvent {
        let id = "c\(options.tag)-\(n)"
        let conv = "call-\(options.tag)"
        let json =
            #"{"event_id":"\#(id)","app_id":"\#(appID)","kind":"call","created_at":\#(createdAt),"#
            + #""sender":{"id":"\#(caller)","name":"Caller"},"conversation":{"id":"\#(conv)","type":"direct"},"#
            + #""recipients":["\#(callee)"],"call":{"action":"initiated","session_id":"s\#(id)","type":"audio"}}"#
        return plan(key: conv, json: json, id: id, createdAt: createdAt, kind: .call, candidates: [callee])
    }

    package func directEvent(_ n: Int, createdAt: Int64) -> PlannedEvent {
        let id = "d\(options.tag)-\(n)"
        let conv = "dm-\(options.tag)"
        let json =
            #"{"event_id":"\#(id)","app_id":"\#(appID)","kind":"message","created_at":\#(createdAt),"#
            + #""sender":{"id":"\#(dmSender)","name":"Ann"},"conversation":{"id":"\#(conv)","type":"direct"},"#
            + #""recipients":["\#(dmRecipient)"],"message":{"id":"m\#(id)","type":"text","text":"\#(text)"}}"#
        return plan(key: conv, json: json, id: id, createdAt: createdAt, kind: .direct, candidates: [dmRecipient])
    }

    private func plan(
        key: String, json: String, id: String, createdAt: Int64, kind: NotificationKind,
        candidates: [String]
    ) -> PlannedEvent {
        let bytes = Array(json.utf8)
        var p = PlannedEvent(
            key: key, bytes: bytes, eventID: id, createdAt: createdAt, kind: kind,
            notifications: [], suppressed: [:], renderErrors: 0)
        guard let event = try? ChatEvent.decode(bytes) else {
            fatalError("the bench built an invalid event: \(json.prefix(200))")
        }
        for user in candidates {
            let state = states[user] ?? UserState()
            switch Suppression.decide(event: event, recipient: user, state: state, app: app, at: createdAt) {
            case .suppress(let reason):
                p.suppressed[reason.rawValue, default: 0] += 1
            case .deliver(let targets):
                // One APNs request per target device, identified as Herald's renderer identifies it
                // (rendering itself is left to Herald: the bench's own CPU stays small).
                for t in targets { p.notifications.append(APNsID.derive(eventID: id, token: t.token)) }
            }
        }
        return p
    }
}

/// Publishes planned events with the project's Kafka producer, keyed by conversation. A record the
/// broker refused (e.g. Tansu's "out of order sequence number", which leaves an idempotent producer
/// unusable) is published again through a new producer by `retryFailures()`: the input stays complete,
/// and `republished` says how often that was needed.
package final class EventPublisher: @unchecked Sendable {
    private let config: KafkaProducerConfiguration
    private var producer: KafkaProducer
    /// Records the broker refused, from the delivery reports (which come on librdkafka's thread).
    private let failedRecords = Mutex<[ProducerRecord]>([])
    package private(set) var republished = 0

    package init(brokers: String, extraProperties: [String: String] = [:]) throws {
        var config = KafkaProducerConfiguration(
            brokers: [brokers], clientID: "herald-bench", extraProperties: extraProperties)
        config.linger = .milliseconds(2)
        config.maxQueuedRecords = 500_000
        self.config = config
        producer = try KafkaProducer(configuration: config)
    }

    package func publish(topic: String = "chat.events", key: String?, value: [UInt8]?) async {
        await publish(ProducerRecord(topic: topic, key: key, value: value))
    }

    private func publish(_ record: ProducerRecord) async {
        var attempts = 0
        while true {
            do {
                try producer.produce(record) { [self] report in
                    if !report.isDelivered { failedRecords.withLock { $0.append(record) } }
                }
                return
            } catch {
                attempts += 1
                if attempts % 2000 == 0 { await renewProducer() }  // stuck for ~10 s: the producer may be dead
                try? await Task.sleep(for: .milliseconds(5))
            }
        }
    }

    private func renewProducer() async {
        try? await producer.shutdown(timeout: .seconds(2))
        while true {
            if let p = try? KafkaProducer(configuration: config) { producer = p; return }
            try? await Task.sleep(for: .milliseconds(200))
        }
    }

    /// Publishes refused records again through a fresh producer; returns how many.
    @discardableResult
    package func retryFailures() async -> Int {
        let failed: [ProducerRecord] = failedRecords.withLock {
            let f = $0
            $0.removeAll()
            return f
        }
        guard !failed.isEmpty else { return 0 }
        log("\(failed.count) records refused by the broker: publishing them again through a new producer")
        await renewProducer()
        for r in failed { await publish(r) }
        republished += failed.count
        return failed.count
    }

    /// Records the broker refused and that were not published again (yet).
    package var unrecovered: Int {
        failedRecords.withLock { $0.count }
    }

    /// Waits for every delivery report, publishing refused records again (a few rounds).
    package func flush() async {
        for _ in 0..<5 {
            try? await producer.flush(timeout: .seconds(60))
            if await retryFailures() == 0 { return }
        }
    }

    package func close() async {
        try? await producer.shutdown(timeout: .seconds(10))
    }
}
