import HeraldSend
import Testing

@Suite("herald-send's readiness rule")
struct SendReadinessTests {
    struct Row: Sendable, CustomTestStringConvertible {
        var name: String
        var state: SendReadiness
        var apns: Bool
        var fcm: Bool
        var testDescription: String { name }
    }

    static func state(
        apnsClients: Bool = false, apnsConnected: Bool = false, fcmClients: Bool = false, fcmTokens: Bool = true,
        webhook: Bool = false, webpush: Bool = false
    ) -> SendReadiness {
        SendReadiness(
            apnsClients: apnsClients, apnsConnected: apnsConnected, fcmClients: fcmClients, fcmTokens: fcmTokens,
            webhookClients: webhook, webpushClients: webpush)
    }

    static let rows: [Row] = [
        Row(name: "no provider at all: not ready", state: state(), apns: false, fcm: true),
        Row(
            name: "an APNs credential, no connection yet: not ready", state: state(apnsClients: true),
            apns: false, fcm: true),
        Row(
            name: "an APNs credential with a connection: ready",
            state: state(apnsClients: true, apnsConnected: true), apns: true, fcm: true),
        Row(
            name: "an APNs credential waits for APNs even when another provider can send",
            state: state(apnsClients: true, fcmClients: true, webhook: true), apns: false, fcm: true),
        Row(name: "FCM only: ready without APNs", state: state(fcmClients: true), apns: true, fcm: true),
        Row(name: "webhooks only: ready without APNs", state: state(webhook: true), apns: true, fcm: true),
        Row(name: "Web Push only: ready without APNs", state: state(webpush: true), apns: true, fcm: true),
        Row(
            name: "an FCM client without an access token: fcm not ready",
            state: state(fcmClients: true, fcmTokens: false), apns: true, fcm: false),
    ]

    @Test("each check's answer", arguments: rows)
    func rule(row: Row) {
        #expect(row.state.apns == row.apns)
        #expect(row.state.fcm == row.fcm)
    }
}
