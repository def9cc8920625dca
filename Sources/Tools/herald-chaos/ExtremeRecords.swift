// The `extreme-records` scenario: well-formed records carrying values at the edges (BoundaryValues, the list the
// property tests use) on chat.events and herald.registry, the crash reports' records among them (a chat event
// created at Int64.max to a conversation whose members have devices, a presence TTL of Int64.max, a read at
// Int64.max); then one valid event. Passes when every stage is the same process as before and the valid event is
// delivered.

import Foundation
import HeraldBenchSupport
import HeraldCore

extension ChaosRunner {
    func extremeRecords() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        let driver = try await LoadDriver(session: session, workload: workload(mix: false))
        driver.quiet = true
        let workload = driver.workload
        let pidsBefore = Dictionary(uniqueKeysWithValues: stageNames.map { ($0, session.info.pid($0)) })

        // Chat events to a conversation of the workload, from one member to another (each has a device), so a
        // value that passes ingest goes through every stage to send. Registry updates name a user of their own, so
        // the workload's users keep their devices and presence.
        let conversation = workload.conversations[0]
        let chat = BoundaryValues.chatEvents(
            app: workload.appID, conversation: conversation.id, sender: conversation.members[0],
            recipient: conversation.members[1], idPrefix: "edge-\(workload.options.tag)")
        let registry = BoundaryValues.registryRecords(app: workload.appID, user: "edge-\(workload.options.tag)")
        let publisher = driver.publisher
        log("publishing \(chat.count) boundary records on chat.events and \(registry.count) on herald.registry")
        for record in chat {
            await publisher.publish(topic: workload.topics.chatEvents, key: conversation.id, value: record.bytes)
        }
        for record in registry {
            await publisher.publish(topic: workload.topics.registry, key: "edge", value: record.bytes)
        }
        await publisher.flush()
        let unaccepted = publisher.unrecovered

        // One valid event after them.
        let valid = workload.groupEvent(0, createdAt: nowMillis())
        let publishedAt = nowMillis()
        await driver.publish(valid)
        await publisher.flush()

        var deliveredAt: Int64?
        var lastProgress = monotonicSeconds()
        var lastDLQ = -1.0
        while deliveredAt == nil || monotonicSeconds() - lastProgress < 3 {
            driver.step()
            if deliveredAt == nil, driver.ledger.delivered >= driver.ledger.expectedCount {
                deliveredAt = driver.ledger.lastDeliveryAt
            }
            let dlq = StageMetrics.scrape(session.info).sum("herald_dlq_total")
            if dlq != lastDLQ {
                lastDLQ = dlq
                lastProgress = monotonicSeconds()
            }
            if monotonicSeconds() - lastProgress > drainTimeout { break }
            try await Task.sleep(for: .milliseconds(250))
        }
        driver.step()

        let metrics = StageMetrics.scrape(session.info)
        let outOfRange = metrics.sum("herald_dlq_total", where: { $0["reason"] == InputRanges.reason })
        let invalid = metrics.sum("herald_dlq_total", where: { $0["reason"] == "invalid" })
        var problems: [String] = []
        var stagesKept = true
        if unaccepted > 0 { problems.append("\(unaccepted) boundary records not accepted by the broker") }
        for stage in stageNames {
            let now = session.info.pid(stage)
            if !session.info.isAlive(stage) {
                stagesKept = false
                problems.append("\(stage) is not running")
            } else if now != pidsBefore[stage] ?? nil {
                stagesKept = false
                problems.append(
                    "\(stage) was restarted (pid \(pidsBefore[stage].flatMap { $0 }.map(String.init) ?? "?") -> \(now.map(String.init) ?? "?"))"
                )
            }
        }
        if outOfRange == 0 { problems.append("no record was dead-lettered \(InputRanges.reason)") }
        let latency = deliveredAt.map { Double($0 - publishedAt) / 1000 }
        if latency == nil { problems.append("the valid event was not delivered") }
        let detail =
            "\(chat.count) chat events and \(registry.count) registry updates with boundary values; dead-lettered "
            + "\(Int(outOfRange)) \(InputRanges.reason), \(Int(invalid)) invalid"
            + (stagesKept ? "; every stage the same process" : "")
            + (latency.map { String(format: "; valid event after %.1f s", $0) } ?? "")
        let d = ([detail] + problems).joined(separator: "; ")
        return ChaosOutcome(
            scenario: scenario, passed: problems.isEmpty, lost: latency == nil ? 1 : 0, duplicated: 0,
            deadLettered: Int(outOfRange + invalid), detail: d)
    }
}
