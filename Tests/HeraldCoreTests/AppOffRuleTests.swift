import Foundation
import HeraldCore
import Testing

@Suite("Push off per app (app_off)")
struct AppOffRuleTests {
    func app(push: Bool) -> AppConfig {
        var app = AppConfig(appID: "app1", credentials: sendbirdApp.credentials)
        app.push = push
        return app
    }

    @Test("an app that is off wakes nobody, forced or not; the sender is still `sender`")
    func rule() throws {
        let plain = try event(messageJSON(sender: "u1", recipients: ["u2"]))
        let forced = try event(
            messageJSON(sender: "u1", recipients: ["u2"], ext: #"{"em_force_notification":true}"#))
        for e in [plain, forced] {
            #expect(
                Suppression.decide(event: e, recipient: "u2", state: user(), app: app(push: false), now: now0)
                    == .suppress(.appOff))
            #expect(
                Suppression.decide(event: e, recipient: "u1", state: user(), app: app(push: false), now: now0)
                    == .suppress(.sender))
            #expect(
                Suppression.decide(event: e, recipient: "u2", state: user(), app: app(push: true), now: now0)
                    == .deliver(targets: [device()]))
        }
        #expect(SuppressionReason.appOff.rawValue == "app_off")
    }

    @Test("simulate shows app_off for every recipient of an app that is off")
    func simulate() throws {
        let e = try event(messageJSON(sender: "u1", recipients: ["u2", "u3"]))
        let fixture = StateFixture(users: ["u2": user(), "u3": user()])
        let out = try Simulator.simulate(
            eventBytes: e.jsonBytes, fixture: fixture,
            apps: AppDirectory(apps: ["app1": app(push: false)], listedOnly: true), at: nil, now: now0)
        #expect(out.map(\.reason) == ["app_off", "app_off"])
        #expect(out.allSatisfy { $0.notifications.isEmpty })
    }
}
