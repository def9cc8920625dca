// Which recipient needs a translation from the app's translator (docs/behaviour.md §7a, after Sendbird's "Push
// notification translation"), the codes it is sent, and the record suppress writes with the translation added.
import Foundation
import HeraldCore
import Testing

@Suite("Translation: who needs one, and the record that carries it")
struct TranslationTests {
    struct Row: CustomTestStringConvertible, Sendable {
        let name: String
        let event: String
        let languages: [String]
        let expected: String?
        var testDescription: String { name }
    }

    static let rows: [Row] = [
        Row(
            name: "sent in English to a French reader: French", event: messageJSON(language: "en"), languages: ["fr"],
            expected: "fr"),
        Row(
            name: "the first preferred language wins", event: messageJSON(language: "en"), languages: ["de", "fr"],
            expected: "de"),
        Row(
            name: "sent in one of the preferred languages (not the first): nothing", event: messageJSON(language: "de"),
            languages: ["fr", "de"], expected: nil),
        Row(
            name: "the event carries the translation: nothing",
            event: messageJSON(language: "en", translations: #"{"fr":"Au revoir !"}"#), languages: ["fr"],
            expected: nil),
        Row(
            name: "a translation into another language does not do",
            event:
                messageJSON(language: "en", translations: #"{"de":"Tschüss!"}"#), languages: ["fr"], expected: "fr"),
        Row(
            name: "no language on the event: asked (the translator detects it)", event: messageJSON(),
            languages: ["fr"], expected: "fr"),
        Row(name: "no preferred language: nothing", event: messageJSON(language: "en"), languages: [], expected: nil),
        Row(
            name: "a regional tag is asked under its own tag", event: messageJSON(language: "en"),
            languages: ["fr-CA"], expected: "fr-CA"),
        Row(
            name: "written in the reader's language under a regional tag: nothing",
            event: messageJSON(language: "fr-CA"),
            languages: ["fr"], expected: nil),
        Row(
            name: "a language with no translator code: nothing", event: messageJSON(language: "en"),
            languages: ["x-klingon"], expected: nil),
        Row(name: "no text: nothing", event: messageJSON(text: "", language: "en"), languages: ["fr"], expected: nil),
        Row(
            name: "a file message shows its file name: nothing",
            event: messageJSON(
                messageType: "file", text: "caption", file: #"{"name":"a.jpg","mime_type":"image/jpeg"}"#,
                language: "en"), languages: ["fr"], expected: nil),
        Row(
            name: "an admin message shows its text: asked", event: messageJSON(messageType: "admin", language: "en"),
            languages: ["fr"], expected: "fr"),
    ]

    @Test("the language asked for", arguments: rows)
    func missingLanguage(_ row: Row) throws {
        let e = try event(row.event)
        #expect(Translation.missingLanguage(e, languages: row.languages) == row.expected)
    }

    @Test("an edited message is asked for; a call, a reaction or a deleted message never")
    func kinds() throws {
        let edited = try event(
            messageJSON(language: "en").replacingOccurrences(
                of: #""kind":"message""#, with: #""kind":"message_edited""#))
        #expect(Translation.missingLanguage(edited, languages: ["fr"]) == "fr")
        let deleted = try event(
            messageJSON(language: "en").replacingOccurrences(
                of: #""kind":"message""#, with: #""kind":"message_deleted""#))
        #expect(!Translation.mayTranslate(deleted))
        #expect(Translation.missingLanguage(deleted, languages: ["fr"]) == nil)
        let call = try event(
            #"{"event_id":"c1","app_id":"app1","kind":"call","sender":{"id":"u1"},"conversation":{"id":"d","type":"direct"},"call":{"action":"initiated","session_id":"s","type":"audio"}}"#
        )
        #expect(Translation.missingLanguage(call, languages: ["fr"]) == nil)
    }

    @Test("translator codes: the primary subtag, lowercased; auto for a message without a language")
    func codes() throws {
        #expect(Translation.code("fr") == "fr")
        #expect(Translation.code("fr-CA") == "fr")
        #expect(Translation.code("zh-Hans") == "zh")
        #expect(Translation.code("kr") == "ko")
        #expect(Translation.code("") == nil)
        #expect(Translation.code("x-klingon") == nil)
        #expect(Translation.code("français") == nil)
        #expect(Translation.sourceCode(try #require(try event(messageJSON(language: "en-GB")).message)) == "en")
        #expect(Translation.sourceCode(try #require(try event(messageJSON()).message)) == "auto")
    }

    @Test("the explain reason names the failure; a delivery with one is kept in the compact trail")
    func failureReasons() {
        #expect(Translation.failedReason(.timeout) == "translation_failed:timeout")
        #expect(Translation.failedReason(.status(403)) == "translation_failed:http_403")
        #expect(Translation.failedReason(.badAnswer) == "translation_failed:bad_answer")
        #expect(Translation.failedReason(.unreachable) == "translation_failed:unreachable")
        let failed = ExplainEntry(
            appID: "a", eventID: "e", user: "u", stage: "suppress", decision: "deliver",
            reason: Translation.failedReason(.timeout), at: 1)
        #expect(!failed.isRoutine)
        let plain = ExplainEntry(appID: "a", eventID: "e", user: "u", stage: "suppress", decision: "deliver", at: 1)
        #expect(plain.isRoutine)
    }

    @Test("the endpoint is <url>/translate; a policy without TTL or entries keeps nothing")
    func policy() {
        #expect(TranslatorPolicy(url: "https://t.example/").endpoint == "https://t.example/translate")
        #expect(TranslatorPolicy(url: "https://t.example/lt").endpoint == "https://t.example/lt/translate")
        #expect(TranslatorPolicy(url: "https://t").caches)
        #expect(!TranslatorPolicy(url: "https://t", cacheTTLMilliseconds: 0).caches)
        #expect(!TranslatorPolicy(url: "https://t", cacheMaxEntries: 0).caches)
    }

    @Test("an added translation replaces one of the same tag and keeps the list sorted; render shows it")
    func addedTranslationRenders() throws {
        let e = try event(messageJSON(language: "en", translations: #"{"de":"Tschüss!","it":"Ciao!"}"#))
        let translated = e.adding(translation: "Au revoir !", language: "fr")
        #expect(translated.message?.translations.map(\.0) == ["de", "fr", "it"])
        #expect(translated.adding(translation: "Salut", language: "fr").message?.translation("fr") == "Salut")
        var prefs = Preferences()
        prefs.languages = ["fr"]
        let app = AppConfig(credentials: [APNsCredential(bundleID: "com.example.chat")])
        let before = try payload(try #require(try run(e, to: "u2", state: user(prefs: prefs), app: app).1.first))
        #expect(before["aps"]?["alert"]?["body"] == .string("Cindy: Bye!"))
        let after = try payload(
            try #require(try run(translated, to: "u2", state: user(prefs: prefs), app: app).1.first))
        #expect(after["aps"]?["alert"]?["body"] == .string("Cindy: Au revoir !"))
    }

    @Test(
        "suppress's read of what the rules step over gives the whole event and the languages; the record it writes with a new event is the whole record's"
    )
    func forwardedView() throws {
        var prefs = Preferences(
            trigger: .all, conversations: ["c1": ConversationPreference(trigger: .all, muted: false)])
        prefs.dnd = DoNotDisturb(
            start: ClockTime(hour: 22, minute: 0), end: ClockTime(hour: 8, minute: 0), timezone: "Asia/Seoul")
        prefs.displayName = "Pierre"
        prefs.languages = ["fr-CA", "de"]
        let e = try event(messageJSON(language: "en", translations: #"{"es":"¡Adiós!"}"#))
        let state = UserState(
            devices: [device()], online: [], preferences: prefs,
            unread: Unread(total: 3, conversations: ["c1": 2]))
        let record = ResolvedRecord(event: e, recipient: "u2", state: state, senderDisplayName: "Cindy L.")
        let bytes = StageCodec.encode(record)
        var reuse = EventReuse()
        let read = try ResolvedRecord.readForRules(bytes, reusing: &reuse)
        let forwarded = try #require(read.forwarded)
        var whole = EventReuse()
        #expect(try forwarded.wholeEvent(reusing: &whole) == e)
        #expect(try forwarded.preferredLanguages() == ["fr-CA", "de"])

        let translated = e.adding(translation: "Au revoir !", language: "fr-CA")
        let written = DeliverableRecord.wireBytes(
            forwarding: forwarded, event: translated.wireBytes, targets: [device()], burst: nil)
        var emptied = state
        emptied.devices = []
        emptied.online = []
        let expected = DeliverableRecord(
            event: translated, recipient: "u2", state: emptied, targets: [device()], senderDisplayName: "Cindy L.")
        #expect(written == expected.wireBytes())
        let decoded = try StageCodec.decode(DeliverableRecord.self, from: written)
        #expect(decoded.event.message?.translation("fr-CA") == "Au revoir !")
    }
}
