import ArgumentParser
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPushProviders
import HeraldRegistryAPI
import HeraldToolSupport

/// `heraldctl push --provider webpush`'s own options.
struct WebPushPushOptions: ParsableArguments {
    @Option(
        help:
            "Web Push: the browser's PushSubscription as JSON ({\"endpoint\":...,\"keys\":{\"p256dh\":...,\"auth\":...}})."
    )
    var subscription: String?
    @Option(name: .customLong("vapid-key"), help: "Web Push: the VAPID key (PEM, EC P-256), instead of the app's.")
    var vapidKey: String?
    @Option(help: "Web Push: the VAPID subject (mailto: or https:), with --vapid-key.") var subject: String?
    @Option(help: "Web Push: the TTL header, seconds.") var ttl: Int64 = 60
    @Option(help: "Web Push: the Urgency header: low, normal or high.") var urgency = "normal"
}

/// `heraldctl push --provider webpush`: one message to one browser subscription, encrypted for it and signed with
/// the app's VAPID key, with the push service's answer as JSON.
extension Push {
    func pushWebPush() async throws {
        let token: String
        if let json = webPush.subscription {
            do {
                token = try RegistryOperations.webPushSubscription(try JSONValue.parse(Array(json.utf8))).token
            } catch let error as FieldError {
                throw ValidationError("--subscription: \(error.field): \(error.message)")
            } catch {
                throw ValidationError("--subscription: not JSON")
            }
        } else {
            token = try self.token()
        }
        guard let subscription = WebPushSubscription(token: token), subscription.problem == nil,
            let origin = subscription.origin
        else {
            throw ValidationError(
                "not a Web Push subscription: \(WebPushSubscription(token: token)?.problem ?? "<p256dh>.<auth>.<endpoint>")"
            )
        }
        let vapid: WebPushVAPID
        do {
            if let file = webPush.vapidKey {
                guard let subject = webPush.subject else { throw ValidationError("--vapid-key needs --subject") }
                vapid = try WebPushVAPID(pemFile: file, subject: subject)
            } else if let appConfig = try appConfig() {
                guard let settings = appConfig.webPush else {
                    throw ValidationError("app \(appConfig.appID) has no webpush section")
                }
                if let problem = appConfig.webPushProblem(Device(token: token, kind: .webpush)) {
                    throw ValidationError(problem)
                }
                vapid = try WebPushVAPID(pemFile: settings.vapidKeyFile, subject: settings.subject)
            } else {
                throw ValidationError("give --vapid-key FILE --subject S, or --pipeline/--app")
            }
        } catch let error as WebPushError {
            throw ValidationError(error.reason)
        }
        let urgencies = ["low": 1, "normal": 5, "high": 10]
        guard let priority = urgencies[webPush.urgency] else {
            throw ValidationError("--urgency must be low, normal or high")
        }
        let payload = try payload { body in
            .object([
                ("title", .string("Herald")), ("body", .string(body)), ("tag", .string("heraldctl")),
                ("data", .object([])),
            ])
        }
        guard payload.count <= WebPushCrypto.maxPlaintextBytes else {
            throw ValidationError("the message is \(payload.count) bytes; at most \(WebPushCrypto.maxPlaintextBytes)")
        }
        let endpoint = try hostOverride()
        let rendered = PushRequest(
            token: token, environment: .production, pushType: .alert, topic: origin, priority: priority,
            collapseID: collapseID.map(WebPushPayload.topic),
            expiration: Int64(Date().timeIntervalSince1970) + max(0, webPush.ttl), apnsID: "", payload: payload,
            provider: .webpush)
        let client: WebPushClient
        do {
            client = try WebPushClient(
                configuration: WebPushClientConfiguration(
                    origin: origin, vapid: vapid, endpoint: endpoint, trustedCAFile: caFile, maxInFlight: 1,
                    connectTimeout: .milliseconds(Int64(timeout * 1000)), retry: BackoffPolicy(maxAttempts: 1)))
        } catch { throw ValidationError(error.description) }
        let delivery: PushDelivery
        do {
            delivery = try WebPushClient.delivery(rendered, timeout: .milliseconds(Int64(timeout * 1000)))
        } catch { throw ValidationError(error.reason) }
        let response = await client.send(delivery)
        await client.shutdown(grace: .seconds(1))
        var object = Self.answer(response, provider: "webpush")
        object["origin"] = .string(origin)
        CLI.out(CLI.json(object))
        if !(200..<300).contains(response.status ?? 0) { throw ExitCode(1) }
    }
}
