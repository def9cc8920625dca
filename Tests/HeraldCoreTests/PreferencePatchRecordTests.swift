// The `patch_preferences` record's JSON form (what herald.registry carries and the Lua script reads).
import HeraldCore
import Testing

@Suite struct PreferencePatchRecordTests {
    @Test("a patch_preferences record survives its JSON form, field by field")
    func roundTrip() throws {
        var patch = PreferencePatch()
        patch.set.trigger = .off
        patch.set.dnd = DoNotDisturb(start: ClockTime("22:00")!, end: ClockTime("08:00")!, timezone: "Asia/Seoul")
        patch.set.snooze = Snooze(start: 1_700_000_000_000, end: 1_700_000_360_000)
        patch.set.languages = ["fr", "en"]
        patch.set.badge = false
        patch.clear = [.displayName]
        patch.conversations = ["c1": .init(muted: true), "c2": .init(trigger: .mentionOnly, muted: false)]
        patch.removeConversations = ["c3"]
        let record = RegistryRecord(op: .patchPreferences, appID: "app1", user: "u2", patch: patch)
        let bytes = StageCodec.encode(record)
        let back = try StageCodec.decode(RegistryRecord.self, from: bytes)
        #expect(back == record, "\(String(decoding: bytes, as: UTF8.self))")
        #expect(back.patch?.apply(to: Preferences()).trigger == .off)
    }

    @Test("an empty set leaves every field as stored")
    func emptySet() throws {
        var patch = PreferencePatch()
        patch.clear = [.snooze]
        let back = try StageCodec.decode(
            RegistryRecord.self,
            from: StageCodec.encode(
                RegistryRecord(op: .patchPreferences, appID: "a", user: "u", patch: patch)))
        #expect(back.patch == patch)
    }
}
