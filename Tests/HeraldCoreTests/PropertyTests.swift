// Property-based tests (x-sheep/swift-property-based): for arbitrary bodies,
// languages and extensions the payload is valid JSON, valid UTF-8 and within
// the APNs limit; for arbitrary states the rules only give reasons whose
// condition holds, and respect rule order and force.

import Foundation
import HeraldCore
import PropertyBased
import Testing

/// Characters that stress escaping and UTF-8 boundaries: ASCII, quotes,
/// backslashes, controls, accents, combining marks, CJK, emoji, ZWJ families, flags.
let tricky: [Character] = [
    "a", "Z", " ", "\"", "\\", "/", "\n", "\t", "\u{01}", "\u{1F}", "é", "e\u{301}", "ß", "中", "文",
    "한", "😎", "🥾", "👨‍👩‍👧‍👦", "🇰🇷", "\u{2028}", "…", "{", "}", "%",
]
let trickyChar = Gen<Character?>.element(of: tricky).map { $0 ?? "a" }
let languagePool = ["en", "fr", "ko", "kr", "zh", "zh-Hans", "de", "es", "ja", "xx", "EN_us"]

struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

let propertyCredentials = [APNsCredential(bundleID: "com.example.chat", teamID: "T", keyID: "K", keyFile: "k.p8")]
let profiles: [PayloadProfile] = [.compact, .sendbird(key: "sendbird"), .cometchat]

/// The longest character-boundary prefix within `bytes` UTF-8 bytes (names and
/// categories are capped by event validation; bodies and extensions are not).
func prefix(_ s: String, bytes: Int) -> String {
    var out = ""
    for ch in s {
        if out.utf8.count + ch.utf8.count > bytes { break }
        out.append(ch)
    }
    return out
}

@Suite("Properties")
struct PropertyTests {
    @Test("any body, language and extension: payload is valid JSON and UTF-8 within 4096 (5120 VoIP)")
    func payloadAlwaysFits() async {
        await propertyCheck(
            count: 300, input: trickyChar.string(of: 0...5000), trickyChar.string(of: 0...1200),
            Gen.int(in: 0...Int(Int32.max))
        ) { body, extra, seed in
            var rng = SplitMix(state: UInt64(seed))
            let profile = profiles[Int.random(in: 0..<3, using: &rng)]
            let app = AppConfig(payloadProfile: profile, credentials: propertyCredentials)
            let isCall = Bool.random(using: &rng)
            let useContent = Bool.random(using: &rng)
            var translations: [(String, String)] = []
            for lang in languagePool.shuffled(using: &rng).prefix(Int.random(in: 0...4, using: &rng)) {
                translations.append((lang, extra))
            }
            let apns = ChatEvent.APNsExtension(
                pushContent: useContent ? body : nil,
                category: Bool.random(using: &rng) ? prefix(extra, bytes: 64) : nil,
                sound: Bool.random(using: &rng) ? "custom.caf" : nil,
                mutableContent: Bool.random(using: &rng),
                titleLocKey: Bool.random(using: &rng) ? "TITLE" : nil,
                titleLocArgs: Bool.random(using: &rng) ? [extra, "x"] : nil,
                bodyLocKey: Bool.random(using: &rng) ? "BODY" : nil,
                bodyLocArgs: Bool.random(using: &rng) ? [extra] : nil,
                extern: Bool.random(using: &rng)
                    ? .string(extra) : (Bool.random(using: &rng) ? .object([("k", .string(extra))]) : nil))
            let event = ChatEvent(
                eventID: "e", appID: "a", kind: isCall ? .call : .message, createdAt: t0,
                sender: .init(id: "u1", name: prefix(extra, bytes: 64)),
                conversation: .init(
                    id: "c1", type: Bool.random(using: &rng) ? .group : .direct, name: prefix(extra, bytes: 64)),
                message: .init(
                    id: "m1", text: body, data: Bool.random(using: &rng) ? extra : "",
                    language: Bool.random(using: &rng) ? "en" : nil, translations: translations),
                call: isCall ? .init(action: .initiated, sessionID: "s1", type: .video) : nil,
                ext: .init(apns: apns))
            var prefs = Preferences()
            prefs.languages = Array(languagePool.shuffled(using: &rng).prefix(Int.random(in: 0...4, using: &rng)))
            prefs.template = Bool.random(using: &rng) ? .alternative : .default
            prefs.displayStyle = Int.random(in: 0..<4, using: &rng) == 0 ? .simpleBanner : .summary
            let devices = isCall && Bool.random(using: &rng) ? [device(tokenV, kind: .voip)] : [device()]
            let state = UserState(
                devices: devices, preferences: prefs, unread: Unread(total: Int.random(in: 0...999, using: &rng)))
            do {
                let requests = try Renderer.render(
                    event: event, recipient: "u2", state: state, targets: devices, app: app,
                    now: now0)
                #expect(requests.count == 1)
                for r in requests {
                    #expect(r.payload.count <= r.pushType.payloadLimit)
                    #expect(String(validating: r.payload, as: UTF8.self) != nil)
                    let parsed = try? JSONValue.parse(r.payload)
                    #expect(parsed != nil)
                    #expect((try? JSONSerialization.jsonObject(with: Data(r.payload))) != nil)
                    // The body is the full body, or a character-boundary prefix of it ending in an ellipsis.
                    let full =
                        useContent && !body.isEmpty && event.kind == .message
                        ? body : Renderer.body(event: event, preferences: prefs, app: app, senderDisplayName: nil)
                    if case .string(let shown)? = parsed?["aps"]?["alert"]?["body"], shown != full {
                        #expect(shown.hasSuffix(Renderer.ellipsis) || shown.isEmpty)
                        #expect(full.hasPrefix(String(shown.dropLast())))
                    }
                }
            } catch {
                Issue.record("render failed: \(error)")
            }
        }
    }

    @Test("shortening cuts on a character boundary, saves at least the excess, ends with …")
    func shorten() async {
        await propertyCheck(count: 300, input: trickyChar.string(of: 1...600), Gen.int(in: 1...3000)) { text, excess in
            let short = Renderer.shorten(text, by: excess)
            let before = JSONWriter.escapedLength(text)
            let after = JSONWriter.escapedLength(short)
            #expect(before - after >= excess || short.isEmpty || short == Renderer.ellipsis)
            if !short.isEmpty {
                #expect(short.hasSuffix(Renderer.ellipsis))
                #expect(text.hasPrefix(String(short.dropLast())))
            }
        }
    }

    @Test("any bytes: the event decoder throws or decodes, never traps")
    func decoderNeverTraps() async {
        let jsonish = Gen<UInt8?>.element(
            of: Array(#"{}[]",:"0123456789.-eE truefalsnul\u"#.utf8) + [0xC3, 0xA9, 0xFF, 0x00, 0x80]
        )
        .map { $0 ?? 0x20 }
        await propertyCheck(count: 500, input: jsonish.array(of: 0...300)) { bytes in
            let admission = Ingest.admit(bytes)
            if case .admit(let e) = admission { #expect(!e.eventID.isEmpty) }
        }
        // Mutations of a valid event.
        await propertyCheck(
            count: 300, input: Gen.int(in: 0...(validEvent.utf8.count - 1)), Gen<UInt8>.value(in: 0...255)
        ) { at, byte in
            var bytes = Array(validEvent.utf8)
            bytes[at] = byte
            switch Ingest.admit(bytes) {
            case .admit(let e): #expect(e.jsonBytes.count > 0)
            case .drop(let reason, let detail): #expect(!detail.isEmpty || reason == .channelType)
            }
        }
    }

    @Test("rules: a reason is only given when its condition holds; force and ignore keep their scope")
    func ruleEvaluation() async {
        await propertyCheck(count: 500, input: Gen.int(in: 0...Int(Int32.max))) { seed in
            var rng = SplitMix(state: UInt64(seed))
            func pick<T>(_ xs: [T]) -> T { xs[Int.random(in: 0..<xs.count, using: &rng)] }
            let mentions = pick([[], ["u2"], ["u3"]])
            let ignore = Int.random(in: 0..<5, using: &rng) == 0
            let force = Bool.random(using: &rng)
            let recipient = pick(["u1", "u2", "u2", "u2"])
            let kind = pick([ChatEvent.Kind.message, .message, .call, .reaction, .groupAction])
            let event = ChatEvent(
                eventID: "e", appID: "a", kind: kind, createdAt: t0 + Int64.random(in: 0...86_400_000, using: &rng),
                sender: .init(id: "u1"), conversation: .init(id: "c1", type: .group),
                message: .init(
                    id: "m", text: "hi", mentions: mentions,
                    mentionType: Int.random(in: 0..<6, using: &rng) == 0 ? .channel : .users),
                call: .init(action: .initiated, sessionID: "s", type: .audio),
                reaction: .init(emoji: "😎"), groupAction: .init(action: .left, actorName: "A"),
                ext: .init(ignoreNotification: ignore, forceNotification: force))
            var devices: [Device] = []
            for n in 0..<Int.random(in: 0...3, using: &rng) {
                devices.append(device("tok\(n)", kind: Bool.random(using: &rng) ? .apns : .voip))
            }
            let online = devices.map(\.token).filter { _ in Int.random(in: 0..<3, using: &rng) == 0 }
            let prefs = Preferences(
                trigger: pick(PushTrigger.allCases),
                conversations: Bool.random(using: &rng)
                    ? [
                        "c1": ConversationPreference(
                            trigger: pick(ConversationTrigger.allCases), muted: Int.random(in: 0..<4, using: &rng) == 0)
                    ] : [:],
                dnd: Bool.random(using: &rng)
                    ? DoNotDisturb(
                        start: ClockTime(hour: Int.random(in: 0...23, using: &rng)),
                        end: ClockTime(hour: Int.random(in: 0...24, using: &rng)),
                        timezone: pick(["Asia/Seoul", "UTC", "America/New_York", "Not/AZone"])) : nil,
                snooze: Bool.random(using: &rng)
                    ? Snooze(start: t0, end: t0 + Int64.random(in: 0...86_400_000, using: &rng)) : nil)
            let state = UserState(devices: devices, online: online, preferences: prefs)
            let mode = pick(MultiDeviceMode.allCases)
            var app = AppConfig(multiDevice: mode, credentials: propertyCredentials)
            app.push = Int.random(in: 0..<8, using: &rng) != 0
            let decision = Suppression.decide(event: event, recipient: recipient, state: state, app: app, now: now0)
            let conv = prefs.conversation("c1")
            switch decision {
            case .suppress(.sender): #expect(recipient == "u1")
            case .suppress(.appOff): #expect(!app.push && recipient != "u1")
            case .suppress(.ignored): #expect(ignore && recipient != "u1" && app.push)
            case .suppress(.noDevices): #expect(Suppression.pushableDevices(event: event, state: state).isEmpty)
            case .suppress(.online): #expect(!online.isEmpty)
            case .suppress(.conversationOff): #expect(!force && conv.trigger == .off)
            case .suppress(.muted): #expect(!force && conv.muted)
            case .suppress(.triggerOff):
                #expect(!force && (conv.trigger == .off || (conv.trigger == .default && prefs.trigger == .off)))
            case .suppress(.notMentioned): #expect(!force && !event.mentions(recipient))
            case .suppress(.snoozed): #expect(!force && prefs.snooze?.covers(event.createdAt ?? 0) == true)
            case .suppress(.dnd): #expect(!force && prefs.dnd != nil)
            case .deliver(let targets):
                #expect(recipient != "u1" && app.push && !ignore && !targets.isEmpty)
                #expect(targets.allSatisfy { t in devices.contains(t) })
                if mode == .allOffline { #expect(online.isEmpty) }
                if mode == .anyOffline {
                    #expect(targets.contains { !online.contains($0.token) })
                } else {
                    #expect(targets.allSatisfy { !online.contains($0.token) })
                }
                if kind != .call { #expect(targets.allSatisfy { $0.kind == .apns }) }
                if !force {
                    #expect(!conv.muted && conv.trigger != .off)
                    #expect(prefs.snooze?.covers(event.createdAt ?? 0) != true)
                }
                // Whatever is delivered renders within the limit.
                let requests = try? Renderer.render(
                    event: event, recipient: recipient, state: state, targets: targets,
                    app: app, now: now0)
                #expect(requests?.count == targets.count)
            }
            if ignore && recipient != "u1" && app.push { #expect(decision == .suppress(.ignored)) }
        }
    }
}
