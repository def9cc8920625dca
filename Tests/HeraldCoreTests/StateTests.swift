// The state model: fixture field names and defaults, the 20-token limit,
// unregistering, and the stage records that carry state between stages.

import Foundation
import HeraldCore
import Testing

let specFixture = """
    {"users":{"u2":{
        "devices":[{"token":"\(tokenA)","kind":"apns","environment":"production",
                    "bundle_id":"com.example.chat","registered_at":1732000000000}],
        "online":["\(tokenA)"],
        "preferences":{"trigger":"all","conversations":{"c1":{"trigger":"default","muted":false}},
          "dnd":{"start":"22:00","end":"08:00","timezone":"Asia/Seoul"},
          "snooze":{"start":1732000000000,"end":1732003600000},
          "template":"default","display_style":"summary","display_name":"Cindy","languages":["fr","de"],"badge":true},
        "unread":{"total":5,"conversations":{"c1":2}}}},
     "conversations":{"c1":{"members":["u1","u2","u3"]}}}
    """

@Suite("State model")
struct StateTests {
    @Test("the state fixture of docs/behaviour.md §3 decodes with its field names")
    func specFixtureDecodes() throws {
        let f = try StageCodec.decode(StateFixture.self, from: Array(specFixture.utf8))
        let u = try #require(f.users["u2"])
        #expect(
            u.devices == [
                Device(
                    token: tokenA, kind: .apns, environment: .production, bundleID: "com.example.chat",
                    registeredAt: 1_732_000_000_000)
            ])
        #expect(u.online == [tokenA])
        #expect(
            u.preferences.dnd
                == DoNotDisturb(start: ClockTime(hour: 22), end: ClockTime(hour: 8), timezone: "Asia/Seoul"))
        #expect(u.preferences.snooze == Snooze(start: 1_732_000_000_000, end: 1_732_003_600_000))
        #expect(u.preferences.displayName == "Cindy" && u.preferences.languages == ["fr", "de"])
        #expect(u.unread == Unread(total: 5, conversations: ["c1": 2]))
        #expect(f.conversations["c1"]?.members == ["u1", "u2", "u3"])
        // Encode and decode again: nothing lost.
        let again = try StageCodec.decode(StateFixture.self, from: StageCodec.encode(f))
        #expect(again == f)
    }

    @Test("every field but devices may be absent and takes its default")
    func defaults() throws {
        let f = try StageCodec.decode(
            StateFixture.self, from: Array(#"{"users":{"u9":{"devices":[{"token":"abc"}]}}}"#.utf8))
        let u = try #require(f.users["u9"])
        // No environment named: production, as a guess (`registeredEnvironment` nil).
        #expect(u.devices == [Device(token: "abc", kind: .apns, environment: nil, bundleID: nil, registeredAt: 0)])
        #expect(u.devices.first?.environment == .production && u.devices.first?.registeredEnvironment == nil)
        #expect(u.online.isEmpty && u.unread == Unread())
        let p = u.preferences
        #expect(p.trigger == .all && p.template == .default && p.displayStyle == .summary && p.badge)
        #expect(p.dnd == nil && p.snooze == nil && p.languages.isEmpty && p.conversations.isEmpty)
        #expect(f.user("nobody").devices.isEmpty)
        // A user known by preferences alone has no devices (an every-recipient webhook still reaches them).
        let named = try StageCodec.decode(
            StateFixture.self, from: Array(#"{"users":{"w3":{"preferences":{"nickname":"Maya"}}}}"#.utf8))
        #expect(named.user("w3").devices.isEmpty && named.user("w3").preferences.nickname == "Maya")
    }

    @Test("invalid state names the field")
    func invalidState() {
        let rows: [(String, String)] = [
            (#"{"users":{"u":{"devices":{}}}}"#, "users.u.devices"),
            (#"{"users":{"u":{"devices":[{"kind":"apns"}]}}}"#, "users.u.devices[0].token"),
            (#"{"users":{"u":{"devices":[],"preferences":{"trigger":"sometimes"}}}}"#, "users.u.preferences.trigger"),
            (
                #"{"users":{"u":{"devices":[],"preferences":{"dnd":{"start":"25:00","end":"08:00"}}}}}"#,
                "users.u.preferences.dnd.start"
            ),
            (#"{"users":{"u":{"devices":[{"token":"a","kind":"gcm"}]}}}"#, "users.u.devices[0].kind"),
        ]
        for (text, field) in rows {
            do {
                _ = try StageCodec.decode(StateFixture.self, from: Array(text.utf8))
                Issue.record("accepted \(text)")
            } catch {
                #expect(error.detail.hasPrefix(field), "\(error.detail)")
            }
        }
    }

    @Test("a user keeps at most 20 tokens: the 21st evicts the oldest")
    func twentyTokens() {
        var u = UserState()
        for n in 0..<20 {
            #expect(u.register(Device(token: "t\(n)", registeredAt: Int64(1000 + n))).isEmpty)
        }
        u.online = ["t0", "t5"]
        let evicted = u.register(Device(token: "t20", registeredAt: 2000))
        #expect(evicted.map(\.token) == ["t0"])
        #expect(u.devices.count == 20 && u.devices.first?.token == "t1" && u.devices.last?.token == "t20")
        #expect(u.online == ["t5"])
        // Registering a known token refreshes it rather than adding one.
        #expect(u.register(Device(token: "t1", registeredAt: 3000)).isEmpty)
        #expect(u.devices.count == 20 && u.devices.last?.token == "t1")
        #expect(u.register(Device(token: "t21", registeredAt: 3001)).map(\.token) == ["t2"])
    }

    @Test("a user loaded with more than 20 tokens keeps the 20 newest on the next registration")
    func moreThanTwenty() {
        var u = UserState(devices: (0..<25).map { Device(token: "t\($0)", registeredAt: Int64($0)) })
        let evicted = u.register(Device(token: "new", registeredAt: 100))
        #expect(evicted.map(\.token) == ["t0", "t1", "t2", "t3", "t4", "t5"])
        #expect(u.devices.count == 20)
    }

    @Test("unregister one token or all of them")
    func unregister() {
        var u = UserState(devices: [device(tokenA), device(tokenB)], online: [tokenB])
        #expect(u.unregister(token: tokenB)?.token == tokenB)
        #expect(u.devices == [device(tokenA)] && u.online.isEmpty)
        #expect(u.unregister(token: "missing") == nil)
        #expect(u.unregisterAll() == [device(tokenA)])
        #expect(u.devices.isEmpty)
    }

    @Test("DND clock times: 00:00 to 24:00, HH:mm only")
    func clockTimes() {
        #expect(ClockTime("24:00")?.minutes == 1440)
        #expect(ClockTime("7:05")?.minutes == 425)
        #expect(ClockTime("00:00")?.minutes == 0)
        #expect(ClockTime("23:59")?.minutes == 1439)
        #expect(ClockTime("09:30")?.minutes == 570)
        for bad in [
            "24:01", "25:00", "12:60", "1200", "", "12:5", "a:bc", "-1:00", "+1:00", " 1:00", "1:0x", ":00", "123:00",
            "12:000", "12:00:00", "12::00", "1:00 ", "\u{661}:00", "12:\u{663}0", "１2:00", "99:99",
        ] {
            #expect(ClockTime(bad) == nil, "\(bad)")
        }
    }

    @Test("stage records round-trip in their wire form (binary between stages, JSON for the DLQ)")
    func stageRecords() throws {
        let e = try event(validEvent)
        let f = try StageCodec.decode(StateFixture.self, from: Array(specFixture.utf8))
        let state = try #require(f.users["u2"])
        let ingested = IngestedRecord(event: e, ingestedAt: 5)
        #expect(try StageCodec.decode(IngestedRecord.self, from: StageCodec.encode(ingested)) == ingested)
        #expect(ingested.key == "c1")
        let resolved = ResolvedRecord(event: e, recipient: "u2", state: state, senderDisplayName: "C")
        #expect(try StageCodec.decode(ResolvedRecord.self, from: StageCodec.encode(resolved)) == resolved)
        let deliverable = DeliverableRecord(event: e, recipient: "u2", state: state, targets: state.devices)
        #expect(try StageCodec.decode(DeliverableRecord.self, from: StageCodec.encode(deliverable)) == deliverable)
        let requests = try Renderer.render(
            event: e, recipient: "u2", state: state, targets: state.devices,
            app: AppConfig(), now: now0)
        let outbound = OutboundRecord(
            eventID: e.eventID, appID: e.appID, recipient: "u2", request: try #require(requests.first),
            attempt: 2, notBefore: 99)
        let decodedOutbound = try StageCodec.decode(OutboundRecord.self, from: StageCodec.encode(outbound))
        #expect(decodedOutbound == outbound)
        #expect(outbound.key == tokenA)
        // The event's created_at rides along (format version 6) and names the pair's filing time; a version 5
        // record (written before it) is read without one.
        var timed = outbound
        timed.eventCreatedAt = 1_732_000_000_123
        let timedWire = StageCodec.encode(timed)
        #expect(try StageCodec.decode(OutboundRecord.self, from: timedWire) == timed)
        #expect(timed.deliveryPair.eventTime == 1_732_000_000_123)
        #expect(timed.deliveryPair == outbound.deliveryPair, "the time does not make another pair")
        var older = StageCodec.encode(outbound)
        #expect(older.last == 0, "no event time: the optional's absent marker ends the record")
        older.removeLast()
        // Version 7's byte of what render guessed ends the request: where a record with other guesses differs.
        var guessed = outbound
        guessed.request.guesses = outbound.request.guesses.isEmpty ? [.environment] : []
        let guessesAt = try #require(
            zip(StageCodec.encode(outbound), StageCodec.encode(guessed)).enumerated().first {
                $0.element.0 != $0.element.1
            }?
            .offset)
        older.remove(at: guessesAt)
        older[2] = 5
        let fromOlder = try StageCodec.decode(OutboundRecord.self, from: older)
        #expect(fromOlder == outbound && fromOlder.eventCreatedAt == nil)
        let dlq = DLQRecord(
            original: [0, 255, 10], sourceTopic: "chat.events", stage: "ingest", reason: "invalid",
            detail: "event_id: missing", time: 7)
        let decodedDLQ = try StageCodec.decode(DLQRecord.self, from: StageCodec.encode(dlq))
        #expect(decodedDLQ == dlq && decodedDLQ.originalBytes == [0, 255, 10])
        // A resolved record with a broken event names the field.
        #expect(throws: StageRecordError.self) {
            try StageCodec.decode(
                ResolvedRecord.self,
                from: Array(#"{"event":{"event_id":1},"recipient":"u","state":{"devices":[]}}"#.utf8))
        }
    }

    @Test("each record's JSON form reads back as the record, and 64-bit offsets survive")
    func jsonFormRoundTrips() throws {
        let e = try event(validEvent)
        let f = try StageCodec.decode(StateFixture.self, from: Array(specFixture.utf8))
        let state = try #require(f.users["u2"])
        let request = try #require(
            try Renderer.render(
                event: e, recipient: "u2", state: state, targets: state.devices,
                app: AppConfig(), now: now0
            ).first)
        func check<T: StageRecord & Equatable>(_ record: T) throws {
            #expect(try T.fromJSON(record.jsonBytes()) == record)
            #expect(try StageCodec.decode(T.self, from: record.jsonBytes()) == record)
            #expect(try StageCodec.decode(T.self, from: StageCodec.encode(record)) == record)
        }
        try check(IngestedRecord(event: e, ingestedAt: 1))
        try check(ResolvedRecord(event: e, recipient: "u2", state: state, senderDisplayName: "C"))
        try check(DeliverableRecord(event: e, recipient: "u2", state: state, targets: state.devices))
        try check(OutboundRecord(eventID: "e", appID: "a", recipient: "u2", request: request, attempt: 3, notBefore: 5))
        try check(
            OutboundRecord(
                eventID: "e", appID: "a", recipient: "u2", request: request, eventCreatedAt: 1_732_000_000_123))
        try check(DLQRecord(original: Array("x".utf8), stage: "send", reason: "BadTopic", detail: "d", time: 2))
        try check(
            DLQRecord(
                original: Array("x".utf8), sourceTopic: "t", sourcePartition: 1,
                sourceOffset: 9_007_199_254_740_993, stage: "send", reason: "r", detail: "d", time: 2))
        let offset = try DLQRecord.fromJSON(
            Array(#"{"original":"eA==","source_offset":9223372036854775807,"stage":"s","reason":"r"}"#.utf8))
        #expect(offset.sourceOffset == Int64.max)
        // Errors name the path.
        let broken = Array(
            #"{"event":\#(String(decoding: e.jsonBytes, as: UTF8.self)),"recipient":"u2","state":{"devices":[{"kind":"voip"}]},"targets":[]}"#
                .utf8)
        do {
            _ = try StageCodec.decode(DeliverableRecord.self, from: broken)
            Issue.record("accepted")
        } catch {
            #expect(error.detail.hasPrefix("state.devices[0].token: missing"), "\(error)")
        }
        do {
            _ = try StageCodec.decode(
                ResolvedRecord.self,
                from: Array(#"{"event":{"event_id":"x"},"recipient":"u","state":{"devices":[]}}"#.utf8))
            Issue.record("accepted")
        } catch {
            #expect(error.detail.hasPrefix("event.app_id: missing"), "\(error)")
        }
    }

    @Test("the records between stages travel in the binary form, and readers still take their JSON form")
    func binaryRecords() throws {
        let e = try event(validEvent)
        let f = try StageCodec.decode(StateFixture.self, from: Array(specFixture.utf8))
        let state = try #require(f.users["u2"])
        let deliverable = DeliverableRecord(
            event: e, recipient: "u2", state: state, targets: state.devices, senderDisplayName: "C")
        let wire = StageCodec.encode(deliverable)
        #expect(Array(wire.prefix(4)) == [0x00, 0x48, BinaryRecordFormat.version, DeliverableRecord.binaryType])
        #expect(
            wire.count * 2 < deliverable.jsonBytes().count,
            "binary \(wire.count) bytes vs JSON \(deliverable.jsonBytes().count)")
        #expect(try StageCodec.decode(DeliverableRecord.self, from: wire) == deliverable)
        // Resolve's fan-out encodes the event once: the same bytes as one record at a time.
        let fanned = ResolvedRecord.wireBytes(
            event: e, recipients: [("u2", state), ("u3", UserState())], senderDisplayName: "C")
        #expect(
            fanned == [
                StageCodec.encode(ResolvedRecord(event: e, recipient: "u2", state: state, senderDisplayName: "C")),
                StageCodec.encode(
                    ResolvedRecord(event: e, recipient: "u3", state: UserState(), senderDisplayName: "C")),
            ])
        // A JSON record (replayed from the DLQ, published by hand) is still read.
        #expect(try StageCodec.decode(DeliverableRecord.self, from: deliverable.jsonBytes()) == deliverable)
        // The DLQ stays JSON, for people and tools.
        let dlq = DLQRecord(original: wire, stage: "render", reason: "x", detail: "d", time: 1)
        #expect(StageCodec.encode(dlq).first == UInt8(ascii: "{"))
        // Another record type, a newer format version, trailing bytes and every truncation are refused with an error.
        #expect(throws: StageRecordError.self) { try StageCodec.decode(ResolvedRecord.self, from: wire) }
        var newer = wire
        newer[2] = BinaryRecordFormat.version + 1
        do {
            _ = try StageCodec.decode(DeliverableRecord.self, from: newer)
            Issue.record("accepted a newer format")
        } catch {
            #expect(error.detail.contains("format version"), "\(error)")
        }
        #expect(throws: StageRecordError.self) { try StageCodec.decode(DeliverableRecord.self, from: wire + [0]) }
        for length in stride(from: 0, to: wire.count, by: 7) {
            #expect(throws: StageRecordError.self) {
                try StageCodec.decode(DeliverableRecord.self, from: Array(wire.prefix(length)))
            }
        }
        // Any byte flipped never crashes the reader (it decodes to something or throws).
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            var bytes = wire
            for _ in 0..<3 {
                bytes[Int.random(in: 4..<bytes.count, using: &generator)] = UInt8.random(in: 0...255, using: &generator)
            }
            _ = try? StageCodec.decode(DeliverableRecord.self, from: bytes)
        }
    }

    @Test("a batch's events are kept for the next batch; a batch running beside it starts empty")
    func eventReuseCarry() throws {
        let e = try event(validEvent)
        let carry = EventReuseCarry()
        var first = carry.take()
        #expect(first.reused == 0)
        let a = ResolvedRecord(event: e, recipient: "u2", state: UserState())
        _ = try ResolvedRecord.decodeBinary(StageCodec.encode(a), reusing: &first)
        carry.keep(first)

        var next = carry.take()
        var beside = carry.take()
        _ = try ResolvedRecord.decodeBinary(StageCodec.encode(a), reusing: &beside)
        #expect(beside.reused == 0, "taken while the next batch holds them: empty")
        let b = ResolvedRecord(event: e, recipient: "u3", state: UserState(), senderDisplayName: "C")
        #expect(try ResolvedRecord.decodeBinary(StageCodec.encode(b), reusing: &next) == b)
        #expect(next.reused == 1, "the next batch took e from the first one instead of decoding it")
        // An edited copy under the same id is decoded, never taken for the kept one.
        var edited = e
        edited.message?.text = "changed"
        let c = ResolvedRecord(event: edited, recipient: "u4", state: UserState())
        #expect(try ResolvedRecord.decodeBinary(StageCodec.encode(c), reusing: &next) == c)
        #expect(next.reused == 1)
    }

    @Test("records of one event decode their event once (in a row or not), to what decoding each alone gives")
    func eventReuse() throws {
        let e = try event(validEvent)
        var other = e
        other.eventID = "another"
        let f = try StageCodec.decode(StateFixture.self, from: Array(specFixture.utf8))
        let state = try #require(f.users["u2"])
        let records = [
            ResolvedRecord(event: e, recipient: "u2", state: state, senderDisplayName: "C"),
            ResolvedRecord(event: e, recipient: "u3", state: UserState(), senderDisplayName: "C"),
            ResolvedRecord(event: other, recipient: "u2", state: state),
            ResolvedRecord(event: e, recipient: "u4", state: UserState()),
            ResolvedRecord(event: e, recipient: "u5", state: state),
        ]
        var reuse = EventReuse()
        for record in records {
            let wire = StageCodec.encode(record)
            #expect(try BinaryRecordFormat.decode(ResolvedRecord.self, from: wire, reusing: &reuse) == record)
        }
        #expect(reuse.reused == 3, "u3, u4 and u5: e was decoded once, though `other` came between")
        // Same id, other bytes (an edited copy): decoded, never taken for the one held.
        var edited = e
        edited.message?.text = "changed"
        let editedRecord = ResolvedRecord(event: edited, recipient: "u6", state: state)
        #expect(
            try BinaryRecordFormat.decode(ResolvedRecord.self, from: StageCodec.encode(editedRecord), reusing: &reuse)
                == editedRecord)
        #expect(reuse.reused == 3)
        #expect(
            try BinaryRecordFormat.decode(ResolvedRecord.self, from: StageCodec.encode(records[4]), reusing: &reuse)
                == records[4])
        #expect(reuse.reused == 3, "the edited copy took e's place")
        // A broken record after a good one of the same event is refused as it is alone; truncated ones too.
        let wire = StageCodec.encode(records[0])
        #expect(throws: StageRecordError.self) {
            try BinaryRecordFormat.decode(ResolvedRecord.self, from: wire + [0], reusing: &reuse)
        }
        for length in stride(from: 4, to: wire.count, by: 5) {
            #expect(throws: StageRecordError.self) {
                try BinaryRecordFormat.decode(ResolvedRecord.self, from: Array(wire.prefix(length)), reusing: &reuse)
            }
        }
        // Deliverable records too.
        let deliverable = DeliverableRecord(event: e, recipient: "u2", state: state, targets: state.devices)
        var deliverableReuse = EventReuse()
        for _ in 0..<3 {
            let decoded = try BinaryRecordFormat.decode(
                DeliverableRecord.self, from: StageCodec.encode(deliverable), reusing: &deliverableReuse)
            #expect(decoded == deliverable)
        }
        #expect(deliverableReuse.reused == 2)
    }

    @Test("a stored device read straight from its bytes is what the JSON reader gives, for any bytes")
    func storedDeviceReader() throws {
        func same(_ text: String, _ comment: Comment? = nil) {
            let bytes = Array(text.utf8)
            let generic = Result { () throws(StageRecordError) -> Device in try Device.fromJSON(bytes) }
            let flat = Result { () throws(StageRecordError) -> Device in try Device.fromStoredJSON(bytes) }
            // The same bytes as one line of a field, read in place: nothing before or after the line is read.
            let field =
                Array(#"{"token":"before"}"#.utf8) + [10] + bytes + [10] + Array(#"{"token":"x"} trailing"#.utf8)
            let inPlace = Result { () throws(StageRecordError) -> Device in
                try Device.fromStoredJSON(field, in: 19..<(19 + bytes.count))
            }
            for (name, result) in [("fromStoredJSON", flat), ("fromStoredJSON(in:)", inPlace)] {
                switch (generic, result) {
                case (.success(let a), .success(let b)): #expect(a == b, comment ?? "\(text) (\(name))")
                case (.failure(let a), .failure(let b)):
                    #expect(a.description == b.description, comment ?? "\(text) (\(name))")
                default: Issue.record("\(text): fromJSON \(generic), \(name) \(result)")
                }
            }
        }
        let stored = [
            Device(token: tokenA, registeredAt: 1_732_000_000_000),
            Device(token: tokenB, kind: .voip, environment: .sandbox, bundleID: "com.x", registeredAt: -5),
            Device(token: "fcm-1", kind: .fcm, registeredAt: 0, providerID: "p\u{e9}\"q"),
        ]
        for device in stored {
            #expect(try Device.fromStoredJSON(device.jsonBytes()) == device)
            same(String(decoding: device.jsonBytes(), as: UTF8.self))
        }
        for text in [
            #"{"token":"ab"}"#, #" { "token" : "ab" , "kind" : "voip" } "#, #"{"token":"a\u00e9b"}"#,
            #"{"token":"ab","kind":"fax"}"#, #"{"token":"ab","kind":null}"#, #"{"token":"ab","token":"cd"}"#,
            #"{"token":"t","platform":"APNS_iOS_VOIP"}"#, #"{"token":"t","platform":"PALM"}"#,
            #"{"token":"ab","registered_at":1.5}"#, #"{"token":"ab","registered_at":1e3}"#,
            #"{"token":"ab","registered_at":"12"}"#, #"{"token":"ab","registered_at":99999999999999999999}"#,
            #"{"token":"ab","registered_at":-0}"#, #"{"token":"ab","extra":{"x":[1,2]}}"#, #"{"kind":"apns"}"#,
            #"{}"#, #"[]"#, #""#, #"{"token":"ab"} x"#, #"{"token":"ab",}"#, #"{"token":"ab""#, #"{"token":"ab","#,
            #"{"token":"ab","registered_at":"#, #"{"token":"ab","registered_at":-}"#, #"{"token":1}"#,
            "\u{FEFF}{\"token\":\"ab\"}",
            // Integers around the reader's own fast path (up to 17 digits) and past it; keys written with escapes.
            #"{"token":"ab","registered_at":01}"#, #"{"token":"ab","registered_at":-01}"#,
            #"{"token":"ab","registered_at":0}"#, #"{"token":"ab","registered_at":-12}"#,
            #"{"token":"ab","registered_at":12345678901234567}"#, #"{"token":"ab","registered_at":123456789012345678}"#,
            #"{"token":"ab","registered_at":9223372036854775807}"#,
            #"{"token":"ab","registered_at":-9223372036854775808}"#,
            #"{"token":"ab","registered_at":9223372036854775808}"#, #"{"token":"ab","registered_at":12E2}"#,
            #"{"tok\u0065n":"ab"}"#, #"{"token":"ab","k\u0069nd":"voip"}"#, #"{"token":"ab","kinds":"voip"}"#,
            #"{"token":"ab","kin":"voip"}"#, "{\"token\":\"ab\",\"ki\u{1}nd\":\"voip\"}",
        ] {
            same(text)
        }
        // Every prefix and many mutations of a stored device.
        let full = String(decoding: stored[1].jsonBytes(), as: UTF8.self)
        for length in 0..<full.utf8.count { same(String(decoding: Array(full.utf8.prefix(length)), as: UTF8.self)) }
        var generator = SplitMix(state: 7)
        let alphabet = Array(#"{}[]:,"\ -0123456789.eEnulltruefalseabc"#.utf8)
        for _ in 0..<2_000 {
            var bytes = Array(full.utf8)
            for _ in 0..<Int.random(in: 1...3, using: &generator) {
                bytes[Int.random(in: 0..<bytes.count, using: &generator)] =
                    alphabet.randomElement(using: &generator) ?? 0x20
            }
            same(String(decoding: bytes, as: UTF8.self))
        }
    }

    @Test("stored preferences read straight from their bytes are what the JSON reader gives, for any bytes")
    func storedPreferencesReader() throws {
        func same(_ bytes: [UInt8], _ conversations: [String]?) {
            let text = String(decoding: bytes, as: UTF8.self)
            let generic = Result { () throws(StageRecordError) -> Preferences in
                if let conversations { return try Preferences.fromJSON(bytes, conversations: conversations) }
                return try Preferences.fromJSON(bytes)
            }
            let flat = Result { () throws(StageRecordError) -> Preferences in
                try Preferences.fromStoredJSON(bytes, conversations: conversations)
            }
            switch (generic, flat) {
            case (.success(let a), .success(let b)):
                #expect(a == b && a.unset == b.unset, "\(text) keeping \(conversations ?? [])")
            case (.failure(let a), .failure(let b)): #expect(a.description == b.description, "\(text)")
            default: Issue.record("\(text) keeping \(conversations ?? []): fromJSON \(generic), stored \(flat)")
            }
        }
        func both(_ text: String) {
            for keeping in [nil, [], ["c1"], ["c2", "c\u{e9}"], ["x"]] as [[String]?] {
                same(Array(text.utf8), keeping)
            }
        }
        let stored = [
            Preferences(),
            Preferences(badge: false),
            Preferences(
                trigger: .mentionOnly,
                conversations: [
                    "c1": ConversationPreference(trigger: .off), "c2": ConversationPreference(muted: true),
                    "c\u{e9}": ConversationPreference(trigger: .all, muted: true),
                ],
                dnd: DoNotDisturb(
                    start: ClockTime(hour: 22), end: ClockTime(hour: 7, minute: 30), timezone: "Asia/Seoul"),
                snooze: Snooze(start: 1_732_000_000_000, end: -4), template: .alternative, displayStyle: .simpleBanner,
                displayName: "Ann \"A\" \u{e9}", languages: ["ko", "en-US", "fr", "de", "it"]),
        ]
        for prefs in stored {
            #expect(try Preferences.fromStoredJSON(prefs.jsonBytes()) == prefs)
            both(String(decoding: prefs.jsonBytes(), as: UTF8.self))
        }
        for text in [
            #"{}"#, #" { "badge" : true } "#, #"{"badge":true,"badge":false}"#, #"{"trigger":"loud"}"#,
            #"{"trigger":null}"#, #"{"display_name":null}"#, #"{"display_style":"simple"}"#,
            #"{"display_style":"simple banner"}"#, #"{"display_style":"fancy"}"#, #"{"languages":[]}"#,
            #"{"languages":["a",null]}"#, #"{"languages":["a","b","c","d","e","f"]}"#, #"{"languages":["a",]}"#,
            #"{"snooze":{"start":1,"end":2.5}}"#,
            #"{"snooze":{"end":2,"start":1}}"#, #"{"dnd":{"start":"25:00","end":"07:00","timezone":"UTC"}}"#,
            #"{"dnd":{"start":"22:00","end":"07:00"}}"#, #"{"conversations":{"c1":{"trigger":"off"}}}"#,
            #"{"conversations":{"c1":{"trigger":"off","muted":1}}}"#,
            #"{"conversations":{"c1":{"trigger":"off","muted":true},"c1":{"trigger":"all","muted":false}}}"#,
            #"{"conversations":{"c\u0031":{"trigger":"off","muted":true}}}"#,
            #"{"conversations":{"x":[1,{"a":2}],"c1":{"trigger":"off","muted":true}}}"#, #"{"conversations":[]}"#,
            #"{"extra":1}"#, #"{"badge":true} x"#, #"{"badge":true"#, #"[]"#, #""#, "\u{FEFF}{\"badge\":true}",
        ] {
            both(text)
        }
        // Every prefix and many mutations of a stored form.
        let full = stored[2].jsonBytes()
        for length in 0..<full.count { same(Array(full.prefix(length)), ["c1"]) }
        var generator = SplitMix(state: 11)
        let alphabet = Array(#"{}[]:,"\ -0123456789.eEnulltruefalseabc"#.utf8)
        for round in 0..<2_000 {
            var bytes = full
            for _ in 0..<Int.random(in: 1...3, using: &generator) {
                bytes[Int.random(in: 0..<bytes.count, using: &generator)] =
                    alphabet.randomElement(using: &generator) ?? 0x20
            }
            same(bytes, round % 2 == 0 ? nil : ["c1", "c2"])
        }
    }

    @Test("a resolved record carries only the conversation's own preference and unread count")
    func scopedState() throws {
        var state = UserState(devices: [device(tokenA)])
        state.preferences.conversations = [
            "c1": ConversationPreference(trigger: .off), "c2": ConversationPreference(muted: true),
        ]
        state.unread = Unread(total: 9, conversations: ["c1": 2, "c2": 7])
        let scoped = state.scoped(to: "c1")
        #expect(scoped.preferences.conversations == ["c1": ConversationPreference(trigger: .off)])
        #expect(scoped.unread == Unread(total: 9, conversations: ["c1": 2]))
        #expect(state.scoped(to: "c3").preferences.conversations.isEmpty && state.scoped(to: "c3").unread.total == 9)
        #expect(scoped.devices == state.devices)
    }

    @Test("a state already scoped to the conversation is given back as it is, and others are cut to it")
    func scopedStateShapes() {
        let preference = ConversationPreference(trigger: .off)
        var state = UserState(devices: [device(tokenA)])
        state.unread.total = 4
        // Nothing per conversation, or only this one's: already scoped.
        #expect(state.scoped(to: "c1") == state)
        state.preferences.conversations = ["c1": preference]
        state.unread.conversations = ["c1": 3]
        state.unread.mentionConversations = ["c1": 1]
        #expect(state.scoped(to: "c1") == state)
        // One entry of another conversation in any of the three maps: cut.
        for other in 0..<3 {
            var mixed = state
            switch other {
            case 0: mixed.preferences.conversations["c2"] = preference
            case 1: mixed.unread.conversations["c2"] = 5
            default: mixed.unread.mentionConversations["c2"] = 2
            }
            #expect(mixed.scoped(to: "c1") == state)
            let elsewhere = mixed.scoped(to: "c2")
            #expect(elsewhere.preferences.conversations == (other == 0 ? ["c2": preference] : [:]))
            #expect(elsewhere.unread.conversations == (other == 1 ? ["c2": 5] : [:]))
            #expect(elsewhere.unread.mentionConversations == (other == 2 ? ["c2": 2] : [:]))
            #expect(elsewhere.unread.total == 4 && elsewhere.devices == state.devices)
        }
        // A map holding only another conversation is emptied.
        var only = UserState()
        only.unread.conversations = ["c2": 5]
        #expect(only.scoped(to: "c1").unread.conversations.isEmpty)
    }

    @Test("a DLQ record cuts an oversized original and keeps its size and SHA-256")
    func dlqTruncation() throws {
        let original = [UInt8](repeating: 0x61, count: 800_000)
        let dlq = DLQRecord(
            original: original, maxOriginalBytes: 1000, sourceTopic: "chat.events", sourcePartition: 3,
            sourceOffset: 42, stage: "ingest", reason: "invalid", detail: "too large", time: 1)
        #expect(dlq.truncated && dlq.originalSize == 800_000 && dlq.originalBytes?.count == 1000)
        #expect(dlq.originalSHA256 == SHA256.hex(original))
        let wire = StageCodec.encode(dlq)
        #expect(wire.count < 2000)
        let back = try StageCodec.decode(DLQRecord.self, from: wire)
        #expect(back == dlq && back.sourcePartition == 3 && back.sourceOffset == 42)
        // A small original is kept whole, with no size or digest.
        let small = DLQRecord(
            original: [1, 2, 3], maxOriginalBytes: 1000, stage: "ingest", reason: "invalid", detail: "", time: 1)
        #expect(!small.truncated && small.originalSize == nil && small.originalBytes == [1, 2, 3])
    }

    @Test("explain entries are written with sorted keys and read back")
    func explainJSON() throws {
        let entries = [
            ExplainEntry(appID: "a", eventID: "e\"1", stage: "resolve", decision: "fanned_out", at: 5, count: 3),
            ExplainEntry(
                appID: "a", eventID: "e1", user: "ü2", token: tokenA, stage: "send", decision: "retry",
                reason: "ServiceUnavailable", at: 6, status: 503, attempt: 2),
        ]
        for entry in entries {
            #expect(try ExplainEntry(json: entry.jsonBytes) == entry)
            guard case .object(let pairs) = try JSONValue.parse(entry.jsonBytes) else {
                Issue.record("not an object")
                continue
            }
            #expect(pairs.map(\.0) == pairs.map(\.0).sorted())
        }
        #expect(
            String(decoding: entries[0].jsonBytes, as: UTF8.self)
                == #"{"app_id":"a","at":5,"count":3,"decision":"fanned_out","event_id":"e\"1","stage":"resolve"}"#)
    }

    @Test("SHA-256 matches the FIPS 180-4 test vectors")
    func sha256() {
        #expect(SHA256.hex([]) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(SHA256.hex(Array("abc".utf8)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(
            SHA256.hex(Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8))
                == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        #expect(
            SHA256.hex([UInt8](repeating: 0x61, count: 1_000_000))
                == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }

    @Test("apns-id is a stable UUID derived from (event id, token)")
    func apnsID() {
        let a = APNsID.derive(eventID: "e1", token: tokenA)
        #expect(a == APNsID.derive(eventID: "e1", token: tokenA))
        #expect(a != APNsID.derive(eventID: "e1", token: tokenB))
        #expect(a != APNsID.derive(eventID: "e2", token: tokenA))
        #expect(UUID(uuidString: a) != nil)
        #expect(a.count == 36 && Array(a)[14] == "8")
        #expect("89AB".contains(Array(a)[19]))
        // Pinned value: the derivation is a contract (documented in docs/core.md).
        #expect(APNsID.derive(eventID: "e-9f2c", token: "abc") == "D8B7D8AE-8EAC-8397-946F-75F4AD1B97CE")
        #expect(
            APNsID.derive(
                eventID: "373360335316321408", token: "740f4707bebcf74f9b7c25d48e3358945f6aa01da5ddb387462c7eaf61bb78ad"
            )
                == "EDCF66D0-8838-8056-A0DF-756DF315C47F")
        #expect(APNsID.derive(eventID: "", token: "") == "AF63BD4C-8601-87DF-B89E-77398D4056DA")
    }
}

@Suite("Collapse id from the message")
struct CollapseIDTests {
    static func event(messageID: String, kind: String = "message") throws -> ChatEvent {
        let block =
            kind == "call"
            ? #""call":{"action":"initiated","session_id":"s-1","type":"video"}"#
            : #""message":{"id":"\#(messageID)","type":"text","text":"hi"}"#
        return try ChatEvent.decode(
            Array(
                """
                {"event_id":"e-1","app_id":"a","kind":"\(kind)","created_at":1732000000000,"sender":{"id":"u1","name":"A"},
                 "conversation":{"id":"c1","type":"group"},\(block)}
                """.utf8))
    }

    @Test(
        "collapse_id: message gives every device the message's collapse id; long ids are hashed to fit; calls keep theirs"
    )
    func fromMessage() throws {
        let devices = [
            Device(token: String(repeating: "a", count: 64), bundleID: "com.example.chat"),
            Device(token: String(repeating: "b", count: 64), bundleID: "com.example.chat"),
        ]
        let app = AppConfig(appID: "a", collapseID: .message)
        let now = Date(timeIntervalSince1970: 1_732_000_000)
        let requests = try Renderer.render(
            event: try Self.event(messageID: "373360335316321408"), recipient: "u2",
            state: UserState(devices: devices), targets: devices, app: app, now: now)
        #expect(requests.map(\.collapseID) == ["m-373360335316321408", "m-373360335316321408"])
        let long = try Renderer.render(
            event: try Self.event(messageID: String(repeating: "x", count: 80)), recipient: "u2",
            state: UserState(devices: devices), targets: devices, app: app, now: now)
        let id = try #require(long.first?.collapseID)
        #expect(id.hasPrefix("m-") && id.utf8.count <= 64 && long.allSatisfy { $0.collapseID == id })
        // The default app sets none.
        let plain = try Renderer.render(
            event: try Self.event(messageID: "1"), recipient: "u2", state: UserState(devices: devices),
            targets: devices, app: AppConfig(appID: "a"), now: now)
        #expect(plain.allSatisfy { $0.collapseID == nil })
        let call = try Renderer.render(
            event: try Self.event(messageID: "", kind: "call"), recipient: "u2",
            state: UserState(devices: devices), targets: devices, app: app, now: now)
        #expect(call.allSatisfy { $0.collapseID == "call-s-1" })
    }
}
