// The registry's read sync (docs/behaviour.md §6c): an applied mark_read produces a conversation_read deliverable for
// the user's other devices, which render turns into background pushes; the reading device, a user with no other
// device, the rate limit and an app with read_sync off produce nothing.
import Foundation
import HeraldCore
import HeraldPipeline
import Testing

/// The read sync's state and rate limit in memory (`ReadSync.admit`, as the Redis script).
final class MemoryReadSync: ReadSyncStore, @unchecked Sendable {
    // @unchecked Sendable: every field is guarded by `lock`.
    private let lock = NSLock()
    var states: [String: UserState] = [:]
    var limiters: [String: ReadSyncLimiter] = [:]
    var asked = 0

    func userState(app: String, user: String, conversation: String?, now: Int64) async throws -> UserState {
        lock.withLock { states[user] ?? UserState() }
    }

    func admit(
        app: String, user: String, conversation: String?, readAt: Int64?, now: Int64, policy: ReadSyncPolicy
    ) async throws -> ReadSyncOutcome {
        lock.withLock {
            asked += 1
            let (outcome, next) = ReadSync.admit(
                limiters[user], conversation: conversation ?? ReadSync.everything,
                readAt: readAt.map { String($0) } ?? "", now: now, policy: policy)
            limiters[user] = next
            return outcome
        }
    }
}

@Suite struct ReadSyncStageTests {
    static let laptop = token("a")
    static let phone = token("b")
    /// The tests' read times are milliseconds after this (a read time is within `InputRanges.timestampMillis`).
    static let epoch: Int64 = 1_732_000_000_000

    func markRead(_ user: String, conversation: String? = "c1", reading: String? = laptop, at: Int64) -> StageInput {
        var fields = #""op": "mark_read", "app_id": "app1", "user": "\#(user)", "read_at": \#(Self.epoch + at)"#
        if let conversation { fields += #", "conversation": "\#(conversation)""# }
        if let reading { fields += #", "token": "\#(reading)""# }
        return StageInput(topic: "herald.registry", value: Array("{\(fields)}".utf8))
    }

    func registry(_ store: MemoryReadSync, policy: ReadSyncPolicy = ReadSyncPolicy()) -> RegistryProcessor {
        var app = AppConfig(appID: "app1", credentials: [APNsCredential(bundleID: "com.example.chat")])
        app.readSync = policy
        var processor = RegistryProcessor(
            tokenFeedbackTopic: "herald.token-feedback", writer: MemoryRegistry(),
            apps: AppDirectory(apps: ["app1": app], listedOnly: true))
        processor.readSync = store
        processor.deliverableTopic = "herald.deliverable"
        return processor
    }

    func store() -> MemoryReadSync {
        let store = MemoryReadSync()
        let devices = [Self.laptop, Self.phone].map {
            Device(token: $0, kind: .apns, environment: .production, bundleID: "com.example.chat")
        }
        var preferences = Preferences()
        preferences.conversations = [
            "c1": ConversationPreference(trigger: .all), "c5": ConversationPreference(muted: true),
        ]
        store.states["u2"] = UserState(
            devices: devices, preferences: preferences, unread: Unread(total: 3, conversations: ["c2": 3]))
        store.states["u3"] = UserState(devices: [devices[0]])
        return store
    }

    @Test("a mark_read from the laptop: one deliverable for the phone, rendered as a background push")
    func clearsTheOtherDevice() async throws {
        let store = store()
        let results = await registry(store).process([markRead("u2", at: 1_000)], context: fixedContext)
        let result = try #require(results.first)
        #expect(result.deadLetter == nil)
        #expect(result.notes.contains(.registry(op: "mark_read", outcome: "applied")))
        #expect(result.notes.contains(.readSync(outcome: "sent")))
        let output = try #require(result.outputs.first)
        #expect(result.outputs.count == 1 && output.topic == "herald.deliverable" && output.key == "u2")
        let record = try StageCodec.decode(DeliverableRecord.self, from: output.value)
        #expect(record.event.kind == .conversationRead && record.recipient == "u2")
        #expect(record.targets.map(\.token) == [Self.phone])
        // The record holds the read conversation's part of the state, not every conversation's.
        #expect(record.state.unread == Unread(total: 3))
        #expect(record.state.preferences.conversations == ["c1": ConversationPreference(trigger: .all)])
        #expect(
            record.event.eventID
                == ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: Self.epoch + 1_000).eventID)

        // Render: the request for the phone only.
        let render = RenderProcessor(
            outboundTopic: "herald.outbound", apps: AppDirectory(apps: ["app1": registry(store).apps!.app("app1")]))
        let rendered = render.process(StageInput(topic: "herald.deliverable", value: output.value), now: Date())
        #expect(rendered.deadLetter == nil && rendered.outputs.count == 1)
        let outbound = try StageCodec.decode(OutboundRecord.self, from: try #require(rendered.outputs.first).value)
        #expect(outbound.request.token == Self.phone && outbound.request.pushType == .background)
        #expect(outbound.request.priority == 5)
        #expect(
            outbound.eventCreatedAt == Self.epoch + 1_000, "the event's created_at (the read time) files send's record")
        let payload = outbound.request.payloadString
        #expect(payload.contains(#""thread-id":"c1""#) && payload.contains(#""badge":3"#), "\(payload)")
    }

    @Test("the only device read: no_other_device, nothing produced, no slot taken")
    func onlyTheReader() async throws {
        let store = store()
        let result = try #require(await registry(store).process([markRead("u3", at: 1)], context: fixedContext).first)
        #expect(result.outputs.isEmpty && result.notes.contains(.readSync(outcome: "no_other_device")))
        #expect(store.asked == 0)
        #expect(result.explain.first?.reason == "no_other_device" && result.explain.first?.user == nil)
    }

    @Test("twice in a row: the second is rate limited; another conversation goes; a replay goes again")
    func rateLimited() async throws {
        let store = store()
        let processor = registry(store)
        let results = await processor.process(
            [
                markRead("u2", at: 10), markRead("u2", at: 11), markRead("u2", conversation: "c9", at: 12),
                markRead("u2", at: 10),
            ], context: fixedContext)
        #expect(
            results.map { $0.notes.last } == [
                .readSync(outcome: "sent"), .readSync(outcome: "rate_limited"), .readSync(outcome: "sent"),
                .readSync(outcome: "sent"),
            ])
        #expect(results.map(\.outputs.count) == [1, 0, 1, 1])
        // The replay carries the same record, so send's delivery records keep it from arriving twice.
        #expect(results[3].outputs == results[0].outputs)
    }

    @Test("read_sync off: the counts are reset, no clear")
    func off() async throws {
        let store = store()
        let result = try #require(
            await registry(store, policy: .off).process([markRead("u2", at: 1)], context: fixedContext).first)
        #expect(result.notes == [.registry(op: "mark_read", outcome: "applied"), .readSync(outcome: "off")])
        #expect(result.outputs.isEmpty)
    }

    @Test("no reading device named: every device gets the clear")
    func noReader() async throws {
        let store = store()
        let result = try #require(
            await registry(store).process([markRead("u2", reading: nil, at: 1)], context: fixedContext).first)
        let record = try StageCodec.decode(DeliverableRecord.self, from: try #require(result.outputs.first).value)
        #expect(Set(record.targets.map(\.token)) == [Self.laptop, Self.phone])
    }

    @Test("a mark_read with an empty token is dead-lettered invalid")
    func emptyToken() async {
        let results = await registry(store()).process(
            [
                StageInput(
                    topic: "herald.registry",
                    value: Array(#"{"op": "mark_read", "app_id": "app1", "user": "u2", "token": ""}"#.utf8))
            ], context: fixedContext)
        #expect(results.first?.deadLetter?.reason == "invalid")
    }
}
