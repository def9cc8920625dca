import HeraldCore
import Testing

@Suite("AppConfig copies")
struct AppConfigCopyTests {
    @Test("changing a copy's policies leaves the original and other copies as they were")
    func copiesAreIndependent() {
        var original = AppConfig(appID: "app1", badge: false)
        let before = original
        var copy = original
        copy.counts = true
        copy.coalesce = CoalescePolicy(windowMilliseconds: 10_000)
        copy.floodGuard = FloodPolicy(perMinute: 3)
        copy.coalesce.updateMilliseconds = 2_000

        #expect(!original.counts && !original.coalesce.isOn && !original.floodGuard.isOn)
        #expect(copy.counts && copy.coalesce.windowMilliseconds == 10_000 && copy.floodGuard.perMinute == 3)
        #expect(copy.coalesce.updateMilliseconds == 2_000)
        #expect(copy.appID == "app1" && !copy.badge)

        original.readSync = ReadSyncPolicy(enabled: false)
        #expect(!original.readSync.enabled && before.readSync.enabled && copy.readSync.enabled)
        #expect(!before.counts && !before.coalesce.isOn)
    }

    @Test("a directory answers each app's own configuration, the fallback for the others")
    func directoryLookups() {
        var quiet = AppConfig(appID: "quiet")
        quiet.floodGuard = FloodPolicy(perMinute: 1)
        let directory = AppDirectory(apps: ["quiet": quiet], fallback: AppConfig(appID: "fallback"))
        var looked = directory.app("quiet")
        #expect(looked.appID == "quiet" && looked.floodGuard.perMinute == 1)
        looked.floodGuard = FloodPolicy()
        #expect(directory.app("quiet").floodGuard.perMinute == 1)
        #expect(directory.app("other").appID == "fallback")
    }
}
