// suppress with a translator (docs/behaviour.md §7a): the deliveries whose recipient's first preferred language the
// event carries no translation into get one, one request per message and language in a batch, carried in the
// deliverable record so render shows it; a failure sends the original text and the explain entry says why.
// `CachedTranslator`: the cache first, one call per text not found, the answers kept.

import Foundation
import HeraldCore
import HeraldPipeline
import Synchronization
import Testing

/// A translator that answers from a table (or with a fixed outcome) and keeps what it was asked.
final class ScriptedTranslator: Translator {
    private let asked = Mutex<[[TranslationRequest]]>([])
    let answer: @Sendable (TranslationRequest) -> TranslationOutcome

    init(
        answer: @escaping @Sendable (TranslationRequest) -> TranslationOutcome = {
            .translated("[\($0.target)] \($0.text)")
        }
    ) {
        self.answer = answer
    }

    var batches: [[TranslationRequest]] { asked.withLock { $0 } }

    func translate(_ requests: [TranslationRequest]) async -> [TranslationOutcome] {
        asked.withLock { $0.append(requests) }
        return requests.map(answer)
    }
}

@Suite("Translations in suppress")
struct TranslationStageTests {
    static let policy = TranslatorPolicy(url: "https://translate.test", deadlineMilliseconds: 500)

    static func apps(translator: TranslatorPolicy? = policy) -> AppDirectory {
        var app = AppConfig(appID: "app1", credentials: [APNsCredential(bundleID: "com.example.chat")])
        app.translator = translator
        return AppDirectory(apps: ["app1": app], listedOnly: true)
    }

    static func input(
        event id: String = "t1", message: String = "m1", text: String = "Good night", language: String? = "en",
        translations: String? = nil, recipient: String, languages: [String], kind: String = "message"
    ) throws -> StageInput {
        var m = #"{"id":"\#(message)","type":"text","text":"\#(text)""#
        if let language { m += #","language":"\#(language)""# }
        if let translations { m += #","translations":\#(translations)"# }
        m += "}"
        let json = """
            {"event_id":"\(id)","app_id":"app1","kind":"\(kind)","created_at":1732000000000,
             "sender":{"id":"u1","name":"Cindy"},"conversation":{"id":"c1","type":"group","name":"Hiking"},
             "message":\(m)}
            """
        let event = try ChatEvent.decode(Array(json.utf8))
        var prefs = Preferences()
        prefs.languages = languages
        let record = ResolvedRecord(
            event: event, recipient: recipient,
            state: UserState(
                devices: [Device(token: String(repeating: "a", count: 64), bundleID: "com.example.chat")],
                preferences: prefs))
        return StageInput(topic: "herald.resolved", value: StageCodec.encode(record))
    }

    /// The body render shows for a deliverable record.
    static func body(_ output: StageOutput) async throws -> String? {
        let render = RenderProcessor(outboundTopic: "o", apps: apps())
        let results = await render.process([StageInput(topic: "d", value: output.value)], context: fixedContext)
        let outbound = try StageCodec.decode(
            OutboundRecord.self, from: try #require(results.first?.outputs.first).value)
        let payload = try JSONValue.parse(outbound.request.payload)
        return payload["aps"]?["alert"]?["body"]?.stringValue
    }

    @Test("a French reader of an English message gets the translator's French in the record render reads")
    func translated() async throws {
        let translator = ScriptedTranslator { _ in .translated("Bonne nuit") }
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.apps())
        suppress.translator = translator
        let results = await suppress.process(
            [try Self.input(recipient: "u2", languages: ["fr", "de"])], context: fixedContext)
        let output = try #require(results[0].outputs.first)
        let record = try StageCodec.decode(DeliverableRecord.self, from: output.value)
        #expect(record.event.message?.translation("fr") == "Bonne nuit")
        #expect(record.event.message?.text == "Good night")
        #expect(try await Self.body(output) == "Cindy: Bonne nuit")
        let asked = try #require(translator.batches.first?.first)
        #expect(asked.text == "Good night" && asked.source == "en" && asked.target == "fr" && asked.messageID == "m1")
        #expect(asked.policy == Self.policy)
        #expect(results[0].notes == [.translation(outcome: "translated")])
        #expect(results[0].explain.map(\.decision) == ["deliver"] && results[0].explain[0].reason == nil)
    }

    @Test(
        "one request per message and language in a batch, however many recipients; the answer goes to each under its own tag"
    )
    func oneRequestPerLanguage() async throws {
        let translator = ScriptedTranslator()
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.apps())
        suppress.translator = translator
        let inputs = [
            try Self.input(recipient: "u2", languages: ["fr"]),
            try Self.input(recipient: "u3", languages: ["fr-CA", "de"]),
            try Self.input(recipient: "u4", languages: ["de"]),
            try Self.input(recipient: "u5", languages: ["fr"]),
            try Self.input(event: "t2", message: "m2", text: "Bye!", recipient: "u2", languages: ["fr"]),
            // Another event of the same message and text (a replay under a new id): the same request.
            try Self.input(event: "t3", message: "m1", recipient: "u6", languages: ["fr"]),
        ]
        let results = await suppress.process(inputs, context: fixedContext)
        #expect(translator.batches.count == 1)
        let asked = translator.batches[0].map { "\($0.messageID)/\($0.target)" }
        #expect(asked == ["m1/fr", "m1/de", "m2/fr"])
        let events = try results.map { try StageCodec.decode(DeliverableRecord.self, from: $0.outputs[0].value).event }
        #expect(events[0].message?.translation("fr") == "[fr] Good night")
        // u3 reads fr-CA first: the same French request, the answer under u3's own tag (render looks for it).
        #expect(events[1].message?.translation("fr-CA") == "[fr] Good night")
        #expect(events[1].message?.translations.map(\.0) == ["fr-CA"])
        #expect(events[2].message?.translation("de") == "[de] Good night")
        #expect(events[4].message?.translation("fr") == "[fr] Bye!")
        #expect(events[5].eventID == "t3" && events[5].message?.translation("fr") == "[fr] Good night")
        #expect(events.map(\.eventID) == ["t1", "t1", "t1", "t1", "t2", "t3"])
        // One note per request, on the first delivery that asked for it.
        #expect(results.map(\.notes.count) == [1, 0, 1, 0, 1, 0])
    }

    @Test("a regional first language is asked by its primary subtag and carried under the reader's tag")
    func regionalTag() async throws {
        let translator = ScriptedTranslator { _ in .translated("Bonne nuit") }
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.apps())
        suppress.translator = translator
        let results = await suppress.process(
            [try Self.input(recipient: "u3", languages: ["fr-CA"])], context: fixedContext)
        #expect(translator.batches.first?.map(\.target) == ["fr"])
        let output = try #require(results[0].outputs.first)
        #expect(
            try StageCodec.decode(DeliverableRecord.self, from: output.value).event.message?.translation("fr-CA")
                == "Bonne nuit")
        #expect(try await Self.body(output) == "Cindy: Bonne nuit")
    }

    @Test(
        "nothing is asked: a message in a preferred language, one with the translation, an app without a translator, a reader without languages"
    )
    func nothingAsked() async throws {
        let translator = ScriptedTranslator()
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.apps())
        suppress.translator = translator
        let inputs = [
            try Self.input(language: "de", recipient: "u2", languages: ["fr", "de"]),
            try Self.input(translations: #"{"fr":"Bonne nuit !"}"#, recipient: "u3", languages: ["fr"]),
            try Self.input(recipient: "u4", languages: []),
        ]
        let results = await suppress.process(inputs, context: fixedContext)
        #expect(translator.batches.isEmpty)
        #expect(results.allSatisfy { $0.outputs.count == 1 && $0.notes.isEmpty })
        var plain = SuppressProcessor(deliverableTopic: "d", apps: Self.apps(translator: nil))
        plain.translator = translator
        let untouched = await plain.process(
            [try Self.input(recipient: "u2", languages: ["fr"])], context: fixedContext)
        #expect(translator.batches.isEmpty)
        let input = try Self.input(recipient: "u2", languages: ["fr"])
        // Without a translator the record is the input's own bytes, as before.
        let expected = await SuppressProcessor(deliverableTopic: "d", apps: Self.apps()).process(
            [input], context: fixedContext)
        #expect(untouched[0].outputs == expected[0].outputs)
    }

    @Test("a failed translation sends the original text; the explain entry says why and the compact trail keeps it")
    func failed() async throws {
        for (failure, outcome, reason) in [
            (TranslationFailure.timeout, "timeout", "translation_failed:timeout"),
            (.status(403), "failed", "translation_failed:http_403"),
            (.badAnswer, "failed", "translation_failed:bad_answer"),
            (.unreachable, "failed", "translation_failed:unreachable"),
        ] {
            var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.apps())
            suppress.translator = ScriptedTranslator { _ in .failed(failure) }
            let results = await suppress.process(
                [try Self.input(recipient: "u2", languages: ["fr"])], context: fixedContext)
            let output = try #require(results[0].outputs.first)
            #expect(
                try StageCodec.decode(DeliverableRecord.self, from: output.value).event.message?.translations.isEmpty
                    == true)
            #expect(try await Self.body(output) == "Cindy: Good night")
            #expect(results[0].notes == [.translation(outcome: outcome)])
            let entry = try #require(results[0].explain.first)
            #expect(entry.decision == "deliver" && entry.reason == reason && !entry.isRoutine)
        }
    }

    @Test("a record decoded whole (JSON) is translated too")
    func jsonRecord() async throws {
        let binary = try Self.input(recipient: "u2", languages: ["fr"])
        let record = try StageCodec.decode(ResolvedRecord.self, from: try #require(binary.value))
        let json = StageInput(topic: "herald.resolved", value: record.jsonBytes())
        var suppress = SuppressProcessor(deliverableTopic: "d", apps: Self.apps())
        suppress.translator = ScriptedTranslator { _ in .cached("Bonne nuit") }
        let results = await suppress.process([json], context: fixedContext)
        let output = try #require(results[0].outputs.first)
        #expect(try await Self.body(output) == "Cindy: Bonne nuit")
        #expect(results[0].notes == [.translation(outcome: "hit")])
    }

    @Test("a message held by its burst keeps the translation for the flush")
    func heldInBurst() async throws {
        var app = AppConfig(appID: "app1", credentials: [APNsCredential(bundleID: "com.example.chat")])
        app.translator = Self.policy
        app.coalesce = CoalescePolicy(windowMilliseconds: 10_000, updateMilliseconds: 4_000)
        var suppress = SuppressProcessor(
            deliverableTopic: "d", apps: AppDirectory(apps: ["app1": app], listedOnly: true))
        let ledger = SpyBurstLedger()
        suppress.bursts = ledger
        suppress.translator = ScriptedTranslator { _ in .translated("Bonne nuit") }
        let inputs = [
            try Self.input(event: "b1", message: "m1", recipient: "u2", languages: ["fr"]),
            try Self.input(event: "b2", message: "m2", recipient: "u2", languages: ["fr"]),
        ]
        let results = await suppress.process(inputs, context: fixedContext)
        #expect(results[1].notes.contains(.coalesced(outcome: "held")))
        let held = try #require(ledger.messages.last)
        #expect(
            try StageCodec.decode(DeliverableRecord.self, from: held.record).event.message?.translation("fr")
                == "Bonne nuit")
    }
}

/// A cache in memory that can be told to fail.
final class MemoryTranslationCache: TranslationCache {
    private let kept = Mutex<[String: String]>([:])
    let failing: Bool
    init(failing: Bool = false) { self.failing = failing }

    static func key(_ r: TranslationRequest) -> String { "\(r.appID)/\(r.messageID)/\(r.target)/\(r.text)" }

    var count: Int { kept.withLock { $0.count } }

    func lookup(_ requests: [TranslationRequest]) async throws -> [String?] {
        if failing { throw TransientFailure("down") }
        return kept.withLock { kept in requests.map { kept[Self.key($0)] } }
    }

    func store(_ entries: [(request: TranslationRequest, text: String)]) async throws {
        if failing { throw TransientFailure("down") }
        kept.withLock { kept in for e in entries { kept[Self.key(e.request)] = e.text } }
    }
}

/// A service answering `[<target>] <text>`, or a fixed failure; counts its calls.
final class CountingService: TranslationService {
    private let calls = Mutex(0)
    let failure: TranslationFailure?
    init(failure: TranslationFailure? = nil) { self.failure = failure }
    var count: Int { calls.withLock { $0 } }

    func translate(_ request: TranslationRequest) async -> Result<String, TranslationFailure> {
        calls.withLock { $0 += 1 }
        if let failure { return .failure(failure) }
        return .success(request.text == "empty" ? "" : "[\(request.target)] \(request.text)")
    }
}

@Suite("CachedTranslator")
struct CachedTranslatorTests {
    static func request(
        _ text: String, policy: TranslatorPolicy = TranslatorPolicy(url: "https://t")
    ) -> TranslationRequest {
        TranslationRequest(
            appID: "app1", messageID: "m-" + text, text: text, source: "en", target: "fr", policy: policy)
    }

    @Test("the second batch is answered from the cache; the service is asked once per text")
    func hitAfterMiss() async {
        let cache = MemoryTranslationCache()
        let service = CountingService()
        let translator = CachedTranslator(cache: cache, service: service)
        let first = await translator.translate([Self.request("Hi"), Self.request("Bye")])
        #expect(first == [.translated("[fr] Hi"), .translated("[fr] Bye")])
        #expect(first.map(\.metricOutcome) == ["translated", "translated"])
        let second = await translator.translate([Self.request("Hi"), Self.request("Yes")])
        #expect(second == [.cached("[fr] Hi"), .translated("[fr] Yes")])
        #expect(second.map(\.metricOutcome) == ["hit", "translated"])
        #expect(service.count == 3 && cache.count == 3)
    }

    @Test("a policy that keeps nothing is neither looked up nor kept")
    func noCaching() async {
        let cache = MemoryTranslationCache()
        let service = CountingService()
        let translator = CachedTranslator(cache: cache, service: service)
        let policy = TranslatorPolicy(url: "https://t", cacheTTLMilliseconds: 0)
        _ = await translator.translate([Self.request("Hi", policy: policy)])
        _ = await translator.translate([Self.request("Hi", policy: policy)])
        #expect(service.count == 2 && cache.count == 0)
    }

    @Test("a failing cache is passed by and reported; failures and empty answers are outcomes, never kept")
    func failures() async {
        let reported = Mutex(0)
        let broken = CachedTranslator(cache: MemoryTranslationCache(failing: true), service: CountingService()) { _ in
            reported.withLock { $0 += 1 }
        }
        #expect(await broken.translate([Self.request("Hi")]) == [.translated("[fr] Hi")])
        #expect(reported.withLock { $0 } == 2)  // the lookup and the store
        let cache = MemoryTranslationCache()
        let timingOut = CachedTranslator(cache: cache, service: CountingService(failure: .timeout))
        let outcomes = await timingOut.translate([Self.request("Hi")])
        #expect(outcomes == [.failed(.timeout)] && outcomes[0].metricOutcome == "timeout" && cache.count == 0)
        let refused = CachedTranslator(cache: cache, service: CountingService(failure: .status(403)))
        #expect(await refused.translate([Self.request("Hi")]).map(\.metricOutcome) == ["failed"])
        let empty = await CachedTranslator(cache: cache, service: CountingService()).translate([Self.request("empty")])
        #expect(empty == [.failed(.badAnswer)] && cache.count == 0)
    }
}
