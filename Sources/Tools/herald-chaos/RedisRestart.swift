// The redis-restart scenario: Redis stopped for two seconds under load and started again with its data (an
// append-only file written with appendfsync always).
import Foundation
import Glibc
import HeraldBenchSupport

extension ChaosRunner {
    func restart(component: String) async throws -> ChaosOutcome {
        // The restarted Redis keeps its data (append-only file). The broker's faults are broker-down and leader-move:
        // herald-dev-broker keeps every log while one of its three brokers is down.
        let session = try open(redisAOF: component == "redis")
        defer { session.close(keep: options.stack.keep) }
        let rate = reduced ? 100.0 : 500.0
        let seconds = reduced ? 15.0 : 40.0
        let downFor = 2.0
        let driver = try await LoadDriver(session: session, workload: workload())
        let faults = FaultLog()
        startFault(at: 5, driver: driver, session: session) {
            guard let pid = session.info.pid(component) else { faults.note("no pid for \(component)"); return }
            kill(pid, SIGTERM)
            faults.add(.init(stage: component, action: "SIGTERM", at: nowMillis(), status: nil))
            Task.detached {
                for _ in 0..<200 where kill(pid, 0) == 0 { try? await Task.sleep(for: .milliseconds(50)) }
                if kill(pid, 0) == 0 { kill(pid, SIGKILL); faults.note("\(component) needed SIGKILL") }
                try? await Task.sleep(for: .seconds(downFor))
                do { try session.control.start(component) } catch {
                    faults.note("restart of \(component) failed: \(error)")
                }
                faults.add(.init(stage: component, action: "started", at: nowMillis(), status: nil))
            }
        }
        let r = try await driver.run(mode: .rate(rate, seconds), mixed: nil, drainTimeout: drainTimeout)
        let problems = faultProblems(faults, session)
        let storage = "Redis with appendfsync always"
        return outcome(
            r, extraProblems: problems,
            detail: "\(component) stopped at 5 s for \(Int(downFor)) s (\(storage)); \(r.expected) notifications")
    }
}
