// Property-based tests (x-sheep/swift-property-based): the boundary values of `BoundaryValues` (0, -1, the 32-,
// 53- and 64-bit limits, unsigned limits, floats and exponents, strings at and past each limit, braces, NUL,
// invalid UTF-8, the largest scalar) thrown at every input topic's decoder and every stage's processing. Each input
// must end in a result or a dead letter with a reason; a trap ends the test process, which fails the run.

import Foundation
import HeraldCore
import HeraldPipeline
import PropertyBased
import Testing

/// An input that ended in something: outputs, notes (a suppression, a registry outcome), an explain entry, or a
/// dead letter with a reason and a detail. Never handed back (no stage here stops) and never empty-handed.
func accounted(_ result: StageResult) -> Bool {
    if result.handBack { return false }
    if let dead = result.deadLetter { return !dead.reason.isEmpty && !dead.detail.isEmpty }
    return !result.outputs.isEmpty || !result.notes.isEmpty || !result.explain.isEmpty
}

/// The integer written after `"key":` in `record` (up to the next `,` or `}`), when it is one within 64 bits.
func integer(after key: String, in record: [UInt8]) -> Int64? {
    guard let start = record.firstRange(of: Array("\"\(key)\":".utf8))?.upperBound else { return nil }
    let text = record[start...].prefix { $0 != UInt8(ascii: ",") && $0 != UInt8(ascii: "}") }
    return Int64(String(decoding: text, as: UTF8.self))
}

/// ingest -> resolve -> suppress -> render -> send over the example state, each stage's results checked.
struct Chain {
    let ingest = IngestProcessor(ingestedTopic: "herald.ingested")
    let resolve: ResolveProcessor
    let suppress: SuppressProcessor
    let render: RenderProcessor
    let send = sendProcessor(ScriptedTransport([:]), MemoryLedger())

    init() throws {
        resolve = ResolveProcessor(
            resolvedTopic: "herald.resolved", state: FixtureStateReader(fixtures: ["app1": try exampleState()]))
        suppress = SuppressProcessor(deliverableTopic: "herald.deliverable", apps: try exampleApps())
        render = RenderProcessor(outboundTopic: "herald.outbound", apps: try exampleApps())
    }

    /// Runs `inputs` from `stage` on, checking that every input of every stage is accounted for; returns the
    /// results of the first stage.
    @discardableResult
    func run(_ inputs: [StageInput], from stage: Int = 0, label: String) async -> [StageResult] {
        let stages: [any StageProcessor] = [ingest, resolve, suppress, render, send]
        var batch = inputs
        var first: [StageResult] = []
        for (n, processor) in stages.enumerated().dropFirst(stage) {
            let results = await processor.process(batch, context: fixedContext)
            if n == stage { first = results }
            #expect(results.count == batch.count, "\(label): \(processor.stage) answered every input")
            for (input, result) in zip(batch, results) where !accounted(result) {
                Issue.record(
                    "\(label): \(processor.stage) left an input unaccounted for (\(input.value?.count ?? 0) bytes)")
            }
            let topics = ["herald.ingested", "herald.resolved", "herald.deliverable", "herald.outbound"]
            guard n < topics.count else { break }
            batch = results.flatMap(\.outputs).filter { $0.topic == topics[n] }.map {
                StageInput(topic: $0.topic, value: $0.value)
            }
            if batch.isEmpty { break }
        }
        return first
    }
}

@Suite("Boundary values at every input")
struct BoundaryPropertyTests {
    static let chatEvents = BoundaryValues.chatEvents(
        app: "app1", conversation: "c1", sender: "u1", recipient: "u2", idPrefix: "edge")
    static let registryRecords = BoundaryValues.registryRecords(app: "app1", user: "u2")

    @Test("every boundary value in every chat.events field: a result or a dead letter, through every stage")
    func chatEventsThroughThePipeline() async throws {
        let chain = try Chain()
        let inputs = Self.chatEvents.map { StageInput(topic: "chat.events", value: $0.bytes) }
        let results = await chain.run(inputs, label: "chat.events")
        // created_at: an integer outside 2000-2200 is out_of_range, naming the field; inside, it is admitted.
        for (record, result) in zip(Self.chatEvents, results) where record.field == "created_at" {
            guard let value = integer(after: "created_at", in: record.bytes) else { continue }
            if InputRanges.timestampMillis.contains(value) {
                #expect(result.deadLetter == nil, "created_at \(value)")
            } else {
                #expect(result.deadLetter?.reason == "out_of_range", "created_at \(value)")
                #expect(result.deadLetter?.detail.hasPrefix("created_at") == true)
            }
        }
        #expect(results.contains { !$0.outputs.isEmpty }, "some boundary events are valid and go on")
        #expect(results.contains { $0.deadLetter?.reason == "out_of_range" })
        #expect(results.contains { $0.deadLetter?.reason == "invalid" })
    }

    @Test("the extreme event of the crash report is dead-lettered out_of_range at ingest")
    func createdAtAtInt64Max() async throws {
        let record = BoundaryValues.fill(
            BoundaryValues.chatEventTemplates(app: "app1", conversation: "c1", sender: "u1", recipient: "u2")[0]
                .template, with: Array("9223372036854775807".utf8))
        let result = try #require(
            await IngestProcessor(ingestedTopic: "herald.ingested").process(
                [StageInput(topic: "chat.events", value: record)], context: fixedContext
            ).first)
        #expect(result.deadLetter?.reason == "out_of_range")
        #expect(result.deadLetter?.detail.hasPrefix("created_at: 9223372036854775807 is outside") == true)
    }

    @Test("random chat events built from boundary values, cut and with a byte changed: never a trap")
    func mutatedChatEvents() async throws {
        let chain = try Chain()
        let records = Self.chatEvents
        await propertyCheck(
            count: 200, input: Gen.int(in: 0...(records.count - 1)), Gen.int(in: 0...Int(UInt16.max)),
            Gen.int(in: 0...255)
        ) { index, position, byte in
            var bytes = records[index].bytes
            let at = position % max(1, bytes.count)
            switch byte % 3 {
            case 0: bytes = Array(bytes.prefix(at))
            case 1: if !bytes.isEmpty { bytes[at] = UInt8(byte) }
            default: bytes.insert(contentsOf: records[(index + position) % records.count].bytes.prefix(64), at: at)
            }
            await chain.run([StageInput(topic: "chat.events", value: bytes)], label: "mutated chat event")
        }
    }

    @Test("every boundary value in every herald.registry field: applied or dead-lettered with a reason")
    func registryRecords() async {
        let store = MemoryReadSync()
        var registry = RegistryProcessor(tokenFeedbackTopic: "herald.token-feedback", writer: MemoryRegistry())
        registry.readSync = store
        registry.deliverableTopic = "herald.deliverable"
        for record in Self.registryRecords {
            let results = await registry.process(
                [StageInput(topic: "herald.registry", value: record.bytes)], context: fixedContext)
            let result = results.first ?? .handedBack
            #expect(accounted(result), "\(record.field)")
            // An integer ttl_ms or read_at outside its range is out_of_range and names the field.
            for (field, name, range) in [
                ("set_presence.ttl_ms", "ttl_ms", InputRanges.presenceTTLMillis),
                ("mark_read.read_at", "read_at", InputRanges.timestampMillis),
            ] where record.field == field {
                guard let value = integer(after: name, in: record.bytes) else { continue }
                if range.contains(value) {
                    #expect(result.deadLetter == nil, "\(field) \(value)")
                } else {
                    #expect(result.deadLetter?.reason == "out_of_range", "\(field) \(value)")
                    #expect(result.deadLetter?.detail.contains(name) == true)
                }
            }
        }
    }

    @Test("token feedback with boundary values: removed or dead-lettered with a reason")
    func tokenFeedback() async {
        let registry = RegistryProcessor(tokenFeedbackTopic: "herald.token-feedback", writer: MemoryRegistry())
        let templates = [
            #"{"app_id":"app1","user":"u2","token":"\#(token("a"))","reason":"Unregistered","dead_since":@}"#,
            #"{"app_id":"app1","user":@,"token":"\#(token("a"))","reason":"Unregistered","dead_since":1}"#,
            #"{"app_id":"app1","user":"u2","token":@,"reason":"Unregistered","dead_since":1}"#,
            #"{"app_id":"app1","user":"u2","token":"\#(token("a"))","reason":@,"dead_since":1}"#,
        ]
        for template in templates {
            for fragment in BoundaryValues.fragments {
                let results = await registry.process(
                    [StageInput(topic: "herald.token-feedback", value: BoundaryValues.fill(template, with: fragment))],
                    context: fixedContext)
                #expect(accounted(results.first ?? .handedBack))
            }
        }
    }

    /// Times, counts and attempts at the Int64 and Int limits.
    static let extremes: [Int64] = [
        .min, .min + 1, -9_007_199_254_740_992, -1, 0, 1, Int64(Int32.max), 9_007_199_254_740_992, .max - 1, .max,
    ]

    @Test("internal records carrying extreme times and counts: every stage from resolve to send answers each")
    func internalRecordsAtTheLimits() async throws {
        let chain = try Chain()
        let base = try ChatEvent.decode(try exampleBytes("event-group.json"))
        let call = try ChatEvent.decode(try exampleBytes("event-call.json"))
        let state = try exampleState()
        await propertyCheck(
            count: 150, input: Gen.int(in: 0...(Self.extremes.count - 1)),
            Gen.int(in: 0...(Self.extremes.count - 1)), Gen.int(in: 0...3)
        ) { a, b, which in
            var event = which % 2 == 0 ? base : call
            event.createdAt = Self.extremes[a]
            let other = Self.extremes[b]
            let label = "created_at \(Self.extremes[a]), other \(other), record \(which)"
            switch which {
            case 0:
                let record = IngestedRecord(event: event, ingestedAt: other)
                await chain.run(
                    [StageInput(topic: "herald.ingested", value: StageCodec.encode(record))], from: 1,
                    label: label)
            case 1, 2:
                var user = state.user("u2")
                user.unread = Unread(total: Int(other), conversations: ["c1": Int(other)])
                let record = ResolvedRecord(event: event, recipient: "u2", state: user)
                await chain.run(
                    [StageInput(topic: "herald.resolved", value: StageCodec.encode(record))], from: 2,
                    label: label)
            default:
                let device = Device(token: token("d"), bundleID: "com.example.chat")
                let record = DeliverableRecord(
                    event: event, recipient: "u2", state: UserState(devices: [device]), targets: [device])
                await chain.run(
                    [StageInput(topic: "herald.deliverable", value: StageCodec.encode(record))], from: 3,
                    label: label)
            }
        }
    }

    @Test("outbound and retry records with extreme expiry, attempt and not_before: sent, retried or dead-lettered")
    func outboundAtTheLimits() async throws {
        await propertyCheck(
            count: 150, input: Gen.int(in: 0...(Self.extremes.count - 1)),
            Gen.int(in: 0...(Self.extremes.count - 1)), Gen.int(in: 0...2)
        ) { e, a, answer in
            let tok = token("f")
            let transport = ScriptedTransport([
                tok: [
                    PushAnswer.answered(status: 200, reason: nil, timestamp: nil),
                    .answered(status: 503, reason: .serviceUnavailable, timestamp: nil),
                    .answered(status: 410, reason: .unregistered, timestamp: Self.extremes[e]),
                ][answer]
            ])
            let send = sendProcessor(transport, MemoryLedger())
            let request = PushRequest(
                token: tok, environment: .production, pushType: .alert, topic: "com.example.chat",
                priority: 10, collapseID: nil, expiration: Self.extremes[e],
                apnsID: APNsID.derive(eventID: "x", token: tok), payload: Array(#"{"aps":{}}"#.utf8))
            // not_before in the past or absent: a far-future one is held until then (and handed back on shutdown).
            let record = OutboundRecord(
                eventID: "x", appID: "app1", recipient: "u2", request: request, attempt: Int(Self.extremes[a]),
                notBefore: Self.extremes[a] > 0 ? nil : Self.extremes[a], eventCreatedAt: Self.extremes[e])
            let results = await send.process(
                [StageInput(topic: "herald.retry", value: StageCodec.encode(record))], context: fixedContext)
            #expect(results.count == 1 && accounted(results[0]), "expiration \(Self.extremes[e]), attempt \(a)")
        }
    }

    @Test("an outbound record expiring at Int64.max seconds is sent, not taken for expired")
    func expiryAtInt64Max() async throws {
        let transport = ScriptedTransport([:])
        let send = sendProcessor(transport, MemoryLedger())
        let request = PushRequest(
            token: token("g"), environment: .production, pushType: .alert, topic: "com.example.chat",
            priority: 10, collapseID: nil, expiration: .max,
            apnsID: APNsID.derive(eventID: "x", token: token("g")), payload: Array(#"{"aps":{}}"#.utf8))
        let record = OutboundRecord(eventID: "x", appID: "app1", recipient: "u2", request: request)
        let results = await send.process(
            [StageInput(topic: "herald.outbound", value: StageCodec.encode(record))], context: fixedContext)
        #expect(transport.sent == [token("g")])
        #expect(
            results.first?.deadLetter == nil && results.first?.notes.contains(.suppressed(reason: "expired")) == false)
    }

    @Test("random bytes and cut internal records at every stage's decoder: a result or a dead letter")
    func garbageAtEveryDecoder() async throws {
        let chain = try Chain()
        let event = try ChatEvent.decode(try exampleBytes("event-group.json"))
        let user = try exampleState().user("u2")
        let encoded: [(String, Int, [UInt8])] = [
            ("herald.ingested", 1, StageCodec.encode(IngestedRecord(event: event, ingestedAt: 1))),
            ("herald.resolved", 2, StageCodec.encode(ResolvedRecord(event: event, recipient: "u2", state: user))),
            (
                "herald.deliverable", 3,
                StageCodec.encode(
                    DeliverableRecord(event: event, recipient: "u2", state: user, targets: user.devices))
            ),
        ]
        await propertyCheck(
            count: 200, input: Gen.int(in: 0...(encoded.count - 1)), Gen.int(in: 0...Int(UInt16.max)),
            Gen.int(in: 0...255)
        ) { which, position, byte in
            let (topic, stage, original) = encoded[which]
            var bytes = original
            let at = position % max(1, bytes.count)
            if byte % 2 == 0 { bytes = Array(bytes.prefix(at)) } else { bytes[at] = UInt8(byte) }
            await chain.run([StageInput(topic: topic, value: bytes)], from: stage, label: "\(topic) mutated at \(at)")
        }
    }
}

/// The JSON forms of Herald's own records (every stage reads them as well as the binary form).
@Suite("Boundary values in the JSON forms of internal records")
struct InternalJSONBoundaryTests {
    /// The spans of every integer value (`"key":123`) in a JSON text.
    static func integerSpans(_ bytes: [UInt8]) -> [Range<Int>] {
        var spans: [Range<Int>] = []
        var i = 1
        while i < bytes.count - 1 {
            if bytes[i] == UInt8(ascii: ":") && bytes[i - 1] == UInt8(ascii: "\"") {
                var end = i + 1
                while end < bytes.count, bytes[end] == UInt8(ascii: "-") || (48...57).contains(bytes[end]) { end += 1 }
                if end > i + 1 { spans.append((i + 1)..<end) }
                i = end
            } else {
                i += 1
            }
        }
        return spans
    }

    @Test("every integer of an ingested, resolved, deliverable and outbound JSON record set to each boundary value")
    func everyIntegerOfEveryRecord() async throws {
        let chain = try Chain()
        let event = try ChatEvent.decode(try exampleBytes("event-group.json"))
        let user = try exampleState().user("u2")
        let device = Device(token: token("h"), bundleID: "com.example.chat")
        let request = PushRequest(
            token: token("h"), environment: .production, pushType: .alert, topic: "com.example.chat",
            priority: 10, collapseID: nil, expiration: 1_732_086_400,
            apnsID: APNsID.derive(eventID: "j", token: token("h")), payload: Array(#"{"aps":{}}"#.utf8))
        let records: [(String, Int, [UInt8])] = [
            ("herald.ingested", 1, IngestedRecord(event: event, ingestedAt: 1_732_000_000_000).jsonBytes()),
            ("herald.resolved", 2, ResolvedRecord(event: event, recipient: "u2", state: user).jsonBytes()),
            (
                "herald.deliverable", 3,
                DeliverableRecord(event: event, recipient: "u2", state: UserState(devices: [device]), targets: [device])
                    .jsonBytes()
            ),
            (
                "herald.retry", 4,
                OutboundRecord(
                    eventID: "j", appID: "app1", recipient: "u2", request: request, attempt: 2,
                    notBefore: 1_731_999_000_000, eventCreatedAt: 1_732_000_000_000
                ).jsonBytes()
            ),
        ]
        var runs = 0
        for (topic, stage, json) in records {
            let spans = Self.integerSpans(json)
            #expect(!spans.isEmpty, "\(topic) has integers")
            for span in spans {
                let isNotBefore = json[..<span.lowerBound].suffix(13).elementsEqual("\"not_before\":".utf8)
                for fragment in BoundaryValues.fragments {
                    // A not_before after now is held until then (and handed back on shutdown): left out here.
                    if isNotBefore, let value = Int64(String(decoding: fragment, as: UTF8.self)),
                        value > fixedContext.nowMillis
                    {
                        continue
                    }
                    let bytes = Array(json[..<span.lowerBound]) + fragment + Array(json[span.upperBound...])
                    await chain.run([StageInput(topic: topic, value: bytes)], from: stage, label: "\(topic) \(span)")
                    runs += 1
                }
            }
        }
        #expect(runs > 500)
    }
}
