import Foundation
import HeraldCore
import Testing

/// The registry API's PATCH body (`PreferencePatch.parse`) and the field-by-field rule (`apply(to:)`).
@Suite("Preference patches")
struct PreferencePatchTests {
    static let stored = Preferences(
        trigger: .mentionOnly,
        conversations: [
            "c1": ConversationPreference(trigger: .off, muted: true),
            "c2": ConversationPreference(muted: true),
        ],
        dnd: DoNotDisturb(start: ClockTime(hour: 22), end: ClockTime(hour: 8), timezone: "Asia/Seoul"),
        snooze: Snooze(start: 1, end: 2), template: .alternative, displayStyle: .simpleBanner,
        displayName: "Cindy", languages: ["fr", "de"], badge: false)

    struct Good: CustomTestStringConvertible, Sendable {
        var name: String
        var body: String
        var expected: @Sendable (inout Preferences) -> Void
        var testDescription: String { name }
    }

    static let good: [Good] = [
        Good(name: "one field set, the others kept", body: #"{"trigger": "all"}"#) { $0.trigger = .all },
        Good(
            name: "null clears a field to its default",
            body: #"{"dnd": null, "snooze": null, "trigger": null, "badge": null}"#
        ) {
            $0.dnd = nil; $0.snooze = nil; $0.trigger = .all; $0.badge = true
        },
        Good(
            name: "a conversation's muted alone keeps its trigger",
            body: #"{"conversations": {"c1": {"muted": false}}}"#
        ) {
            $0.conversations["c1"] = ConversationPreference(trigger: .off, muted: false)
        },
        Good(
            name: "a new conversation gets the defaults for what is not given",
            body: #"{"conversations": {"c9": {"trigger": "mention_only"}}}"#
        ) {
            $0.conversations["c9"] = ConversationPreference(trigger: .mentionOnly, muted: false)
        },
        Good(name: "a conversation set to null loses its settings", body: #"{"conversations": {"c2": null}}"#) {
            $0.conversations["c2"] = nil
        },
        Good(name: "dnd without a time zone is UTC", body: #"{"dnd": {"start": "00:00", "end": "24:00"}}"#) {
            $0.dnd = DoNotDisturb(start: ClockTime(hour: 0), end: ClockTime(hour: 24), timezone: "UTC")
        },
        Good(name: "Easemob's simple display style is simple_banner", body: #"{"display_style": "simple"}"#) {
            $0.displayStyle = .simpleBanner
        },
        Good(name: "an empty display name or language list clears it", body: #"{"display_name": "", "languages": []}"#)
        {
            $0.displayName = nil; $0.languages = []
        },
        Good(
            name: "snooze, template, languages and badge",
            body:
                #"{"snooze": {"start": 1732000000000, "end": 1732003600000}, "template": "default", "languages": ["ko"], "badge": true}"#
        ) {
            $0.snooze = Snooze(start: 1_732_000_000_000, end: 1_732_003_600_000); $0.template = .default;
            $0.languages = ["ko"]; $0.badge = true
        },
    ]

    @Test("a valid body changes exactly the fields it names", arguments: good)
    func applies(_ row: Good) throws {
        let patch = try PreferencePatch.parse(Array(row.body.utf8))
        var expected = Self.stored
        row.expected(&expected)
        #expect(patch.apply(to: Self.stored) == expected)
        // The record form (what travels on herald.registry and what the Lua script reads) is the same patch.
        #expect(try PreferencePatch.fromJSON(patch.jsonBytes()) == patch)
        let record = RegistryRecord(op: .patchPreferences, appID: "a", user: "u", patch: patch)
        #expect(try StageCodec.decode(RegistryRecord.self, from: StageCodec.encode(record)) == record)
    }

    @Test(
        "a bad body names the field",
        arguments: [
            (#"{"trigger": "never"}"#, "trigger"),
            (#"{"trigger": 1}"#, "trigger"),
            (#"{"template": "fancy"}"#, "template"),
            (#"{"display_style": "loud"}"#, "display_style"),
            (#"{"badge": "off"}"#, "badge"),
            (#"{"dnd": {"start": "22:00"}}"#, "dnd.end"),
            (#"{"dnd": {"start": "7am", "end": "08:00"}}"#, "dnd.start"),
            (#"{"dnd": {"start": "22:00", "end": "08:00", "zone": "UTC"}}"#, "dnd.zone"),
            (#"{"snooze": {"start": 5, "end": 1}}"#, "snooze.end"),
            (#"{"snooze": {"start": -1, "end": 1}}"#, "snooze.start"),
            (#"{"languages": ["fr", 7]}"#, "languages[1]"),
            (#"{"languages": ["fr fr"]}"#, "languages[0]"),
            (#"{"conversations": {"c1": {"mute": true}}}"#, "conversations.c1.mute"),
            (#"{"conversations": {"c1": {}}}"#, "conversations.c1"),
            (#"{"conversations": null}"#, "conversations"),
            (#"{"trigger": "all", "trigger": "off"}"#, "trigger"),
            (#"{"unknown": 1}"#, "unknown"),
            (#"[]"#, "(body)"),
            (#"{}"#, "(body)"),
        ])
    func rejects(_ body: String, _ field: String) {
        do {
            _ = try PreferencePatch.parse(Array(body.utf8))
            Issue.record("accepted \(body)")
        } catch {
            #expect(error.field == field, "\(body): \(error)")
        }
    }
}
