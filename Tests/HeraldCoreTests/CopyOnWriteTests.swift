import HeraldCore
import Testing

@Suite("Records kept behind one reference")
struct CopyOnWriteTests {
    @Test("a field set or changed in place on a copy leaves the original as it was, and both compare by value")
    func copiesAreValues() throws {
        let original = try event(messageJSON())
        var assigned = original
        assigned.eventID = "e2"  // the setter
        var appended = original
        appended.recipients = ["u1"]
        appended.recipients?.append("u2")  // in place, through `_modify`
        #expect(original.eventID == "e1" && original.recipients == nil)
        #expect(assigned.eventID == "e2" && assigned.appID == original.appID)
        #expect(appended.recipients == ["u1", "u2"] && appended.eventID == "e1")
        #expect(assigned != original && appended != original)
        var back = assigned
        back.eventID = "e1"
        #expect(back == original && back.hashValue == original.hashValue)

        var state = UserState(devices: [device(tokenA)])
        let before = state
        var shared = state
        shared.online = [tokenA]
        state.devices.append(device(tokenB))
        #expect(before.online.isEmpty && before.devices.count == 1)
        #expect(shared.online == [tokenA] && shared.devices.count == 1)
        #expect(state.devices.count == 2 && state.online.isEmpty)

        // A value held only once is changed where it is, many times over.
        var unique = UserState()
        for n in 0..<100 { unique.unread.total = n }
        #expect(unique.unread.total == 99)
    }
}
