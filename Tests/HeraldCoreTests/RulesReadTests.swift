// Suppress's read of a resolved record (`ResolvedRecord.readForRules`): the rules decide on it as on the whole
// record, and the deliverable record built from the input's bytes is the one the whole record encodes to.

import Foundation
import HeraldCore
import Testing

/// A resolved record with every part the binary form has, chosen by `rng`.
private func arbitraryResolved(_ rng: inout SplitMix) -> ResolvedRecord {
    func pick<T>(_ xs: [T]) -> T { xs[Int.random(in: 0..<xs.count, using: &rng)] }
    func maybe<T>(_ value: @autoclosure () -> T) -> T? { Bool.random(using: &rng) ? value() : nil }
    func text() -> String { pick(["", "hi", "a somewhat longer text than fifteen bytes", "é中😎\"\\\n", "c9"]) }
    let kind = pick(ChatEvent.Kind.allCases)
    let conversation = pick(["c1", "c2", "a-conversation-id-longer-than-sixteen"])
    let event = ChatEvent(
        eventID: pick(["e", "evt-0123456789abcdef0123"]), appID: pick(["a", "app-1"]), kind: kind,
        createdAt: maybe(t0 + Int64.random(in: 0...86_400_000, using: &rng)),
        sender: .init(id: pick(["u1", "u2"]), name: maybe(text()), profileURL: maybe("https://example.com/p.png")),
        conversation: .init(
            id: conversation, type: pick(ConversationType.allCases), name: maybe(text()),
            customType: maybe(text())),
        recipients: maybe(["u2", "u3", "a-recipient-id-longer-than-sixteen"]),
        message: maybe(
            .init(
                id: text(), type: pick(MessageType.allCases), text: text(), customType: text(), data: text(),
                file: maybe(.init(name: maybe(text()), mimeType: maybe("image/png"), url: maybe(text()))),
                mentions: pick([[], ["u2"], ["u3", "u2"], ["someone-with-a-long-user-id"]]),
                mentionType: pick(MentionType.allCases), language: maybe("fr"),
                translations: Bool.random(using: &rng) ? [("de", text()), ("ko", text())] : [])),
        call: maybe(.init(action: pick(ChatEvent.CallAction.allCases), sessionID: text(), type: .video)),
        reaction: maybe(.init(emoji: "😎", messageID: maybe(text()))),
        groupAction: maybe(.init(action: pick(ChatEvent.GroupActionKind.allCases), actorName: text())),
        ext: .init(
            ignoreNotification: Int.random(in: 0..<6, using: &rng) == 0,
            forceNotification: Int.random(in: 0..<4, using: &rng) == 0,
            apns: .init(
                pushContent: maybe(text()), category: maybe("CAT"), sound: maybe("a.caf"),
                mutableContent: Bool.random(using: &rng), titleLocKey: maybe("T"), titleLocArgs: maybe([text()]),
                bodyLocKey: maybe("B"), bodyLocArgs: maybe([text(), "x"]),
                extern: maybe(.object([("k", .string(text()))])),
                soundSilenced: Int.random(in: 0..<4, using: &rng) == 0)))
    var devices: [Device] = []
    for n in 0..<Int.random(in: 0...4, using: &rng) {
        devices.append(
            Device(
                token: "token-\(n)-0123456789abcdef0123456789abcdef", kind: pick(Device.Kind.allCases),
                environment: pick([.production, .sandbox]), bundleID: maybe("com.example.chat"),
                registeredAt: Int64(n), providerID: maybe("provider-\(n)")))
    }
    var conversations: [String: ConversationPreference] = [:]
    for id in ["c1", "c2", "c3"] where Bool.random(using: &rng) {
        conversations[id] = ConversationPreference(
            trigger: pick(ConversationTrigger.allCases), muted: Int.random(in: 0..<3, using: &rng) == 0)
    }
    let preferences = Preferences(
        trigger: maybe(pick(PushTrigger.allCases)), conversations: conversations,
        dnd: maybe(
            DoNotDisturb(
                start: ClockTime(hour: Int.random(in: 0...23, using: &rng)),
                end: ClockTime(hour: Int.random(in: 0...24, using: &rng)),
                timezone: pick(["Asia/Seoul", "UTC", "America/New_York"]))),
        snooze: maybe(Snooze(start: t0, end: t0 + Int64.random(in: 0...86_400_000, using: &rng))),
        template: maybe(pick(TemplateChoice.allCases)), displayStyle: maybe(pick(DisplayStyle.allCases)),
        displayName: maybe(text()), languages: pick([[], ["fr"], ["ko", "en"]]), badge: Bool.random(using: &rng))
    let unread = Unread(
        total: maybe(Int.random(in: 0...900, using: &rng)), conversations: maybe(["c1": 3, "c2": 1]) ?? [:],
        mentionTotal: Int.random(in: 0...3, using: &rng), mentionConversations: maybe(["c1": 1]) ?? [:])
    let online = devices.map(\.token).filter { _ in Int.random(in: 0..<3, using: &rng) == 0 }
    return ResolvedRecord(
        event: event, recipient: pick(["u1", "u2", "u3", "someone-with-a-long-user-id"]),
        state: UserState(devices: devices, online: online, preferences: preferences, unread: unread),
        senderDisplayName: maybe(text()))
}

/// What suppress wrote before it read records this way: the whole record, its devices and presence emptied.
private func deliverable(_ whole: ResolvedRecord, targets: [Device], burst: Int?) -> [UInt8] {
    var state = whole.state
    state.devices = []
    state.online = []
    var record = DeliverableRecord(
        event: whole.event, recipient: whole.recipient, state: state, targets: targets,
        senderDisplayName: whole.senderDisplayName)
    record.burst = burst
    return StageCodec.encode(record)
}

@Suite("Suppress's read of a resolved record")
struct RulesReadTests {
    @Test("the rules decide on it as on the whole record, and the deliverable is the whole record's, byte for byte")
    func sameDecisionsSameBytes() throws {
        let apps = [
            AppConfig(multiDevice: .allOffline),
            AppConfig(multiDevice: .anyOffline, userDefaults: Preferences(trigger: .mentionOnly)),
            AppConfig(multiDevice: .offlineOnly, userDefaults: Preferences(trigger: .off)),
        ]
        var rng = SplitMix(state: 24)
        var delivered = 0
        var reuse = EventReuse()
        var previous: ChatEvent?
        for n in 0..<600 {
            var whole = arbitraryResolved(&rng)
            // Every third record is another recipient of the event before it, as in a batch.
            if n % 3 == 2, let previous { whole.event = previous }
            previous = whole.event
            let wire = StageCodec.encode(whole)
            let read = try ResolvedRecord.readForRules(wire, reusing: &reuse)
            let parts = try #require(read.forwarded, "a record in the current format is read in parts")
            #expect(read.record.recipient == whole.recipient)
            #expect(read.record.event.eventID == whole.event.eventID && read.record.event.appID == whole.event.appID)
            for app in apps {
                for offset in [Int64(0), 3_600_000, 43_200_000] {
                    let at = (whole.event.createdAt ?? t0) + offset
                    let expected = Suppression.decide(
                        event: whole.event, recipient: whole.recipient, state: whole.state, app: app, at: at)
                    let got = Suppression.decide(
                        event: read.record.event, recipient: read.record.recipient, state: read.record.state,
                        app: app, at: at)
                    #expect(got == expected)
                    #expect(
                        Coalescing.eligible(read.record.event, recipient: read.record.recipient, app: app)
                            == Coalescing.eligible(whole.event, recipient: whole.recipient, app: app))
                    #expect(FloodGuard.exempt(read.record.event) == FloodGuard.exempt(whole.event))
                    if case .deliver = expected { delivered += 1 }
                }
            }
            for burst in [nil, 1, 7, -3] {
                let targets = Array(whole.state.devices.prefix(Int.random(in: 0...2, using: &rng)))
                let bytes = DeliverableRecord.wireBytes(forwarding: parts, targets: targets, burst: burst)
                #expect(bytes == deliverable(whole, targets: targets, burst: burst))
            }
        }
        #expect(delivered > 500, "the records above reach deliveries, not only suppressions")
        #expect(reuse.reused == 200, "records of the event before them take it from the batch's events")
    }

    @Test("a record cut anywhere or with bytes after it is refused")
    func truncated() throws {
        var rng = SplitMix(state: 7)
        var reuse = EventReuse()
        for _ in 0..<20 {
            let wire = StageCodec.encode(arbitraryResolved(&rng))
            #expect(throws: StageRecordError.self) { try ResolvedRecord.readForRules(wire + [0], reusing: &reuse) }
            for length in 0..<wire.count {
                #expect(throws: StageRecordError.self) {
                    try ResolvedRecord.readForRules(Array(wire.prefix(length)), reusing: &reuse)
                }
            }
        }
    }

    @Test("any bytes changed in a record: the read refuses it or reads it, and what it forwards is in bounds")
    func mutatedBytesNeverTrap() throws {
        var rng = SplitMix(state: 13)
        var reuse = EventReuse()
        var read = 0
        for _ in 0..<300 {
            var wire = StageCodec.encode(arbitraryResolved(&rng))
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                let at = Int.random(in: 4..<wire.count, using: &rng)
                wire[at] = UInt8.random(in: 0...255, using: &rng)
            }
            guard let parts = (try? ResolvedRecord.readForRules(wire, reusing: &reuse))?.forwarded else { continue }
            read += 1
            // Built from the ranges it kept: a range outside the bytes would trap here.
            let deliverable = DeliverableRecord.wireBytes(forwarding: parts, targets: [], burst: 2)
            #expect(deliverable.count <= wire.count + 16)
        }
        #expect(read > 0, "some changed bytes still read (a changed letter in a text)")
    }

    @Test("every enumeration's names read back as written; a name with any one byte changed is refused")
    func enumerationNamesMatchedOnTheirBytes() throws {
        var rng = SplitMix(state: 11)
        for _ in 0..<200 {
            let whole = arbitraryResolved(&rng)
            #expect(try StageCodec.decode(ResolvedRecord.self, from: StageCodec.encode(whole)) == whole)
        }
        // A name longer than eight bytes and one shorter, changed at each of their bytes, or cut short by one.
        for (name, set) in [
            ("alternative", { (p: inout Preferences) in p.template = .alternative }),
            ("off", { (p: inout Preferences) in p.trigger = .off }),
        ] as [(String, (inout Preferences) -> Void)] {
            var whole = arbitraryResolved(&rng)
            set(&whole.state.preferences)
            let wire = StageCodec.encode(whole)
            #expect(try StageCodec.decode(ResolvedRecord.self, from: wire) == whole)
            // The name as the record writes it: its length, then its bytes.
            let written = [UInt8(name.utf8.count)] + Array(name.utf8)
            let at = try #require(
                (0...(wire.count - written.count)).last { Array(wire[$0..<$0 + written.count]) == written },
                "the name \(name) is in the record")
            for index in 1..<written.count {
                var changed = wire
                changed[at + index] ^= 0x20
                #expect(throws: StageRecordError.self, "\(name), byte \(index)") {
                    try StageCodec.decode(ResolvedRecord.self, from: changed)
                }
            }
            var shorter = wire
            shorter[at] -= 1
            shorter.remove(at: at + written.count - 1)
            #expect(throws: StageRecordError.self, "\(name) cut short") {
                try StageCodec.decode(ResolvedRecord.self, from: shorter)
            }
        }
    }

    @Test("a wrong value in a part the rules step over goes on, and the deliverable's whole decode refuses it")
    func wrongValueRefusedDownstream() throws {
        var rng = SplitMix(state: 5)
        var whole = arbitraryResolved(&rng)
        whole.state.preferences.template = .alternative
        var wire = StageCodec.encode(whole)
        let name = Array("alternative".utf8)
        let at = try #require(
            (0...(wire.count - name.count)).first { Array(wire[$0..<$0 + name.count]) == name },
            "the template's name is in the record")
        wire[at + name.count - 1] = UInt8(ascii: "X")
        #expect(throws: StageRecordError.self) { try StageCodec.decode(ResolvedRecord.self, from: wire) }
        var reuse = EventReuse()
        let parts = try #require(try ResolvedRecord.readForRules(wire, reusing: &reuse).forwarded)
        let deliverable = DeliverableRecord.wireBytes(forwarding: parts, targets: [], burst: nil)
        #expect(throws: StageRecordError.self) { try StageCodec.decode(DeliverableRecord.self, from: deliverable) }
    }

    @Test("a JSON record or one of an older format version is decoded whole and written again")
    func wholeWhenNotCurrent() throws {
        var rng = SplitMix(state: 11)
        var reuse = EventReuse()
        for _ in 0..<50 {
            var whole = arbitraryResolved(&rng)
            // A version 6 record: no silenced sound, a known unread total (the resolved record's layout is
            // otherwise the same in version 5).
            whole.event.ext.apns.soundSilenced = false
            whole.state.unread.total = whole.state.unread.total
            let older = try version6Bytes(whole)
            let read = try ResolvedRecord.readForRules(older, reusing: &reuse)
            #expect(read.forwarded == nil)
            #expect(read.record == whole)
            // JSON is read as a stage reads any JSON record (an event JSON refuses is refused here too).
            let json = whole.jsonBytes()
            let expected = try? StageCodec.decode(ResolvedRecord.self, from: json)
            let fromJSON = try? ResolvedRecord.readForRules(json, reusing: &reuse)
            #expect(fromJSON?.record == expected)
            #expect(fromJSON.map { $0.forwarded == nil } ?? true)
        }
    }

    @Test("events read for the rules are not served to a whole read of the same bytes, nor the other way round")
    func partialEventsKeptApart() throws {
        var rng = SplitMix(state: 3)
        var whole = arbitraryResolved(&rng)
        whole.event.message = ChatEvent.Message(id: "m", text: "the text the rules never read")
        let wire = StageCodec.encode(whole)
        var reuse = EventReuse()
        _ = try ResolvedRecord.readForRules(wire, reusing: &reuse)
        #expect(try BinaryRecordFormat.decode(ResolvedRecord.self, from: wire, reusing: &reuse) == whole)
        #expect(reuse.reused == 0)
        _ = try ResolvedRecord.readForRules(wire, reusing: &reuse)
        #expect(try BinaryRecordFormat.decode(ResolvedRecord.self, from: wire, reusing: &reuse) == whole)
        #expect(reuse.reused == 0, "each read replaced the other's entry; neither was served the other's event")
        _ = try BinaryRecordFormat.decode(ResolvedRecord.self, from: wire, reusing: &reuse)
        #expect(reuse.reused == 1)
    }
}
