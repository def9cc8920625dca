// End to end, translations by the app's translator (docs/behaviour.md §7a): herald-mock-fcm's /translate stands in for
// LibreTranslate. A reader of French gets the stand-in's French in the APNs payload; when the translator refuses (a
// wrong API key: 403), the push goes out with the original text and `heraldctl explain` says why. Runs in the shared
// "End to end" suite.
import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

extension EndToEndTests {
    /// `herald_translations_total{outcome}` on suppress's /metrics.
    func translations(_ outcome: String) -> Int {
        guard let port = stack.stagePorts["suppress"], let text = httpBody(port: port, path: "/metrics") else {
            return 0
        }
        let prefix = #"herald_translations_total{stage="suppress",outcome="\#(outcome)"} "#
        for line in text.split(separator: "\n") where line.hasPrefix(prefix) {
            return Int(Double(line.dropFirst(prefix.count)) ?? 0)
        }
        return 0
    }

    @Test(
        "a French reader gets the translator's French in the APNs payload; a refused translation sends the original text and explain says why"
    )
    func translatedPush() async throws {
        let readers = [(app: "app9", user: "tr-fr", token: tok(951)), (app: "app10", user: "tr-x", token: tok(952))]
        for r in readers {
            var result = try await stack.heraldctl([
                "device", "register", "--app", r.app, "--user", r.user, "--token", r.token, "--bundle-id",
                "com.example.chat",
            ])
            #expect(result.status == 0, "device register: \(result.stderr)")
            result = try await stack.heraldctl([
                "prefs", "set", "--app", r.app, "--user", r.user, "--languages", "fr,de",
            ])
            #expect(result.status == 0, "prefs set: \(result.stderr)")
        }
        let translatedBefore = translations("translated"), failedBefore = translations("failed")
        let events = readers.map { r in
            Scenarios.message(
                Scenarios.id("translate-\(r.app)"), app: r.app, sender: "tr-s",
                conversation: Scenarios.id("tr-\(r.app)"),
                type: "direct", text: "Good night", recipients: [r.user], language: "en", createdAt: Self.now())
        }
        try await stack.publish(events)
        func body(_ token: String) -> String? {
            guard let r = stack.recorded().first(where: { $0.token == token && $0.status == 200 }) else { return nil }
            return (aps(r)["alert"] as? [String: Any])?["body"] as? String
        }
        let arrived = await eventually(timeout: .seconds(90), interval: .milliseconds(200)) {
            readers.allSatisfy { body($0.token) != nil }
        }
        #expect(arrived, "the pushes did not arrive\n\(failureContext())")
        #expect(body(tok(951)) == "Cindy: Bonne nuit", "app9's push: \(body(tok(951)) ?? "none")")
        #expect(body(tok(952)) == "Cindy: Good night", "app10's push: \(body(tok(952)) ?? "none")")
        // The stand-in was asked once per event, with LibreTranslate's request: app9's answered, app10's refused.
        let asked = stack.recordedProviders().filter { $0["endpoint"] as? String == "translate" }
        let statuses = asked.compactMap { $0["status"] as? Int }
        #expect(statuses.filter { $0 == 200 }.count == 1 && statuses.filter { $0 == 403 }.count == 1, "\(asked)")
        if let request = asked.first(where: { $0["status"] as? Int == 200 })?["body"] as? String {
            let fields = try JSONSerialization.jsonObject(with: Data(request.utf8)) as? [String: String]
            #expect(fields?["q"] == "Good night" && fields?["source"] == "en" && fields?["target"] == "fr")
        }
        // explain: app9's reader was delivered as usual; app10's reader was delivered untranslated, and why.
        var line: [String: Any] = [:]
        let explained = await eventually(timeout: .seconds(60), interval: .milliseconds(200)) {
            let r = try? await stack.heraldctl([
                "explain", "--app", "app10", "--event", Scenarios.id("translate-app10"), "--user", "tr-x",
            ])
            line = r?.lines.first ?? [:]
            return line["reason"] as? String == "translation_failed:http_403"
        }
        #expect(explained, "explain for app10's reader: \(line)\n\(stack.explainDiagnostics())")
        #expect(line["decision"] as? String == "deliver" && line["stage"] as? String == "suppress")
        let trail = try await stack.heraldctl(["explain", "--app", "app10", "--event", Scenarios.id("translate-app10")])
        #expect(
            trail.lines.contains { $0["reason"] as? String == "translation_failed:http_403" },
            "the compact trail keeps the untranslated delivery: \(trail.stdout)")
        // The counter counts both, on suppress's /metrics.
        let counted = await eventually(timeout: .seconds(10), interval: .milliseconds(200)) {
            translations("translated") > translatedBefore && translations("failed") > failedBefore
        }
        #expect(
            counted,
            "herald_translations_total: translated \(translations("translated")), failed \(translations("failed"))")
    }
}
