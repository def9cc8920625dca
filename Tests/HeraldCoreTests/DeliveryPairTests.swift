import HeraldCore
import Testing

@Suite struct DeliveryPairTests {
    @Test func aPairIsItsEventAndToken() {
        let a = DeliveryPair(eventID: "e-1", token: String(repeating: "ab", count: 32), eventTime: 1_000)
        let sameWithoutTime = DeliveryPair(eventID: "e-1", token: String(repeating: "ab", count: 32))
        let otherToken = DeliveryPair(
            eventID: "e-1", token: String(repeating: "ab", count: 31) + "ac", eventTime: 1_000)
        let otherEvent = DeliveryPair(eventID: "e-2", token: String(repeating: "ab", count: 32), eventTime: 1_000)
        // The strings' boundary counts: ("ab", "c") is not ("a", "bc").
        #expect(DeliveryPair(eventID: "ab", token: "c") != DeliveryPair(eventID: "a", token: "bc"))
        #expect(a == sameWithoutTime)
        #expect(a.hashValue == sameWithoutTime.hashValue)
        #expect(a != otherToken)
        #expect(a != otherEvent)
        let set: Set = [a, sameWithoutTime, otherToken, otherEvent]
        #expect(set.count == 3)
        #expect(set.contains(DeliveryPair(eventID: "e-2", token: String(repeating: "ab", count: 32))))
        var table: [DeliveryPair: Int] = [a: 1]
        table[sameWithoutTime, default: 0] += 1
        #expect(table[a] == 2)
    }
}
