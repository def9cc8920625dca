import ArgumentParser
import Foundation
import HeraldConfig
import HeraldCore
import HeraldHTTP
import HeraldPushProviders
import HeraldToolSupport

/// `heraldctl push --provider fcm|webhook`: one message to one FCM token or one webhook POST, with the
/// provider's answer as JSON; and what every provider's push shares (the app, the message, `--host`, the answer).
extension Push {
    /// The app `--pipeline` and `--app` name; nil without `--pipeline`.
    func appConfig() throws -> AppConfig? {
        guard let pipeline else { return nil }
        guard let app else { throw ValidationError("--pipeline needs --app") }
        let loaded: LoadedPipeline
        do throws(ConfigError) {
            loaded = try PipelineLoader.load(path: pipeline)
        } catch { throw ValidationError(error.description) }
        guard let appConfig = loaded.config.apps.apps[app] else {
            throw ValidationError("no app \(app) in \(pipeline)")
        }
        return appConfig
    }

    func pushFCM() async throws {
        let deviceToken = try token()
        var accountFile = serviceAccount
        if accountFile == nil, let appConfig = try appConfig() {
            guard let credential = appConfig.fcmCredential(providerID) else {
                throw ValidationError("app \(appConfig.appID) has no FCM credential \(providerID ?? "")")
            }
            accountFile = credential.serviceAccountFile
        }
        guard let accountFile else { throw ValidationError("give --service-account FILE or --pipeline/--app") }
        let account: FCMServiceAccount
        do { account = try FCMServiceAccount.load(path: accountFile) } catch {
            throw ValidationError(error.description)
        }
        let endpoint = try hostOverride()
        let payload = try payload { body in
            .object([
                (
                    "message",
                    .object([
                        ("notification", .object([("body", .string(body))])), ("token", .string(deviceToken)),
                    ])
                )
            ])
        }
        let client: FCMClient
        do {
            client = try FCMClient(
                configuration: FCMClientConfiguration(
                    account: account, endpoint: endpoint, trustedCAFile: caFile, connections: 1, maxInFlight: 1,
                    connectTimeout: .milliseconds(Int64(timeout * 1000)), retry: BackoffPolicy(maxAttempts: 1)))
        } catch { throw ValidationError(error.description) }
        let request = PushDelivery(
            deviceToken: deviceToken, topic: account.projectID, payload: payload,
            timeout: .milliseconds(Int64(timeout * 1000)))
        let response = await client.send(request)
        let tokenFailure = client.tokens.lastFailure
        await client.shutdown(grace: .seconds(1))
        var object = Self.answer(response, provider: "fcm")
        object["project"] = .string(account.projectID)
        if let tokenFailure { object["token_endpoint"] = .string(tokenFailure) }
        CLI.out(CLI.json(object))
        if response.status != 200 { throw ExitCode(1) }
    }

    func pushWebhook() async throws {
        let deviceToken = try token()
        var endpoint: WebhookEndpoint?
        var region = "us"
        if let url {
            endpoint = WebhookEndpoint(
                url: url, username: user,
                password: password ?? ProcessInfo.processInfo.environment["HERALD_WEBHOOK_PASSWORD"])
        } else if let appConfig = try appConfig() {
            guard let hook = appConfig.webhook(providerID) else {
                throw ValidationError("app \(appConfig.appID) has no webhook \(providerID ?? "")")
            }
            region = hook.region
            switch WebhookEndpoint.resolve(hook) {
            case .success(let e): endpoint = e
            case .failure(let error): throw ValidationError(error.message)
            }
        }
        guard let endpoint else { throw ValidationError("give --url or --pipeline/--app") }
        let payload = try payload { body in
            // CometChat's webhook body, its keys in sorted order.
            .object([
                ("appId", .string(app ?? "heraldctl")),
                (
                    "data",
                    .object([
                        (
                            "notificationDetails",
                            .object([
                                ("body", .string(body)), ("title", .string("Herald")),
                                ("type", .string("chat")),
                            ])
                        ),
                        ("to", .object([("uid", .string(deviceToken))])),
                    ])
                ),
                ("region", .string(region)), ("trigger", .string("push-notification-payload-generated")),
                ("webhook", .string("custom")),
            ])
        }
        let client: WebhookClient
        do {
            client = try WebhookClient(
                configuration: HTTP1ClientConfiguration(trustedCAFile: caFile, maxInFlight: 1),
                timeout: .milliseconds(Int64(min(timeout, 2) * 1000)))
        } catch { throw ValidationError("\(error)") }
        let rendered = PushRequest(
            token: deviceToken, environment: .production, pushType: .alert, topic: providerID ?? "",
            priority: 10, collapseID: nil, expiration: 0, apnsID: "", payload: payload,
            provider: .webhook, providerID: providerID)
        let outcome = await client.send(client.request(rendered, to: endpoint))
        await client.shutdown()
        var object: [String: JSONValue] = [
            "provider": .string("webhook"), "status": .int(outcome.status), "reason": .string(outcome.reasonText),
            "answer": .string("\(outcome.answer)"),
        ]
        if let f = outcome.failure { object["transport_failure"] = .string(f.description) }
        CLI.out(CLI.json(object))
        if outcome.answer != .delivered { throw ExitCode(1) }
    }

    /// The message to send: the bytes of `--payload-file`, or what `build` makes of `--body`.
    func payload(fromBody build: (String) -> JSONValue) throws -> [UInt8] {
        switch (payloadFile, body) {
        case (let file?, nil):
            guard let data = FileManager.default.contents(atPath: file) else {
                throw ValidationError("cannot read --payload-file \(file)")
            }
            return [UInt8](data)
        case (nil, let text?):
            return Array(build(text).serialized.utf8)
        default:
            throw ValidationError("give exactly one of --payload-file or --body")
        }
    }

    /// `--host HOST:PORT` (or `[v6]:PORT`; port 443 when none is given); nil without `--host`.
    func hostOverride() throws -> ServiceEndpoint? {
        guard let host else { return nil }
        guard let endpoint = ServiceEndpoint(parsing: host) else { throw ValidationError("--host must be host:port") }
        return endpoint
    }

    /// An HTTP/2 provider's answer (FCM, Web Push) as heraldctl prints it.
    static func answer(_ response: PushResponse, provider: String) -> [String: JSONValue] {
        var object: [String: JSONValue] = [
            "provider": .string(provider), "status": .int(response.status), "reason": .text(response.reasonText),
            "attempts": .int(response.attempts), "disposition": .string(dispositionText(response.disposition)),
        ]
        if let f = response.transportFailure { object["transport_failure"] = .string(f.description) }
        return object
    }

    /// `--device-token`, which every provider but Web Push (given `--subscription`) needs.
    func token() throws -> String {
        guard let deviceToken, !deviceToken.isEmpty else { throw ValidationError("--device-token is required") }
        return deviceToken
    }
}
