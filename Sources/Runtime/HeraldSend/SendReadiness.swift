/// herald-send's readiness checks (`/readyz`, docs/operations.md): what its transports hold, and the rule that
/// makes each check's answer from it.
package struct SendReadiness: Sendable, Equatable {
    /// An APNs credential loaded (there is a client).
    package var apnsClients: Bool
    /// At least one APNs client opened a connection.
    package var apnsConnected: Bool
    /// An FCM credential loaded.
    package var fcmClients: Bool
    /// Every FCM client holds an access token (true when there is none).
    package var fcmTokens: Bool
    /// A webhook resolved.
    package var webhookClients: Bool
    /// A Web Push VAPID key loaded.
    package var webpushClients: Bool

    package init(
        apnsClients: Bool, apnsConnected: Bool, fcmClients: Bool, fcmTokens: Bool, webhookClients: Bool,
        webpushClients: Bool
    ) {
        self.apnsClients = apnsClients
        self.apnsConnected = apnsConnected
        self.fcmClients = fcmClients
        self.fcmTokens = fcmTokens
        self.webhookClients = webhookClients
        self.webpushClients = webpushClients
    }

    /// The "apns" check: with an APNs credential, ready once a client opened a connection; without one (an app on
    /// FCM, webhooks or Web Push only), ready when another provider can send, so such a deployment does not wait
    /// for an APNs connection it never opens. With no provider at all, never ready.
    package var apns: Bool {
        apnsClients ? apnsConnected : (fcmClients || webhookClients || webpushClients)
    }

    /// The "fcm" check: every FCM client holds an access token.
    package var fcm: Bool { fcmTokens }
}
