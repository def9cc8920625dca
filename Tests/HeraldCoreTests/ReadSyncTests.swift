// Cleared on read (docs/behaviour.md §6c): who gets a clear, the rate limit, and what the clear looks like on every
// provider.

import Foundation
import HeraldCore
import Testing

private let reader = String(repeating: "aa", count: 32)
private let phone = String(repeating: "bb", count: 32)
private let voip = String(repeating: "cc", count: 32)

private func device(_ token: String, _ kind: Device.Kind = .apns, provider: String? = nil) -> Device {
    Device(token: token, kind: kind, environment: .production, bundleID: "com.example.chat", providerID: provider)
}

struct TargetRow: Sendable, CustomTestStringConvertible {
    var name: String
    var devices: [Device]
    var reading: String?
    var expected: [String]
    var testDescription: String { name }
}

private let targetRows: [TargetRow] = [
    TargetRow(
        name: "the other phone gets it, the reading one does not", devices: [device(reader), device(phone)],
        reading: reader, expected: [phone]),
    TargetRow(
        name: "no reading device named: every device", devices: [device(reader), device(phone)], reading: nil,
        expected: [reader, phone]),
    TargetRow(name: "only the reading device: nobody", devices: [device(reader)], reading: reader, expected: []),
    TargetRow(
        name: "VoIP tokens never (they must report a call)", devices: [device(reader), device(voip, .voip)],
        reading: reader, expected: []),
    TargetRow(
        name: "FCM and webhook devices get it",
        devices: [device(reader), device("fcm-token-1", .fcm), device("hook-user", .webhook)], reading: reader,
        expected: ["fcm-token-1", "hook-user"]),
    TargetRow(
        name: "the reader named by an FCM token", devices: [device("fcm-token-1", .fcm), device(phone)],
        reading: "fcm-token-1", expected: [phone]),
    TargetRow(
        name: "a token nobody holds: every device", devices: [device(phone)], reading: "gone", expected: [phone]),
    TargetRow(name: "no devices", devices: [], reading: nil, expected: []),
]

struct AdmitStep: Sendable {
    var conversation: String
    var at: Int64
    var readAt: String
    var expected: ReadSyncOutcome
}

struct AdmitRow: Sendable, CustomTestStringConvertible {
    var name: String
    var policy: ReadSyncPolicy
    var steps: [AdmitStep]
    var testDescription: String { name }
}

/// A minute of the clock starts at 1_700_000_040_000.
private let readT0: Int64 = 1_700_000_040_000
private let readDefaults = ReadSyncPolicy()

private let admitRows: [AdmitRow] = [
    AdmitRow(
        name: "first read of a conversation is sent", policy: readDefaults,
        steps: [AdmitStep(conversation: "c1", at: readT0, readAt: "1", expected: .sent)]),
    AdmitRow(
        name: "the same conversation again within the interval is rate limited, after it sent", policy: readDefaults,
        steps: [
            AdmitStep(conversation: "c1", at: readT0, readAt: "1", expected: .sent),
            AdmitStep(conversation: "c1", at: readT0 + 2_999, readAt: "2", expected: .rateLimited),
            AdmitStep(conversation: "c1", at: readT0 + 3_000, readAt: "3", expected: .sent),
        ]),
    AdmitRow(
        name: "another conversation is not held by the first one's interval", policy: readDefaults,
        steps: [
            AdmitStep(conversation: "c1", at: readT0, readAt: "1", expected: .sent),
            AdmitStep(conversation: "c2", at: readT0 + 10, readAt: "2", expected: .sent),
            AdmitStep(conversation: ReadSync.everything, at: readT0 + 20, readAt: "3", expected: .sent),
        ]),
    AdmitRow(
        name: "a replay of the read that was sent is sent again and takes no slot",
        policy: ReadSyncPolicy(perMinute: 2),
        steps: [
            AdmitStep(conversation: "c1", at: readT0, readAt: "1", expected: .sent),
            AdmitStep(conversation: "c1", at: readT0 + 500, readAt: "1", expected: .sent),
            AdmitStep(conversation: "c2", at: readT0 + 600, readAt: "2", expected: .sent),
            AdmitStep(conversation: "c3", at: readT0 + 700, readAt: "3", expected: .userLimit),
        ]),
    AdmitRow(
        name: "a read without read_at is never taken for a replay", policy: readDefaults,
        steps: [
            AdmitStep(conversation: "c1", at: readT0, readAt: "", expected: .sent),
            AdmitStep(conversation: "c1", at: readT0 + 100, readAt: "", expected: .rateLimited),
        ]),
    AdmitRow(
        name: "the user's cap per minute, reset by the next minute of the clock",
        policy: ReadSyncPolicy(conversationIntervalMilliseconds: 0, perMinute: 3),
        steps: [
            AdmitStep(conversation: "c1", at: readT0, readAt: "1", expected: .sent),
            AdmitStep(conversation: "c2", at: readT0 + 1_000, readAt: "2", expected: .sent),
            AdmitStep(conversation: "c3", at: readT0 + 2_000, readAt: "3", expected: .sent),
            AdmitStep(conversation: "c4", at: readT0 + 59_999, readAt: "4", expected: .userLimit),
            AdmitStep(conversation: "c4", at: readT0 + 60_000, readAt: "5", expected: .sent),
        ]),
    AdmitRow(
        name: "the interval reaches across a minute boundary",
        policy: ReadSyncPolicy(conversationIntervalMilliseconds: 10_000),
        steps: [
            AdmitStep(conversation: "c1", at: readT0 + 55_000, readAt: "1", expected: .sent),
            AdmitStep(conversation: "c1", at: readT0 + 62_000, readAt: "2", expected: .rateLimited),
            AdmitStep(conversation: "c1", at: readT0 + 65_000, readAt: "3", expected: .sent),
        ]),
    AdmitRow(
        name: "a rate-limited read takes no slot of the user's cap",
        policy: ReadSyncPolicy(conversationIntervalMilliseconds: 5_000, perMinute: 2),
        steps: [
            AdmitStep(conversation: "c1", at: readT0, readAt: "1", expected: .sent),
            AdmitStep(conversation: "c1", at: readT0 + 100, readAt: "2", expected: .rateLimited),
            AdmitStep(conversation: "c1", at: readT0 + 200, readAt: "3", expected: .rateLimited),
            AdmitStep(conversation: "c2", at: readT0 + 300, readAt: "4", expected: .sent),
            AdmitStep(conversation: "c3", at: readT0 + 400, readAt: "5", expected: .userLimit),
        ]),
]

/// Runs `steps` through `ReadSync.admit`, one state per user: the outcomes in order.
func admitOutcomes(_ steps: [AdmitStep], policy: ReadSyncPolicy) -> [ReadSyncOutcome] {
    var state: ReadSyncLimiter?
    return steps.map { step in
        let (outcome, next) = ReadSync.admit(
            state, conversation: step.conversation, readAt: step.readAt, now: step.at, policy: policy)
        state = next
        return outcome
    }
}

private func object(_ bytes: [UInt8]) throws -> [String: Any] {
    try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
}

private let readApp: AppConfig = parityApp(.compact)
private let counted = UserState(unread: Unread(total: 4, conversations: ["c2": 4]))

@Suite("Cleared on read")
struct ReadSyncTests {
    @Test("who gets a clear", arguments: targetRows)
    func targets(row: TargetRow) {
        #expect(ReadSync.targets(row.devices, excluding: row.reading).map(\.token) == row.expected)
    }

    @Test("the rate limit per conversation and per user", arguments: admitRows)
    func rateLimit(row: AdmitRow) {
        #expect(admitOutcomes(row.steps, policy: row.policy) == row.steps.map(\.expected))
    }

    @Test("a read event's id is the same for the same read and differs for another")
    func eventIDs() {
        let a = ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: 5)
        #expect(a.eventID == ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: 5).eventID)
        #expect(a.eventID != ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: 6).eventID)
        #expect(a.eventID != ReadSync.event(app: "app1", user: "u3", conversation: "c1", readAt: 5).eventID)
        #expect(a.eventID != ReadSync.event(app: "app1", user: "u2", conversation: nil, readAt: 5).eventID)
        #expect(a.kind == .conversationRead && ReadSync.conversation(of: a) == "c1")
        #expect(ReadSync.conversation(of: ReadSync.event(app: "app1", user: "u2", conversation: nil, readAt: 5)) == nil)
    }

    @Test("APNs: a background push, priority 5, the conversation as thread-id and in read, the badge in read")
    func apnsClear() throws {
        let e = ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: 1_700_000_000_000)
        let requests = try Renderer.render(
            event: e, recipient: "u2", state: counted, targets: [device(phone)], app: readApp, now: Date())
        let r = try #require(requests.first)
        #expect(requests.count == 1)
        #expect(r.pushType == .background && r.priority == 5 && r.topic == "com.example.chat")
        #expect(r.apnsID == APNsID.derive(eventID: e.eventID, token: phone))
        #expect(r.collapseID == "r-c1")
        #expect(r.expiration == 1_700_000_000 + ReadSync.expirationSeconds)
        let p = try object(r.payload)
        let aps = try #require(p["aps"] as? [String: Any])
        #expect(aps.count == 2 && aps["content-available"] as? Int == 1 && aps["thread-id"] as? String == "c1")
        let read = try #require(p["read"] as? [String: Any])
        #expect(read["conversation"] as? String == "c1" && read["badge"] as? Int == 4)
    }

    @Test("mark everything read: no thread-id, all, the badge")
    func clearAll() throws {
        let e = ReadSync.event(app: "app1", user: "u2", conversation: nil, readAt: 1_700_000_000_000)
        let state = UserState(unread: Unread(total: 0))
        let r = try #require(
            try Renderer.render(
                event: e, recipient: "u2", state: state, targets: [device(phone)], app: readApp, now: Date()
            ).first)
        let p = try object(r.payload)
        #expect((p["aps"] as? [String: Any])?.keys.sorted() == ["content-available"])
        let read = try #require(p["read"] as? [String: Any])
        #expect(read["all"] as? Bool == true && read["badge"] as? Int == 0 && read["conversation"] == nil)
        #expect(r.collapseID == "r-*")
    }

    @Test("no badge when the user turned badges off")
    func badgeOff() throws {
        var state = counted
        state.preferences.badge = false
        let e = ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: 1)
        let r = try #require(
            try Renderer.render(
                event: e, recipient: "u2", state: state, targets: [device(phone)], app: readApp, now: Date()
            ).first)
        #expect((try object(r.payload)["read"] as? [String: Any])?["badge"] == nil)
    }

    @Test("FCM: data only (no notification), the conversation and badge as strings; webhooks: a read event")
    func fcmAndWebhook() throws {
        let e = ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: 1_700_000_000_000)
        let requests = try Renderer.render(
            event: e, recipient: "u2", state: counted,
            targets: [device("fcm-token-1", .fcm), device("hook-user", .webhook), device(voip, .voip)], app: readApp,
            now: Date())
        #expect(requests.map(\.provider) == [.fcm, .webhook], "no VoIP push")
        let fcm = try #require(try object(requests[0].payload)["message"] as? [String: Any])
        #expect(fcm["notification"] == nil)
        #expect((fcm["data"] as? [String: String]) == ["type": "read", "conversation": "c1", "badge": "4"])
        #expect((fcm["android"] as? [String: Any])?["collapse_key"] as? String == "r-c1")
        let apnsHeaders = (fcm["apns"] as? [String: Any])?["headers"] as? [String: String]
        #expect(apnsHeaders == ["apns-push-type": "background", "apns-priority": "5"])
        let hook = try object(requests[1].payload)
        #expect(hook["trigger"] as? String == "conversation-read" && hook["appId"] as? String == "app1")
        let data = try #require(hook["data"] as? [String: Any])
        #expect(data["type"] as? String == "read" && data["conversationId"] as? String == "c1")
        #expect(data["badge"] as? Int == 4 && (data["to"] as? [String: Any])?["uid"] as? String == "u2")
    }

    @Test("a device render cannot address is a render error, as for any push")
    func renderErrors() {
        let e = ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: 1)
        let rows: [(Device, RenderError.Code)] = [
            (device("fcm-token-1", .fcm, provider: "nobody"), .noProvider),
            (device("hook-user", .webhook, provider: "nobody"), .noProvider),
            (Device(token: phone, kind: .apns, environment: .production), .noTopic),
        ]
        let noCredentials = AppConfig(appID: "app1")
        for (target, code) in rows {
            do {
                _ = try Renderer.render(
                    event: e, recipient: "u2", state: counted, targets: [target],
                    app: code == .noTopic ? noCredentials : readApp, now: Date())
                Issue.record("rendered for \(target.kind)")
            } catch {
                #expect(error.code == code, "\(target.kind)")
            }
        }
    }

    @Test("a conversation_read event on chat.events is invalid at ingest")
    func notFromChatEvents() {
        let e = ReadSync.event(app: "app1", user: "u2", conversation: "c1", readAt: 1)
        guard case .drop(.invalid, let detail) = Ingest.admit(e) else {
            Issue.record("admitted")
            return
        }
        #expect(detail.contains("mark_read"))
    }

    @Test("a read event survives the deliverable record's binary and JSON forms")
    func recordRoundTrip() throws {
        let e = ReadSync.event(app: "app1", user: "u2", conversation: nil, readAt: 9)
        let record = DeliverableRecord(event: e, recipient: "u2", state: counted, targets: [device(phone)])
        let binary = try StageCodec.decode(DeliverableRecord.self, from: StageCodec.encode(record))
        #expect(binary == record)
        let json = try DeliverableRecord.fromJSON(record.jsonBytes())
        #expect(json == record && ReadSync.conversation(of: json.event) == nil)
    }
}
