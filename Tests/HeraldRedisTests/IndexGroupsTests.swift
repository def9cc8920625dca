import Testing

@testable import HeraldRedis

@Suite struct IndexGroupsTests {
    @Test func groupsInFirstSeenOrderWithTheirPositionsInOrder() {
        var groups = IndexGroups<String>(capacity: 8)
        let b = groups.add(0, to: "b")
        groups.add(1, to: "a")
        groups.add(2, toGroup: b)  // the group's number, not its key
        groups.add(4, to: "c")  // positions need not be consecutive
        groups.add(5, to: "a")
        groups.add(7, to: "b")
        #expect(groups.keys == ["b", "a", "c"])
        #expect(groups.members().map(Array.init) == [[0, 2, 7], [1, 5], [4]])
    }

    @Test func noPositionsNoGroups() {
        let groups = IndexGroups<Int>(capacity: 0)
        #expect(groups.keys.isEmpty)
        #expect(groups.members().isEmpty)
    }
}
