// Rows from the Easemob / Agora "Parse APNs content" and "iOS push" seeds.
// Every expected payload is the seed's, plus `thread-id` (docs/behaviour.md §7 adds
// it: the conversation id) — the one field we add to the Easemob shape.

import Foundation
import HeraldCore
import Testing

/// An app configured the way an Easemob customer's app looks: compact payload,
/// "ApnsName:xxxx" details, "you got a new message" without details.
/// Herald's interruption levels are off: the rows are Easemob's payloads exactly.
let easemobApp: AppConfig = {
    var app = AppConfig(
        appID: "easemob", payloadProfile: .compact,
        templates: TemplateConfig(defaultPair: TemplatePair(text: "{sender_name}:{message}", file: "{filename}")),
        catalogs: ["en": ["simple_banner": "you got a new message"]],
        credentials: [APNsCredential(bundleID: "com.example.chat", teamID: "T", keyID: "K", keyFile: "k.p8")])
    app.interruption = InterruptionPolicy(levels: nil, relevance: nil)
    return app
}()

struct EasemobRow: Sendable, CustomTestStringConvertible {
    var name: String
    var conversationType: String
    var conversationID: String
    var displayStyle: DisplayStyle
    var ext: String
    var text: String = "xxxx"
    var expected: String
    var testDescription: String { name }
}

let easemobRows: [EasemobRow] = [
    EasemobRow(
        name: "single chat, do not display the details", conversationType: "direct", conversationID: "6006",
        displayStyle: .simpleBanner, ext: "{}",
        expected:
            #"{"aps":{"alert":{"body":"you got a new message"},"badge":1,"sound":"default","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "single chat, display the details", conversationType: "direct", conversationID: "6006",
        displayStyle: .summary, ext: "{}",
        expected:
            #"{"aps":{"alert":{"body":"ApnsNickName:xxxx"},"badge":1,"sound":"default","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "group chat, do not display the details", conversationType: "group", conversationID: "1421300621769",
        displayStyle: .simpleBanner, ext: "{}",
        expected:
            #"{"aps":{"alert":{"body":"you got a new message"},"badge":1,"sound":"default","thread-id":"1421300621769"},"f":"6001","t":"6006","g":"1421300621769","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "group chat, display the details", conversationType: "group", conversationID: "1421300621769",
        displayStyle: .summary, ext: "{}",
        expected:
            #"{"aps":{"alert":{"body":"ApnsNickName:xxxx"},"badge":1,"sound":"default","thread-id":"1421300621769"},"f":"6001","t":"6006","g":"1421300621769","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "extern is copied to e", conversationType: "direct", conversationID: "6006",
        displayStyle: .summary, ext: #"{"em_apns_ext":{"extern":"Custom push extension"}}"#, text: "hello from rest",
        expected:
            #"{"aps":{"alert":{"body":"ApnsNickName:hello from rest"},"badge":1,"sound":"default","thread-id":"6006"},"e":"Custom push extension","f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "em_push_content replaces the body", conversationType: "direct", conversationID: "6006",
        displayStyle: .summary, ext: #"{"em_apns_ext":{"em_push_content":"Custom push display"}}"#,
        text: "hello from rest",
        expected:
            #"{"aps":{"alert":{"body":"Custom push display"},"badge":1,"sound":"default","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "custom display and custom extension together", conversationType: "direct", conversationID: "6006",
        displayStyle: .summary,
        ext: #"{"em_apns_ext":{"em_push_content":"Custom push display","extern":"custom push extension"}}"#,
        expected:
            #"{"aps":{"alert":{"body":"Custom push display"},"badge":1,"sound":"default","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408","e":"custom push extension"}"#
    ),
    EasemobRow(
        name: "custom display wins over the simple banner", conversationType: "direct", conversationID: "6006",
        displayStyle: .simpleBanner, ext: #"{"em_apns_ext":{"em_push_content":"Custom push display"}}"#,
        expected:
            #"{"aps":{"alert":{"body":"Custom push display"},"badge":1,"sound":"default","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "em_push_category sets aps.category", conversationType: "direct", conversationID: "6006",
        displayStyle: .simpleBanner, ext: #"{"em_apns_ext":{"em_push_category":"NEW_MESSAGE_CATEGORY"}}"#,
        expected:
            #"{"aps":{"alert":{"body":"you got a new message"},"badge":1,"sound":"default","category":"NEW_MESSAGE_CATEGORY","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "em_push_sound sets aps.sound", conversationType: "direct", conversationID: "6006",
        displayStyle: .simpleBanner, ext: #"{"em_apns_ext":{"em_push_sound":"custom.caf"}}"#,
        expected:
            #"{"aps":{"alert":{"body":"you got a new message"},"badge":1,"sound":"custom.caf","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "em_push_mutable_content sets mutable-content 1", conversationType: "direct", conversationID: "6006",
        displayStyle: .simpleBanner, ext: #"{"em_apns_ext":{"em_push_mutable_content":true}}"#,
        expected:
            #"{"aps":{"alert":{"body":"you got a new message"},"badge":1,"sound":"default","mutable-content":1,"thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "em_push_mutable_content false is omitted", conversationType: "direct", conversationID: "6006",
        displayStyle: .simpleBanner, ext: #"{"em_apns_ext":{"em_push_mutable_content":false}}"#,
        expected:
            #"{"aps":{"alert":{"body":"you got a new message"},"badge":1,"sound":"default","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "loc-key example: title and body loc keys and args", conversationType: "direct", conversationID: "6006",
        displayStyle: .summary,
        ext:
            #"{"em_apns_ext":{"em_push_content":"Custom push display","em_push_title_loc_key":"GAME_PLAY_REQUEST_FORMAT","em_push_title_loc_args":["Shelly","Rick"],"em_push_body_loc_key":"GAME_PLAY_REQUEST_FORMAT","em_push_body_loc_args":["Shelly","Rick"]}}"#,
        expected:
            #"{"aps":{"alert":{"body":"Custom push display","title-loc-key":"GAME_PLAY_REQUEST_FORMAT","title-loc-args":["Shelly","Rick"],"loc-key":"GAME_PLAY_REQUEST_FORMAT","loc-args":["Shelly","Rick"]},"badge":1,"sound":"default","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
    EasemobRow(
        name: "title loc key alone", conversationType: "direct", conversationID: "6006",
        displayStyle: .simpleBanner, ext: #"{"em_apns_ext":{"em_push_title_loc_key":"GAME_PLAY_REQUEST"}}"#,
        expected:
            #"{"aps":{"alert":{"body":"you got a new message","title-loc-key":"GAME_PLAY_REQUEST"},"badge":1,"sound":"default","thread-id":"6006"},"f":"6001","t":"6006","m":"373360335316321408"}"#
    ),
]

@Suite("Easemob seed payloads")
struct EasemobSeedTests {
    @Test(arguments: easemobRows)
    func payloadMatchesSeed(_ row: EasemobRow) throws {
        let e = try event(
            messageJSON(
                sender: "6001", senderName: "6001", conversation: row.conversationID,
                type: row.conversationType, text: row.text, ext: row.ext))
        var prefs = Preferences()
        prefs.displayStyle = row.displayStyle
        let state = user(prefs: prefs, unread: 1)
        let (decision, requests) = try run(
            e, to: "6006", state: state, app: easemobApp, senderDisplayName: "ApnsNickName")
        #expect(decision == .deliver(targets: state.devices))
        let r = try #require(requests.first)
        #expect(canonical(try payload(r)) == canonical(json(row.expected)))
        #expect(r.pushType == .alert && r.topic == "com.example.chat" && r.priority == 10)
    }

    @Test("silent message (em_ignore_notification) is never pushed, even when forced")
    func silentMessage() throws {
        for force in [false, true] {
            let e = try event(messageJSON(ext: #"{"em_ignore_notification":true,"em_force_notification":\#(force)}"#))
            let (decision, _) = try run(e, to: "6006", state: user(), app: easemobApp)
            #expect(decision == .suppress(.ignored))
        }
    }

    @Test("forced message goes through do not disturb; the same message without force does not")
    func forcedAgainstDND() throws {
        var prefs = Preferences()
        prefs.dnd = DoNotDisturb(start: ClockTime(hour: 0), end: ClockTime(hour: 24), timezone: "Asia/Shanghai")
        let state = user(prefs: prefs)
        let plain = try event(messageJSON(ext: "{}"))
        #expect(try run(plain, to: "6006", state: state, app: easemobApp).0 == .suppress(.dnd))
        let forced = try event(messageJSON(ext: #"{"em_force_notification":true}"#))
        #expect(try run(forced, to: "6006", state: state, app: easemobApp).0 == .deliver(targets: state.devices))
    }

    @Test("Easemob DND examples: 0-24 all day, 7-17, 22-8 across midnight")
    func dndHours() throws {
        // (start, end, local hour:minute in Asia/Shanghai, suppressed?)
        let rows: [(Int, Int, Int, Int, Bool)] = [
            (0, 24, 0, 0, true), (0, 24, 12, 0, true), (0, 24, 23, 59, true),
            (7, 17, 6, 59, false), (7, 17, 7, 0, true), (7, 17, 16, 59, true), (7, 17, 17, 0, false),
            (22, 8, 21, 59, false), (22, 8, 22, 0, true), (22, 8, 23, 30, true), (22, 8, 0, 0, true),
            (22, 8, 7, 59, true), (22, 8, 8, 0, false), (9, 9, 9, 0, false),
        ]
        for (start, end, h, m, suppressed) in rows {
            var prefs = Preferences()
            prefs.dnd = DoNotDisturb(
                start: ClockTime(hour: start), end: ClockTime(hour: end), timezone: "Asia/Shanghai")
            // 2024-11-19 00:00 in Shanghai (UTC+8) is 2024-11-18T16:00:00Z.
            let at: Int64 = 1_731_945_600_000 + Int64(h * 3600 + m * 60) * 1000
            let e = try event(messageJSON())
            let d = Suppression.decide(event: e, recipient: "6006", state: user(prefs: prefs), app: easemobApp, at: at)
            #expect((d == .suppress(.dnd)) == suppressed, "DND \(start)-\(end) at \(h):\(m)")
        }
    }
}
