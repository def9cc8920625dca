// Unit tests of the stand-in's pure parts: request checks, JSON check, fault draws, base64url.
import Testing

@testable import HeraldMockAPNs

private let token = String(repeating: "ab", count: 32)
private let okBody = #"{"aps":{"alert":"hi"}}"#

private struct Row: CustomTestStringConvertible, Sendable {
    var name: String
    var headers: [(RequestField, String)]
    var body: String = okBody
    var bodyLength: Int? = nil
    var topics: [String] = ["com.example.chat"]
    var certificateAuth = false
    var auth: MockReason? = nil
    var expected: MockVerdict
    var testDescription: String { name }
}

private func base(
    _ extra: [(RequestField, String)] = [], method: String = "POST",
    path: String = "/3/device/" + token, topic: String? = "com.example.chat"
) -> [(RequestField, String)] {
    var h: [(RequestField, String)] = [(.method, method), (.path, path)]
    if let topic { h.append((.topic, topic)) }
    return h + extra
}

private let rows: [Row] = [
    Row(name: "valid alert is 200", headers: base(), expected: .ok),
    Row(
        name: "all optional headers valid",
        headers: base([
            (.pushType, "alert"), (.priority, "10"), (.expiration, "0"),
            (.collapseID, "c1"), (.apnsID, "123e4567-e89b-12d3-a456-426614174000"),
        ]), expected: .ok),
    Row(name: "GET is 405", headers: base(method: "GET"), expected: MockVerdict(.methodNotAllowed)),
    Row(name: "other path is 404", headers: base(path: "/3/devices/" + token), expected: MockVerdict(.badPath)),
    Row(
        name: "empty token is MissingDeviceToken", headers: base(path: "/3/device/"),
        expected: MockVerdict(.missingDeviceToken)),
    Row(
        name: "non-hex token", headers: base(path: "/3/device/" + String(repeating: "zz", count: 32)),
        expected: MockVerdict(.badDeviceToken)),
    Row(name: "short token", headers: base(path: "/3/device/abcd"), expected: MockVerdict(.badDeviceToken)),
    Row(
        name: "odd-length token", headers: base(path: "/3/device/" + token + "a"),
        expected: MockVerdict(.badDeviceToken)),
    Row(
        name: "200-char token passes", headers: base(path: "/3/device/" + String(repeating: "a1", count: 100)),
        expected: .ok),
    Row(
        name: "202-char token fails", headers: base(path: "/3/device/" + String(repeating: "a1", count: 101)),
        expected: MockVerdict(.badDeviceToken)),
    Row(
        name: "auth failure comes before token format", headers: base(path: "/3/device/xyz"),
        auth: .missingProviderToken,
        expected: MockVerdict(.missingProviderToken)),
    Row(
        name: "expired provider token", headers: base(), auth: .expiredProviderToken,
        expected: MockVerdict(.expiredProviderToken)),
    Row(
        name: "duplicate topic", headers: base([(.topic, "com.example.chat")]), expected: MockVerdict(.duplicateHeaders)
    ),
    Row(name: "bad apns-id", headers: base([(.apnsID, "not-a-uuid")]), expected: MockVerdict(.badMessageId)),
    Row(name: "bad push type", headers: base([(.pushType, "shout")]), expected: MockVerdict(.invalidPushType)),
    Row(name: "missing topic", headers: base(topic: nil), expected: MockVerdict(.missingTopic)),
    Row(
        name: "missing topic implied by a one-topic certificate", headers: base(topic: nil), certificateAuth: true,
        expected: .ok),
    Row(name: "unknown topic", headers: base(topic: "com.other.app"), expected: MockVerdict(.topicDisallowed)),
    Row(
        name: "voip needs .voip topic", headers: base([(.pushType, "voip")]),
        expected: MockVerdict(.deviceTokenNotForTopic)),
    Row(
        name: "voip with .voip topic", headers: base([(.pushType, "voip")], topic: "com.example.chat.voip"),
        expected: .ok),
    Row(
        name: "alert to .voip topic", headers: base(topic: "com.example.chat.voip"),
        expected: MockVerdict(.deviceTokenNotForTopic)),
    Row(name: "no topics configured: any topic", headers: base(topic: "anything.at.all"), topics: [], expected: .ok),
    Row(
        name: "no topics configured: voip still needs .voip", headers: base([(.pushType, "voip")], topic: "x"),
        topics: [],
        expected: MockVerdict(.deviceTokenNotForTopic)),
    Row(name: "priority 7", headers: base([(.priority, "7")]), expected: MockVerdict(.badPriority)),
    Row(name: "priority 5", headers: base([(.priority, "5")]), expected: .ok),
    Row(
        name: "expiration not numeric", headers: base([(.expiration, "soon")]),
        expected: MockVerdict(.badExpirationDate)),
    Row(name: "collapse id 64 bytes", headers: base([(.collapseID, String(repeating: "c", count: 64))]), expected: .ok),
    Row(
        name: "collapse id 65 bytes", headers: base([(.collapseID, String(repeating: "c", count: 65))]),
        expected: MockVerdict(.badCollapseId)),
    Row(name: "empty payload", headers: base(), body: "", expected: MockVerdict(.payloadEmpty)),
    Row(name: "payload not JSON", headers: base(), body: "{nope", expected: MockVerdict(.payloadEmpty)),
    Row(name: "payload a JSON array", headers: base(), body: "[1]", expected: MockVerdict(.payloadEmpty)),
    Row(name: "4096 bytes alert passes", headers: base(), body: padded(4096), expected: .ok),
    Row(
        name: "4097 bytes alert too large", headers: base(), body: padded(4097), expected: MockVerdict(.payloadTooLarge)
    ),
    Row(
        name: "5120 bytes voip passes", headers: base([(.pushType, "voip")], topic: "com.example.chat.voip"),
        body: padded(5120), expected: .ok),
    Row(
        name: "5121 bytes voip too large", headers: base([(.pushType, "voip")], topic: "com.example.chat.voip"),
        body: padded(5120),
        bodyLength: 5121, expected: MockVerdict(.payloadTooLarge)),
    // Background pushes: priority 5, content-available 1, nothing shown.
    Row(
        name: "background: priority 5 and content-available only",
        headers: base([(.pushType, "background"), (.priority, "5")]),
        body: #"{"aps":{"content-available":1,"thread-id":"c1"},"read":{"conversation":"c1","badge":2}}"#,
        expected: .ok),
    Row(
        name: "background with priority 10 is BadPriority",
        headers: base([(.pushType, "background"), (.priority, "10")]),
        body: #"{"aps":{"content-available":1}}"#, expected: MockVerdict(.badPriority)),
    Row(
        name: "background without apns-priority (10) is BadPriority", headers: base([(.pushType, "background")]),
        body: #"{"aps":{"content-available":1}}"#, expected: MockVerdict(.badPriority)),
    Row(
        name: "background without content-available", headers: base([(.pushType, "background"), (.priority, "5")]),
        body: #"{"aps":{"thread-id":"c1"},"content-available":1}"#, expected: MockVerdict(.invalidPushType)),
    Row(
        name: "background with content-available 0", headers: base([(.pushType, "background"), (.priority, "5")]),
        body: #"{"aps":{"content-available":0}}"#, expected: MockVerdict(.invalidPushType)),
    Row(
        name: "background with an alert", headers: base([(.pushType, "background"), (.priority, "5")]),
        body: #"{"aps":{"content-available":1,"alert":{"body":"hi"}}}"#, expected: MockVerdict(.invalidPushType)),
    Row(
        name: "background with a sound", headers: base([(.pushType, "background"), (.priority, "5")]),
        body: #"{"aps":{"sound":"default","content-available":1}}"#, expected: MockVerdict(.invalidPushType)),
    Row(
        name: "background with a badge", headers: base([(.pushType, "background"), (.priority, "5")]),
        body: #"{"aps":{"content-available":1,"badge":3}}"#, expected: MockVerdict(.invalidPushType)),
    Row(
        name: "background without aps", headers: base([(.pushType, "background"), (.priority, "5")]),
        body: #"{"read":{"all":true}}"#, expected: MockVerdict(.invalidPushType)),
    Row(
        name: "alert with content-available and a badge is fine", headers: base([(.priority, "5")]),
        body: #"{"aps":{"content-available":1,"badge":3}}"#, expected: .ok),
]

/// A JSON object of exactly n bytes.
func padded(_ n: Int) -> String {
    let shell = #"{"aps":{},"p":""}"#
    return #"{"aps":{},"p":""# + String(repeating: "x", count: n - shell.utf8.count) + #""}"#
}

@Test("request checks answer APNs's status and reason", arguments: rows)
private func requestChecks(_ row: Row) {
    var head = RequestHead()
    for (field, value) in row.headers { head.set(field, value) }
    let check = RequestCheck(topics: row.topics, deadTokens: [:])
    let body = Array(row.body.utf8)
    let verdict = body.withUnsafeBytes { raw in
        check.check(
            head: head, body: raw, bodyLength: row.bodyLength ?? body.count, certificateAuth: row.certificateAuth,
            nowMillis: 1_000
        ) { _ in row.auth }
    }
    #expect(verdict == row.expected)
}

@Test func deadTokenIsUnregisteredWithItsTimestamp() {
    var head = RequestHead()
    for (f, v) in base() { head.set(f, v) }
    let withStamp = RequestCheck(topics: [], deadTokens: [token.uppercased(): 1_700_000_000_000])
    let now = RequestCheck(topics: [], deadTokens: [token: nil])
    let body = Array(okBody.utf8)
    body.withUnsafeBytes { raw in
        #expect(
            withStamp.check(head: head, body: raw, bodyLength: raw.count, certificateAuth: false, nowMillis: 5) { _ in
                nil
            }
                == MockVerdict(.unregistered, timestamp: 1_700_000_000_000))
        #expect(
            now.check(head: head, body: raw, bodyLength: raw.count, certificateAuth: false, nowMillis: 5) { _ in nil }
                == MockVerdict(.unregistered, timestamp: 5))
    }
}

@Test(
    "JSON check accepts objects and rejects everything else",
    arguments: [
        (#"{}"#, true), (#" {"a":[1,2.5e3,-0,true,false,null,{"b":"\u00e9\n"}]} "#, true), ("{\"é\":\"日本\"}", true),
        (#"{"a":1,}"#, false), (#"{"a":01}"#, false), (#"{"a":"\x"}"#, false), ("{\"a\":\"\u{1}\"}", false),
        (#"[]"#, false), (#""s""#, false), (#"{"a":1}{"#, false), (#"{"a":tru}"#, false), (#"{"a":1."#, false),
        ("", false), (#"{"a":"unterminated}"#, false),
    ])
func jsonCheck(_ text: String, _ valid: Bool) {
    #expect(JSONCheck.isObject(Array(text.utf8)) == valid)
}

@Test func jsonCheckRejectsInvalidUTF8() {
    #expect(!JSONCheck.isObject([0x7B, 0x22, 0x61, 0x22, 0x3A, 0x22, 0xC3, 0x28, 0x22, 0x7D]))  // {"a":"\xC3("}
    #expect(!JSONCheck.isObject([0x7B, 0x22, 0x61, 0x22, 0x3A, 0x22, 0xED, 0xA0, 0x80, 0x22, 0x7D]))  // surrogate
}

@Test func faultRatesAreHonouredAndSeeded() {
    var rates = MockFaultRates()
    rates.tooManyRequests = 0.10
    rates.serviceUnavailable = 0.05
    rates.unregistered = 0.02
    var a = FaultInjector(rates: rates, seed: 42)
    var b = FaultInjector(rates: rates, seed: 42)
    var counts: [MockReason: Int] = [:]
    var none = 0
    for _ in 0..<100_000 {
        let x = a.draw()
        #expect(x == b.draw())
        if let x { counts[x, default: 0] += 1 } else { none += 1 }
    }
    #expect(abs(counts[.tooManyRequests, default: 0] - 10_000) < 500)
    #expect(abs(counts[.serviceUnavailable, default: 0] - 5_000) < 400)
    #expect(abs(counts[.unregistered, default: 0] - 2_000) < 250)
    #expect(counts[.internalServerError] == nil)
    #expect(abs(none - 83_000) < 700)
}

@Test func generatedApnsIDsAreCanonicalUUIDs() {
    var w = UUIDWriter(random: SeededRandom(seed: 9))
    var buf = [UInt8](repeating: 0, count: 36)
    var seen = Set<[UInt8]>()
    for _ in 0..<100 {
        buf.withUnsafeMutableBytes { w.write(into: $0) }
        #expect(buf.withUnsafeBytes { RequestCheck.isUUID($0) })
        #expect(buf[14] == UInt8(ascii: "4"))
        seen.insert(buf)
    }
    #expect(seen.count == 100)
}

@Test func base64URLDecodes() {
    #expect(Base64URL.decode(Array("eyJhIjoxfQ".utf8)) == Array(#"{"a":1}"#.utf8))
    #expect(Base64URL.decode(Array("-_8".utf8)) == [0xFB, 0xFF])
    #expect(Base64URL.decode(Array("a+b".utf8)) == nil)
}

@Test func errorBodiesAreAPNsShaped() {
    var out: [UInt8] = []
    MockAPNsServer.appendErrorBody(&out, MockVerdict(.badTopic))
    #expect(String(decoding: out, as: UTF8.self) == #"{"reason":"BadTopic"}"#)
    MockAPNsServer.appendErrorBody(&out, MockVerdict(.unregistered, timestamp: 1234))
    #expect(String(decoding: out, as: UTF8.self) == #"{"reason":"Unregistered","timestamp":1234}"#)
}

@Test func everyReasonHasApplesStatus() {
    let expected: [Int: Set<String>] = [
        400: [
            "BadCollapseId", "BadDeviceToken", "BadExpirationDate", "BadMessageId", "BadPriority", "BadTopic",
            "DeviceTokenNotForTopic", "DuplicateHeaders", "IdleTimeout", "InvalidPushType", "MissingDeviceToken",
            "MissingTopic", "PayloadEmpty", "TopicDisallowed",
        ],
        403: [
            "BadCertificate", "BadCertificateEnvironment", "ExpiredProviderToken", "Forbidden", "InvalidProviderToken",
            "MissingProviderToken",
        ],
        404: ["BadPath"], 405: ["MethodNotAllowed"], 410: ["Unregistered"], 413: ["PayloadTooLarge"],
        429: ["TooManyProviderTokenUpdates", "TooManyRequests"], 500: ["InternalServerError"],
        503: ["ServiceUnavailable", "Shutdown"],
    ]
    for r in MockReason.allCases {
        #expect(expected[r.status]?.contains(r.rawValue) == true, "\(r.rawValue)")
        #expect(MockMetrics.slot(r) == MockReason.allCases.firstIndex(of: r)! + 1)
    }
}

@Test func aRegisteredTokenIsBadInTheOtherEnvironmentAndNotForAnotherTopic() {
    let registered = [token.uppercased(): MockTokenRegistration(bundleID: "com.example.chat", environment: .sandbox)]
    let sandbox = RequestCheck(topics: [], deadTokens: [:], registered: registered, environment: .sandbox)
    let production = RequestCheck(topics: [], deadTokens: [:], registered: registered, environment: .production)
    func verdict(_ check: RequestCheck, topic: String) -> MockVerdict {
        var head = RequestHead()
        for (f, v) in base(topic: topic) { head.set(f, v) }
        let body = Array(okBody.utf8)
        return body.withUnsafeBytes { raw in
            check.check(head: head, body: raw, bodyLength: raw.count, certificateAuth: false, nowMillis: 5) { _ in nil }
        }
    }
    #expect(verdict(sandbox, topic: "com.example.chat") == .ok)
    #expect(verdict(production, topic: "com.example.chat") == MockVerdict(.badDeviceToken))
    #expect(verdict(sandbox, topic: "com.example.chat.beta") == MockVerdict(.deviceTokenNotForTopic))
    // Tokens not listed pass as before.
    let other = RequestCheck(topics: [], deadTokens: [:], registered: [:], environment: .production)
    #expect(verdict(other, topic: "com.example.chat.beta") == .ok)
    #expect(MockTokenRegistration.parse("ABCD:com.x:sandbox")?.token == "abcd")
    #expect(MockTokenRegistration.parse("abcd:com.x:staging") == nil)
}
