import Foundation
import HeraldConfig
import HeraldCore
import HeraldMockAPNs
import HeraldPipeline
import Testing

// Tokens are never removed for Herald's own guess (docs/providers.md, "Dead tokens"): render sends a device to the
// bundle id and environment it was registered with, else to those of the APNs credential its provider id names,
// else to guesses it marks; send removes a token only when APNs says it is dead for what the device was registered
// with, and tries a guessed environment once on the other first. APNs is played by the stand-in's request checks,
// one per environment, with the tokens it issued.

/// Answers each job as the APNs stand-in of the job's environment does.
final class StandInTransport: PushTransport, @unchecked Sendable {
    private let lock = NSLock()
    let checks: [APNsEnvironment: RequestCheck]
    private var seen: [(String, APNsEnvironment)] = []

    init(_ registered: [String: MockTokenRegistration]) {
        checks = [
            .production: RequestCheck(topics: [], deadTokens: [:], registered: registered, environment: .production),
            .sandbox: RequestCheck(topics: [], deadTokens: [:], registered: registered, environment: .sandbox),
        ]
    }

    /// (topic, environment) of every request sent, in order.
    var sent: [(String, APNsEnvironment)] { lock.withLock { seen } }

    func send(_ jobs: [PushJob], onAnswer: @escaping @Sendable (Int, PushAnswer) -> Void) async {
        for (index, job) in jobs.enumerated() {
            let r = job.request
            lock.withLock { seen.append((r.topic, r.environment)) }
            var head = RequestHead()
            head.set(.method, "POST")
            head.set(.path, "/3/device/" + r.token)
            head.set(.topic, r.topic)
            head.set(.pushType, r.pushType.rawValue)
            head.set(.priority, String(r.priority))
            let verdict = r.payload.withUnsafeBytes { body in
                checks[r.environment]!.check(
                    head: head, body: body, bodyLength: body.count, certificateAuth: false, nowMillis: 1_000
                ) { _ in nil }
            }
            onAnswer(
                index,
                .answered(
                    status: verdict.status, reason: verdict.reason.map { APNsReason(wire: $0.rawValue) },
                    timestamp: verdict.timestamp))
        }
    }
}

@Suite struct GuessedRouteTests {
    static let chat = "com.example.chat"
    static let beta = "com.example.chat.beta"

    /// An app with two bundles: the first credential's (production), and a beta one devices name by provider id.
    func app() throws -> AppConfig {
        let yaml = """
            apps:
              app1:
                credentials:
                  - {bundle_id: com.example.chat, environment: production, team_id: T, key_id: K, key_file: /k.p8}
                  - {bundle_id: com.example.chat, environment: sandbox, team_id: T, key_id: K, key_file: /k.p8}
                  - {bundle_id: com.example.chat.beta, environment: sandbox, team_id: T, key_id: K, key_file: /k.p8, provider_id: apns-beta}
            """
        return try PipelineLoader.load(yaml: yaml).config.apps.app("app1")
    }

    /// Renders one message to `device` and sends it through `transport`, feeding retries back, until nothing is
    /// left: what was delivered, the tokens reported dead, and the dead letters.
    func deliver(
        _ device: Device, _ transport: StandInTransport
    ) async throws -> (
        delivered: Int, dead: [String], deadLetters: [String]
    ) {
        let event = try ChatEvent.decode(try exampleBytes("event-group.json"))
        let requests = try Renderer.render(
            event: event, recipient: "u2", state: UserState(devices: [device]), targets: [device], app: try app(),
            now: fixedNow)
        var inputs = requests.map {
            StageInput(
                topic: "herald.outbound",
                value: StageCodec.encode(
                    OutboundRecord(eventID: event.eventID, appID: "app1", recipient: "u2", request: $0)))
        }
        let send = sendProcessor(ScriptedTransport([:]), MemoryLedger())
        var processor = send
        processor.transport = transport
        var delivered = 0
        var dead: [String] = []
        var deadLetters: [String] = []
        var rounds = 0
        while !inputs.isEmpty {
            rounds += 1
            try #require(rounds <= 4, "retries never end")
            let results = await processor.process(inputs, context: fixedContext)
            inputs = []
            for result in results {
                if let letter = result.deadLetter { deadLetters.append(letter.reason) }
                if result.notes.contains(.apnsAnswer(status: 200, reason: "")) { delivered += 1 }
                for output in result.outputs {
                    if output.topic == "herald.token-feedback" {
                        dead.append(try StageCodec.decode(TokenFeedbackRecord.self, from: output.value).reason)
                    } else {
                        inputs.append(StageInput(topic: output.topic, value: output.value))
                    }
                }
            }
        }
        return (delivered, dead, deadLetters)
    }

    let token = String(repeating: "5a", count: 32)

    @Test func aProviderIdNamesTheAPNsCredentialItsBundleAndEnvironment() async throws {
        let transport = StandInTransport([token: MockTokenRegistration(bundleID: Self.beta, environment: .sandbox)])
        let device = Device(token: token, providerID: "apns-beta")
        let out = try await deliver(device, transport)
        #expect(out.delivered == 1 && out.dead.isEmpty && out.deadLetters.isEmpty)
        #expect(transport.sent.map(\.0) == [Self.beta] && transport.sent.map(\.1) == [.sandbox])
    }

    @Test func aGuessedEnvironmentIsTriedOnceOnTheOtherAndTheTokenKept() async throws {
        // A sandbox token registered without an environment: production answers BadDeviceToken, sandbox delivers.
        let transport = StandInTransport([token: MockTokenRegistration(bundleID: Self.chat, environment: .sandbox)])
        let out = try await deliver(Device(token: token, bundleID: Self.chat), transport)
        #expect(out.delivered == 1 && out.dead.isEmpty && out.deadLetters.isEmpty)
        #expect(transport.sent.map(\.1) == [.production, .sandbox])
    }

    @Test func aTokenBadOnBothEnvironmentsIsDead() async throws {
        // Issued for no environment Herald can reach with it: BadDeviceToken on production, then on sandbox.
        let odd = token + "0"
        let transport = StandInTransport([:])
        let out = try await deliver(Device(token: odd, bundleID: Self.chat), transport)
        #expect(out.dead == ["BadDeviceToken"] && out.delivered == 0)
        #expect(transport.sent.map(\.1) == [.production, .sandbox])
    }

    @Test func aNamedEnvironmentIsTakenAtItsWord() async throws {
        // Registered as production but issued for sandbox: APNs says it is bad for what it was registered with.
        let transport = StandInTransport([token: MockTokenRegistration(bundleID: Self.chat, environment: .sandbox)])
        let out = try await deliver(
            Device(token: token, environment: .production, bundleID: Self.chat), transport)
        #expect(out.dead == ["BadDeviceToken"] && out.delivered == 0)
        #expect(transport.sent.map(\.1) == [.production])
    }

    @Test func aGuessedTopicNeverKillsTheToken() async throws {
        // A beta token registered with neither bundle id nor provider id: the first credential's topic is a guess.
        let transport = StandInTransport([token: MockTokenRegistration(bundleID: Self.beta, environment: .production)])
        let out = try await deliver(Device(token: token, environment: .production), transport)
        #expect(out.dead.isEmpty && out.delivered == 0)
        #expect(out.deadLetters == ["DeviceTokenNotForTopic"])
        // Registered with the bundle id it was not issued for: that answer is the token's.
        let named = try await deliver(Device(token: token, environment: .production, bundleID: Self.chat), transport)
        #expect(named.dead == ["DeviceTokenNotForTopic"])
    }

    @Test func whatRenderGuessedRidesInTheOutboundRecord() throws {
        let app = try app()
        #expect(app.apnsRoute(Device(token: token)).guesses == [.environment, .topic])
        #expect(app.apnsRoute(Device(token: token, environment: .sandbox)).guesses == [.topic])
        #expect(app.apnsRoute(Device(token: token, bundleID: Self.chat)).guesses == [.environment])
        let named = app.apnsRoute(Device(token: token, providerID: "apns-beta"))
        #expect(named.guesses.isEmpty && named.bundleID == Self.beta && named.environment == .sandbox)
        let request = PushRequest(
            token: token, environment: .production, pushType: .alert, topic: Self.chat, priority: 10,
            collapseID: nil, expiration: 0, apnsID: "a", payload: Array("{}".utf8),
            guesses: [.environment, .otherEnvironment])
        let record = OutboundRecord(eventID: "e", appID: "app1", recipient: "u2", request: request)
        #expect(try StageCodec.decode(OutboundRecord.self, from: StageCodec.encode(record)) == record)
        #expect(try StageCodec.decode(OutboundRecord.self, from: record.jsonBytes()) == record)
    }
}
