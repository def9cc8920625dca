// The broker-down and leader-move scenarios: one of the local cluster's three brokers fails and comes back, and
// partition leadership moves between brokers, under load (herald-dev-broker's control API, scripts/dev-broker.sh).
import Foundation
import Glibc
import HeraldBenchSupport

extension ChaosRunner {
    /// The topics the local stack creates with four partitions (scripts/local-stack.sh), whose leaders move.
    static let movedTopics = [
        "chat.events", "herald.ingested", "herald.resolved", "herald.deliverable", "herald.outbound", "herald.retry",
        "herald.ingested.priority", "herald.resolved.priority", "herald.deliverable.priority",
        "herald.outbound.priority", "herald.retry.priority",
    ]

    /// Runs `scripts/dev-broker.sh ARGS` against the stack's broker; false (with a note) when it failed.
    func devBroker(_ session: BenchSession, _ args: [String], faults: FaultLog) -> Bool {
        let port = String(session.info.kafkaPort)
        do {
            let rc = try spawnAndWait(
                ["/bin/bash", session.repo + "/scripts/dev-broker.sh", args[0], port] + args.dropFirst(),
                environment: ProcessInfo.processInfo.environment, quiet: true)
            if rc != 0 { faults.note("dev-broker.sh \(args.joined(separator: " ")) exited \(rc)") }
            return rc == 0
        } catch {
            faults.note("dev-broker.sh \(args.joined(separator: " ")) failed: \(error)")
            return false
        }
    }

    /// Broker 2 of 3 goes down at 5 s, as a failed broker does: the partitions it leads and the groups it
    /// coordinates move to the other two (what a controller does), its connections drop; it comes back `downFor`
    /// seconds later. The cluster keeps every partition's log, as replicas would, so nothing acknowledged is lost.
    func brokerDown() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        guard session.info.broker == "dev" else { throw BenchError("broker-down needs herald-dev-broker") }
        let rate = reduced ? 150.0 : 250.0
        let seconds = reduced ? 20.0 : 40.0
        let downFor = reduced ? 5.0 : 10.0
        let driver = try await LoadDriver(session: session, workload: workload())
        let faults = FaultLog()
        startFault(at: 5, driver: driver, session: session) {
            // Blocking script calls on a thread of their own, off Swift's cooperative pool.
            Thread.detachNewThread {
                guard devBroker(session, ["down", "2"], faults: faults) else { return }
                faults.add(.init(stage: "kafka-2", action: "down", at: nowMillis(), status: nil))
                usleep(UInt32(downFor * 1_000_000))
                if devBroker(session, ["up", "2"], faults: faults) {
                    faults.add(.init(stage: "kafka-2", action: "up", at: nowMillis(), status: nil))
                }
            }
        }
        let r = try await driver.run(mode: .rate(rate, seconds), mixed: nil, drainTimeout: 30)
        var problems = faultProblems(faults, session)
        if faults.all.count < 2 { problems.append("broker 2 was not taken down and brought back") }
        return outcome(
            r, extraProblems: problems,
            detail:
                "broker 2 of 3 down at 5 s for \(Int(downFor)) s, its leaderships and groups moved; \(r.expected) notifications; latency p99 \(r.overall.p99) ms"
        )
    }

    /// Every `spacing` seconds the leader of every partition of the topics between the stages (and chat.events)
    /// moves to the next broker, as a preferred-leader election or a reassignment does: producers and consumers
    /// follow the leadership (NOT_LEADER answers, metadata refresh) without losing or repeating anything.
    func leaderMove() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        guard session.info.broker == "dev" else { throw BenchError("leader-move needs herald-dev-broker") }
        let rate = reduced ? 150.0 : 250.0
        let seconds = reduced ? 20.0 : 40.0
        let spacing = reduced ? 4.0 : 5.0
        let driver = try await LoadDriver(session: session, workload: workload())
        let faults = FaultLog()
        var next = 4.0
        var round = 0
        driver.onTick = { t in
            guard t >= next, t < seconds - 2 else { return }
            next += spacing
            round += 1
            let target = round % 3 + 1
            Thread.detachNewThread {
                var moved = 0
                for topic in Self.movedTopics {
                    for partition in 0..<4 {
                        let leader = (target + partition) % 3 + 1
                        let args = ["leader", topic, String(partition), String(leader)]
                        if devBroker(session, args, faults: faults) { moved += 1 }
                    }
                }
                faults.add(.init(stage: "leaders", action: "moved \(moved)", at: nowMillis(), status: nil))
            }
        }
        let r = try await driver.run(mode: .rate(rate, seconds), mixed: nil, drainTimeout: 30)
        var problems = faultProblems(faults, session)
        let rounds = faults.all.count
        if rounds == 0 { problems.append("no leadership was moved") }
        return outcome(
            r, extraProblems: problems,
            detail:
                "\(rounds) rounds, each moving the leaders of \(Self.movedTopics.count * 4) partitions; \(r.expected) notifications; latency p99 \(r.overall.p99) ms"
        )
    }
}
