import ArgumentParser
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPushProviders
import HeraldToolSupport

/// `heraldctl push`: send one notification to one device and print APNs's answer as JSON.
/// The push tester for "I get nothing": it shows exactly what Apple said.
struct Push: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send one notification to one device token and print APNs's answer as JSON.",
        discussion: """
            Exit status 0 on 200 (2xx for webhooks), 1 on any other answer or failure.
            --provider fcm: the device token is an FCM registration token; the credential is the app's FCM
            credential (--pipeline --app [--provider-id]) or --service-account FILE; --payload-file holds the
            whole {"message":{...}} body, or --body builds a notification message.
            --provider webhook: the app's webhook (--pipeline --app [--provider-id]) or --url (with --user and
            --password for Basic auth); --payload-file holds the POST body, or --body builds CometChat's shape.
            --provider webpush: --subscription JSON (a browser's PushSubscription) or --device-token
            <p256dh>.<auth>.<endpoint>; the VAPID key is the app's (--pipeline --app) or --vapid-key FILE with
            --subject; --payload-file holds the message before encryption, or --body builds one; --ttl, --urgency
            and --collapse-id (the Topic) set the headers. Exit status 0 on 2xx.
            Credential: --pipeline FILE --app APP (the app's credential entry whose bundle_id matches the
            topic and whose environment matches --environment), or flags: token auth --key-p8 FILE
            --key-id ID --team-id ID; certificate auth --cert PEM --cert-key PEM, or --p12 FILE with
            --p12-password (or HERALD_APNS_P12_PASSWORD).
            """)

    @Option(help: "apns, fcm, webhook or webpush.") var provider = "apns"
    @Option(
        name: .customLong("device-token"),
        help:
            "Hex device token (apns), registration token (fcm), user id (webhook), <p256dh>.<auth>.<endpoint> (webpush)."
    )
    var deviceToken: String?
    @OptionGroup var webPush: WebPushPushOptions
    @Option(help: "apns-topic (bundle id; add .voip for voip pushes). APNs only.") var topic: String?
    @Option(
        name: .customLong("provider-id"), help: "FCM or webhook provider id in the pipeline (default: the app's first)."
    )
    var providerID: String?
    @Option(name: .customLong("service-account"), help: "FCM: service account JSON file.") var serviceAccount: String?
    @Option(help: "Webhook: URL to POST to.") var url: String?
    @Option(help: "Webhook: Basic auth user.") var user: String?
    @Option(help: "Webhook: Basic auth password (or HERALD_WEBHOOK_PASSWORD).") var password: String?
    @Option(
        name: .customLong("push-type"),
        help: "apns-push-type: \(APNsPushType.allCases.map(\.rawValue).joined(separator: ", ")).")
    var pushType = "alert"
    @Option(help: "apns-priority: 10, 5 or 1 (default: 10 for alert, 5 for background).") var priority: Int?
    @Option(name: .customLong("collapse-id"), help: "apns-collapse-id.") var collapseID: String?
    @Option(help: "apns-expiration, seconds since the epoch (0: deliver once).") var expiration: Int64?
    @Option(name: .customLong("apns-id"), help: "apns-id (UUID); default: APNs picks one.") var apnsID: String?
    @Option(name: .customLong("payload-file"), help: "File holding the JSON payload.") var payloadFile: String?
    @Option(help: "Alert body text (builds {\"aps\":{\"alert\":{\"body\":TEXT}}}).") var body: String?

    @Option(help: "production or sandbox.") var environment = "production"
    @Option(help: "Host override host:port (tests, the local stand-in).") var host: String?
    @Option(name: .customLong("ca-file"), help: "PEM CA file to trust instead of the system store.") var caFile: String?
    @Option(help: "Pipeline file holding the app's APNs credentials.") var pipeline: String?
    @Option(help: "App id in the pipeline file.") var app: String?
    @Option(name: .customLong("key-p8"), help: "Token auth: .p8 key file.") var keyP8: String?
    @Option(name: .customLong("key-id"), help: "Token auth: key id.") var keyID: String?
    @Option(name: .customLong("team-id"), help: "Token auth: team id.") var teamID: String?
    @Option(help: "Certificate auth: PEM certificate file.") var cert: String?
    @Option(name: .customLong("cert-key"), help: "Certificate auth: PEM private key file.") var certKey: String?
    @Option(help: "Certificate auth: .p12 file.") var p12: String?
    @Option(name: .customLong("p12-password"), help: "Password of the .p12 (or HERALD_APNS_P12_PASSWORD).")
    var p12Password: String?
    @Option(help: "Seconds to wait for the answer.") var timeout: Double = 15

    func run() async throws {
        switch provider {
        case "apns": break
        case "fcm": try await pushFCM(); return
        case "webhook": try await pushWebhook(); return
        case "webpush": try await pushWebPush(); return
        default: throw ValidationError("--provider must be apns, fcm, webhook or webpush")
        }
        let deviceToken = try token()
        guard let topic else { throw ValidationError("--topic is required for APNs") }
        guard let type = APNsPushType(rawValue: pushType) else {
            throw ValidationError("unknown --push-type \(pushType)")
        }
        guard let env = APNsEnvironment(rawValue: environment) else {
            throw ValidationError("--environment must be production or sandbox")
        }
        var prio: APNsPriority?
        if let priority {
            guard let p = APNsPriority(rawValue: priority) else {
                throw ValidationError("--priority must be 10, 5 or 1")
            }
            prio = p
        } else {
            prio = type == .background ? .considerPower : .immediately
        }
        let endpoint = try hostOverride()
        let payload = try payload { text in
            .object([("aps", .object([("alert", .object([("body", .string(text))]))]))])
        }
        let credential = try loadCredential(environment: env, topic: topic)
        let config = APNsClientConfiguration(
            credential: credential, environment: env, endpoint: endpoint, trustedCAFile: caFile, connections: 1,
            maxInFlight: 1, connectTimeout: .milliseconds(Int64(timeout * 1000)),
            retry: BackoffPolicy(maxAttempts: 1))
        let client: APNsClient
        do { client = try APNsClient(configuration: config) } catch { throw ValidationError(error.description) }
        let request = PushDelivery(
            deviceToken: deviceToken, topic: topic, pushType: type, priority: prio,
            expiration: expiration, collapseID: collapseID, apnsID: apnsID, payload: payload,
            timeout: .milliseconds(Int64(timeout * 1000)))
        let response = await client.send(request)
        await client.shutdown(grace: .seconds(1))
        CLI.out(Self.json(response))
        if response.status != 200 { throw ExitCode(1) }
    }

    private func loadCredential(environment env: APNsEnvironment, topic: String) throws -> APNsClientCredential {
        if let appConfig = try appConfig() {
            // The topic is the bundle id plus a push-type suffix such as .voip.
            let matches = appConfig.credentials.filter {
                $0.environment == env && (topic == $0.bundleID || topic.hasPrefix($0.bundleID + "."))
            }.sorted { $0.bundleID.count > $1.bundleID.count }
            guard let entry = matches.first else {
                throw ValidationError("app \(appConfig.appID) has no \(env.rawValue) credential for topic \(topic)")
            }
            do throws(PushError) { return try APNsClientCredential(entry) } catch {
                throw ValidationError(error.description)
            }
        }
        if let keyP8 {
            guard let keyID, let teamID else { throw ValidationError("--key-p8 needs --key-id and --team-id") }
            do { return try APNsClientCredential.token(keyID: keyID, teamID: teamID, p8Path: keyP8) } catch {
                throw ValidationError(error.description)
            }
        }
        if let cert {
            guard let certKey else { throw ValidationError("--cert needs --cert-key") }
            return .certificateFiles(certificatePath: cert, privateKeyPath: certKey)
        }
        if let p12 {
            let password = p12Password ?? ProcessInfo.processInfo.environment["HERALD_APNS_P12_PASSWORD"] ?? ""
            return .pkcs12File(path: p12, password: password)
        }
        throw ValidationError(
            "give a credential: --pipeline/--app, --key-p8/--key-id/--team-id, --cert/--cert-key or --p12")
    }

    static func json(_ r: PushResponse) -> String {
        var object: [String: JSONValue] = [
            "status": .int(r.status), "reason": .text(r.reason?.wire), "apns_id": .text(r.apnsID),
            "timestamp": .int(r.unregisteredAt), "attempts": .int(r.attempts),
            "disposition": .string(dispositionText(r.disposition)),
        ]
        if let failure = r.transportFailure { object["transport_failure"] = .string(failure.description) }
        return CLI.json(object)
    }

    static func dispositionText(_ d: PushDisposition) -> String {
        switch d {
        case .delivered: "delivered"
        case .retry(let after): "retry after \(after)"
        case .tokenDead: "token_dead"
        case .renewCredentials: "renew_credentials"
        case .permanentFailure(let reason): "permanent_failure: \(reason)"
        }
    }
}
