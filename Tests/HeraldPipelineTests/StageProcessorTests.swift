import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import Synchronization
import Testing

// The per-stage processing functions, without Kafka, Redis or APNs: inputs in, results out.

let repoRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

func exampleBytes(_ name: String) throws -> [UInt8] {
    Array(try Data(contentsOf: repoRoot.appendingPathComponent("pipelines/examples/\(name)")))
}

func exampleApps() throws -> AppDirectory {
    try PipelineLoader.load(path: repoRoot.appendingPathComponent("pipelines/example.yaml").path).config.apps
}

func exampleState() throws -> StateFixture {
    try StageCodec.decode(StateFixture.self, from: exampleBytes("state.json"))
}

let fixedNow = Date(timeIntervalSince1970: 1_732_000_100)
let fixedContext = BatchContext(now: { fixedNow })

/// JSON records (registry and token-feedback records).
func decode<T: JSONRecord>(_ type: T.Type, _ output: StageOutput) throws -> T {
    try StageCodec.decode(T.self, from: output.value)
}

/// Stage records in their wire form (binary between stages).
func decode<T: StageRecord>(_ type: T.Type, _ output: StageOutput) throws -> T {
    try StageCodec.decode(T.self, from: output.value)
}

func event(_ json: String) -> StageInput { StageInput(topic: "chat.events", value: Array(json.utf8)) }

@Suite struct IngestTests {
    let ingest = IngestProcessor(ingestedTopic: "herald.ingested")

    @Test func validEventIsForwardedKeyedByConversation() async throws {
        let results = await ingest.process(
            [StageInput(topic: "chat.events", value: try exampleBytes("event-group.json"))],
            context: fixedContext)
        #expect(results.count == 1)
        let output = try #require(results[0].outputs.first)
        #expect(output.topic == "herald.ingested")
        #expect(output.key == "c1")
        let record = try decode(IngestedRecord.self, output)
        #expect(record.event.eventID == "e-9f2c")
        #expect(record.ingestedAt == 1_732_000_100_000)
        #expect(results[0].deadLetter == nil)
    }

    @Test func invalidRecordsGoToTheDLQWithTheField() async {
        let results = await ingest.process(
            [
                event("not json"),
                StageInput(topic: "chat.events", value: nil),
                event(#"{"event_id": "e1", "app_id": "app1", "kind": "message"}"#),
            ], context: fixedContext)
        #expect(results.count == 3)
        for result in results {
            #expect(result.outputs.isEmpty)
            #expect(result.deadLetter?.reason == "invalid")
        }
        #expect(results[1].deadLetter?.detail.contains("tombstone") == true)
        #expect(results[2].deadLetter?.detail.isEmpty == false)
    }

    @Test("a vendor REST form (em_ignore_notification: 1) is forwarded with a warning note, not dead-lettered")
    func lenientFieldIsForwardedWithAWarning() async throws {
        let results = await ingest.process(
            [
                event(
                    #"{"event_id":"e1","app_id":"app1","kind":"message","created_at":"1732000000000","sender":{"id":"u1"},"conversation":{"id":"c1","type":"group"},"message":{"id":"m1","text":"hi"},"ext":{"em_ignore_notification":1}}"#
                )
            ],
            context: fixedContext)
        #expect(results[0].deadLetter == nil)
        let record = try decode(IngestedRecord.self, try #require(results[0].outputs.first))
        #expect(record.event.ext.ignoreNotification && record.event.createdAt == 1_732_000_000_000)
        #expect(
            results[0].notes == [
                .inputWarning(field: "created_at"), .inputWarning(field: "ext.em_ignore_notification"),
            ])
    }

    @Test func openChannelIsDroppedCountedAndExplainedNotDeadLettered() async throws {
        let results = await ingest.process(
            [StageInput(topic: "chat.events", value: try exampleBytes("event-open.json"))],
            context: fixedContext)
        #expect(results[0].outputs.isEmpty)
        #expect(results[0].deadLetter == nil)
        #expect(results[0].notes == [.suppressed(reason: "channel_type")])
        #expect(results[0].explain.first?.decision == "drop")
        #expect(results[0].explain.first?.reason == "channel_type")
    }
}

/// A state reader that fails `failures` times with a transient error first.
final class FlakyReader: StateReader, @unchecked Sendable {
    let inner: FixtureStateReader
    private let lock = NSLock()
    private var failures: Int
    init(_ inner: FixtureStateReader, failures: Int) {
        self.inner = inner
        self.failures = failures
    }
    private func maybeFail() throws {
        try lock.withLock {
            if failures > 0 {
                failures -= 1
                throw TransientFailure("connection_broken")
            }
        }
    }
    func members(_ conversations: [ConversationRef]) async throws -> [[String]] {
        try maybeFail()
        return try await inner.members(conversations)
    }
    func loadUsers(app: String, users: [String], now: Int64) async throws -> [String: UserState] {
        try maybeFail()
        return try await inner.loadUsers(app: app, users: users, now: now)
    }
}

@Suite struct ResolveTests {
    func ingested(_ json: String) throws -> StageInput {
        let event = try ChatEvent.decode(Array(json.utf8))
        return StageInput(
            topic: "herald.ingested", value: StageCodec.encode(IngestedRecord(event: event, ingestedAt: 0)))
    }

    func groupEvent(_ id: String, conversation: String = "c1", recipients: String = "") -> String {
        """
        {"event_id": "\(id)", "app_id": "app1", "kind": "message", "created_at": 1732000000000,
         "sender": {"id": "u1", "name": "Cindy"}, "conversation": {"id": "\(conversation)", "type": "group"},
         \(recipients.isEmpty ? "" : "\"recipients\": [\(recipients)],")
         "message": {"id": "m1", "type": "text", "text": "Hi"}}
        """
    }

    @Test func fansOutToMembersMinusSenderWithTheirStateInTwoRoundTrips() async throws {
        let reader = FixtureStateReader(fixtures: ["app1": try exampleState()])
        let resolve = ResolveProcessor(resolvedTopic: "herald.resolved", state: reader)
        let batch = [
            try ingested(groupEvent("e1")),
            try ingested(groupEvent("e2", conversation: "c2", recipients: #""u2", "u1""#)),
            try ingested(groupEvent("e3")),
        ]
        let results = await resolve.process(batch, context: fixedContext)
        // c1 has u1..u6; u1 is the sender.
        #expect(results[0].outputs.map(\.key) == ["u2", "u3", "u4", "u5", "u6"])
        #expect(results[1].outputs.map(\.key) == ["u2"])
        #expect(results[2].outputs.count == 5)
        // One round trip for the members, one for every user of the app: not one per recipient.
        #expect(reader.roundTrips == 2)
        let u2 = try decode(ResolvedRecord.self, results[0].outputs[0])
        #expect(u2.recipient == "u2")
        #expect(u2.state.unread.total == 5)
        #expect(u2.state.preferences.languages == ["fr", "de"])
        // The sender's push display name is carried.
        #expect(u2.senderDisplayName == "Cindy L.")
        // The listed sender is explained as `sender`.
        #expect(results[1].explain.contains { $0.user == "u1" && $0.reason == "sender" })
    }

    @Test func transientStateFailuresAreRetriedNotDeadLettered() async throws {
        let reader = FlakyReader(FixtureStateReader(fixtures: ["app1": try exampleState()]), failures: 2)
        let resolve = ResolveProcessor(resolvedTopic: "herald.resolved", state: reader)
        let results = await resolve.process([try ingested(groupEvent("e1"))], context: fixedContext)
        #expect(results[0].deadLetter == nil)
        #expect(results[0].outputs.count == 5)
    }

    @Test func shutdownDuringAnOutageHandsTheBatchBack() async throws {
        let reader = FlakyReader(FixtureStateReader(fixtures: [:]), failures: 1000)
        let resolve = ResolveProcessor(resolvedTopic: "herald.resolved", state: reader)
        let stopping = BatchContext(now: { fixedNow }, isStopping: { true })
        let results = await resolve.process(
            [try ingested(groupEvent("e1")), StageInput(topic: "t", value: Array("x".utf8))],
            context: stopping)
        #expect(results[0].handBack)
        #expect(results[1].deadLetter?.reason == "invalid")
    }
}

@Suite struct SuppressAndRenderTests {
    func resolved(_ user: String) throws -> StageInput {
        let event = try ChatEvent.decode(try exampleBytes("event-group.json"))
        let record = ResolvedRecord(
            event: event, recipient: user, state: try exampleState().user(user), senderDisplayName: "Cindy L.")
        return StageInput(topic: "herald.resolved", value: StageCodec.encode(record))
    }

    @Test func suppressionsCarryTheirReasonAndDeliveriesTheirTargets() async throws {
        let suppress = SuppressProcessor(deliverableTopic: "herald.deliverable", apps: try exampleApps())
        let results = await suppress.process(
            [try resolved("u2"), try resolved("u3"), try resolved("u4"), try resolved("u5")],
            context: fixedContext)
        // u2 delivers; u3 is in DND (15:00-18:00 Seoul = 06:00-09:00 UTC; the event is 07:06 UTC); u4 online;
        // u5 mention_only and not mentioned.
        #expect(results[0].outputs.map(\.key) == ["u2"])
        #expect(try decode(DeliverableRecord.self, results[0].outputs[0]).targets.count == 1)
        #expect(results[1].notes == [.suppressed(reason: "dnd")])
        #expect(results[2].notes == [.suppressed(reason: "online")])
        #expect(results[3].notes == [.suppressed(reason: "not_mentioned")])
        #expect(results[1].explain.first?.reason == "dnd")
        #expect(results[1].outputs.isEmpty && results[1].deadLetter == nil)
    }

    /// A binary input goes on as its own bytes (the fields the rules skip are not decoded); its JSON form is decoded
    /// whole and encoded again. Both give the same deliverable record, byte for byte.
    @Test func aDeliverableCarriesTheInputsBytesAsAWholeDecodeWouldWriteThem() async throws {
        let suppress = SuppressProcessor(deliverableTopic: "herald.deliverable", apps: try exampleApps())
        let binary = try resolved("u2")
        let record = try StageCodec.decode(ResolvedRecord.self, from: try #require(binary.value))
        let json = StageInput(topic: "herald.resolved", value: record.jsonBytes())
        let results = await suppress.process([binary, json], context: fixedContext)
        let fromBinary = try #require(results[0].outputs.first?.value)
        #expect(results[1].outputs.first?.value == fromBinary)
        let deliverable = try decode(DeliverableRecord.self, results[0].outputs[0])
        #expect(deliverable.event == record.event && deliverable.senderDisplayName == "Cindy L.")
        #expect(
            deliverable.state.unread == record.state.unread && deliverable.state.preferences == record.state.preferences
        )
    }

    @Test func renderMakesOneOutboundRecordPerTargetKeyedByToken() async throws {
        let event = try ChatEvent.decode(try exampleBytes("event-group.json"))
        let devices = [
            Device(token: String(repeating: "a", count: 64), bundleID: "com.example.chat"),
            Device(token: String(repeating: "b", count: 64), bundleID: "com.example.chat"),
        ]
        let record = DeliverableRecord(
            event: event, recipient: "u2", state: UserState(devices: devices), targets: devices)
        let render = RenderProcessor(outboundTopic: "herald.outbound", apps: try exampleApps())
        let results = await render.process(
            [StageInput(topic: "herald.deliverable", value: StageCodec.encode(record))],
            context: fixedContext)
        #expect(results[0].outputs.map(\.key) == devices.map(\.token))
        let outbound = try decode(OutboundRecord.self, results[0].outputs[0])
        #expect(outbound.attempt == 1)
        #expect(outbound.eventID == "e-9f2c")
        #expect(outbound.request.topic == "com.example.chat")
        #expect(outbound.request.payloadString.contains("Cindy: Bye!"))
    }

    @Test func renderErrorsAreDeadLetteredWithTheirCode() async throws {
        let event = try ChatEvent.decode(try exampleBytes("event-group.json"))
        let device = Device(token: String(repeating: "a", count: 64), bundleID: nil)
        let record = DeliverableRecord(
            event: event, recipient: "u2", state: UserState(devices: [device]), targets: [device])
        // No credentials: no bundle id to take the topic from.
        let render = RenderProcessor(outboundTopic: "herald.outbound", apps: AppDirectory())
        let results = await render.process(
            [StageInput(topic: "herald.deliverable", value: StageCodec.encode(record))],
            context: fixedContext)
        #expect(results[0].outputs.isEmpty)
        #expect(results[0].deadLetter?.reason == "no_topic")
    }
}

/// Counts as Redis does (`CountBook`, the reference of the Redis scripts), starting from a fixture's unread counts.
final class FixtureCounter: MessageCounter {
    let book: Mutex<CountBook>

    init(_ fixture: StateFixture) {
        var book = CountBook()
        for (user, state) in fixture.users { book.unread[user] = state.unread }
        self.book = Mutex(book)
    }

    func count(app: String, _ keys: [CountKey]) async throws -> [CountsAfter] {
        book.withLock { book in keys.map { book.count($0) } }
    }
}

@Suite struct PipelineParityTests {
    /// ingest -> resolve (counting for the apps that keep counts) -> suppress -> render over the example events and
    /// state delivers exactly what `heraldctl simulate` predicts.
    @Test(arguments: ["event-group.json", "event-call.json", "event-direct.json", "event-silent.json"])
    func stagesAgreeWithTheSimulator(_ file: String) async throws {
        let apps = try exampleApps()
        let fixture = try exampleState()
        let bytes = try exampleBytes(file)
        let expected = try Simulator.simulate(eventBytes: bytes, fixture: fixture, apps: apps, at: nil, now: fixedNow)
            .filter { $0.decision == .deliver }.flatMap(\.notifications)

        let appID = try ChatEvent.decode(bytes).appID
        var inputs = [StageInput(topic: "chat.events", value: bytes)]
        let processors: [any StageProcessor] = [
            IngestProcessor(ingestedTopic: "i"),
            ResolveProcessor(
                resolvedTopic: "r", state: FixtureStateReader(fixtures: [appID: fixture]),
                counting: ResolveCounting(counter: FixtureCounter(fixture), apps: apps)),
            SuppressProcessor(deliverableTopic: "d", apps: apps),
            RenderProcessor(outboundTopic: "o", apps: apps),
        ]
        for processor in processors {
            let results = await processor.process(inputs, context: fixedContext)
            #expect(results.allSatisfy { $0.deadLetter == nil && !$0.handBack })
            inputs = results.flatMap(\.outputs).map { StageInput(topic: $0.topic, value: $0.value) }
        }
        let sent = try inputs.map { try StageCodec.decode(OutboundRecord.self, from: $0.value ?? []).request }
        #expect(!expected.isEmpty)
        #expect(Set(sent) == Set(expected))
    }
}
