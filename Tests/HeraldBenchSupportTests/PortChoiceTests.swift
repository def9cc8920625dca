// The ports a benchmark or fault-suite stack is started on: every port the stack binds is apart from every other.
import Testing

@testable import HeraldBenchSupport

@Suite("Ports for a local stack")
struct PortChoiceTests {
    /// Every port scripts/local-stack.sh binds for this environment, once per binding.
    func boundPorts(_ env: [String: String], cluster: Bool) throws -> [Int] {
        func port(_ name: String) throws -> Int { try #require(env[name].flatMap { Int($0) }, "\(name)") }
        let base = try port("HERALD_LOCAL_METRICS_BASE")
        return StackControl.stackPorts(try port("HERALD_LOCAL_REDIS_PORT"), cluster: cluster)
            + [
                try port("HERALD_LOCAL_KAFKA_PORT"), try port("HERALD_LOCAL_APNS_PORT"),
                try port("HERALD_LOCAL_FCM_PORT"),
            ]
            + (1..<StackControl.metricsBlockSize).map { base + $0 }
    }

    @Test("no port is chosen twice, with one Redis or a cluster", arguments: [false, true])
    func chosenPortsAreDistinct(cluster: Bool) throws {
        for _ in 0..<1_000 {
            let ports = try boundPorts(
                StackControl.portEnvironment(redisCluster: cluster, given: [:]), cluster: cluster)
            #expect(Set(ports).count == ports.count, "ports chosen twice: \(ports)")
        }
    }

    @Test("ports given in the environment are kept, and the chosen ones stay clear of them")
    func givenPortsAreAvoided() throws {
        let given = ["HERALD_LOCAL_REDIS_PORT": "20000", "HERALD_LOCAL_KAFKA_PORT": "26000"]
        for _ in 0..<300 {
            let env = StackControl.portEnvironment(redisCluster: true, given: given)
            #expect(env["HERALD_LOCAL_REDIS_PORT"] == "20000")
            #expect(env["HERALD_LOCAL_KAFKA_PORT"] == "26000")
            let ports = try boundPorts(env, cluster: true)
            #expect(Set(ports).count == ports.count, "ports chosen twice: \(ports)")
        }
    }

    @Test("a metrics block keeps out of the ports it is told to avoid")
    func blockAvoidsTakenPorts() {
        // All but the top thousand of the range the block's base is drawn from.
        let avoiding = Set(20_001...31_000)
        for _ in 0..<50 {
            let base = freePortBlock(10, avoiding: avoiding)
            #expect((1..<10).allSatisfy { !avoiding.contains(base + $0) }, "block at \(base)")
        }
    }
}
