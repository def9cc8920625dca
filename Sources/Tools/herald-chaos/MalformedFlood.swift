// The malformed-flood scenario: malformed records of every kind on every stage input topic, each of which must reach
// herald.dlq with its original bytes, and a valid event after them that must be delivered.
import Foundation
import HeraldBenchSupport
import HeraldCore
import HeraldKafka

extension ChaosRunner {
    func malformedFlood() async throws -> ChaosOutcome {
        let session = try open()
        defer { session.close(keep: options.stack.keep) }
        let perTopic = reduced ? 300 : 10_000
        let driver = try await LoadDriver(session: session, workload: workload(mix: false))
        driver.quiet = true
        let flood = MalformedFlood(workload: driver.workload, perTopic: perTopic)
        let topics = flood.topics
        log("publishing \(perTopic) malformed records to each of \(topics.count) stage input topics")
        var sent: [String: [Int: Int]] = [:]  // topic -> hash of original -> count
        var kindsSent: [String: Int] = [:]
        var kindOf: [String: [Int: String]] = [:]  // topic -> hash -> kind
        var sentRecords: [String: [[UInt8]?]] = [:]  // the large ones, for truncated dead letters
        var truncatedMatched = 0
        let publisher = driver.publisher
        for topic in topics {
            for (i, rec) in try flood.records(for: topic).enumerated() {
                sent[topic, default: [:]][MalformedFlood.hash(rec.value), default: 0] += 1
                kindOf[topic, default: [:]][MalformedFlood.hash(rec.value)] = rec.kind
                if (rec.value?.count ?? 0) > 4096 { sentRecords[topic, default: []].append(rec.value) }
                kindsSent[rec.kind, default: 0] += 1
                await publisher.publish(topic: topic, key: "mf-\(i)", value: rec.value)
            }
        }
        await publisher.flush()
        // Like heraldctl's DLQ replay, a tool that writes to topics between stages rings their idle doorbells.
        let unrung = await session.info.ringDoorbells(topics)
        if !unrung.isEmpty { log("could not ring the idle doorbell of \(unrung.joined(separator: ", "))") }
        let floodUnrecovered = publisher.unrecovered
        // One valid event after the flood.
        let valid = driver.workload.groupEvent(0, createdAt: nowMillis())
        let publishedAt = nowMillis()
        await driver.publish(valid)
        await publisher.flush()
        var deliveredAt: Int64?
        let total = perTopic * topics.count
        // Wait for the valid event and for the DLQ to stop growing.
        var lastDLQ = -1.0, stableSince = monotonicSeconds()
        let deadline = monotonicSeconds() + (reduced ? 60 : 300)
        while monotonicSeconds() < deadline {
            driver.step()
            if deliveredAt == nil, driver.ledger.delivered >= driver.ledger.expectedCount {
                deliveredAt = driver.ledger.lastDeliveryAt
            }
            let m = StageMetrics.scrape(session.info)
            let dlq = m.sum("herald_dlq_total")
            if dlq != lastDLQ { lastDLQ = dlq; stableSince = monotonicSeconds() }
            if deliveredAt != nil && (Int(dlq) >= total || monotonicSeconds() - stableSince > 10) { break }
            if deliveredAt == nil && monotonicSeconds() - stableSince > drainTimeout { break }
            try await Task.sleep(for: .milliseconds(250))
        }
        try await Task.sleep(for: .seconds(2))
        driver.step()
        // Match herald.dlq entries to what was sent, by source topic and original bytes.
        var dlqMatched: [String: Int] = [:]
        var reasons: [String: Int] = [:]
        var withoutReason = 0
        var dlqTotal = 0
        var unmatchedByKind: [String: Int] = [:]
        var unmatchedDLQ: [String: Int] = [:]  // DLQ entries that are not one of ours: stage/reason
        var alteredOnTopic: [String: Int] = [:]  // entries citing a flooded topic whose original bytes match nothing sent
        do {
            let records = try await KafkaTopicReader.readAll(
                topic: "herald.dlq",
                configuration: KafkaClientConfiguration(brokers: [session.info.brokers]),
                timeout: .seconds(60))
            var remaining = sent
            // Truncated originals (a DLQ that cuts long originals, with `truncated`, `original_size`): matched by
            // their size and first bytes against what was sent to that topic.
            var sentBytes: [String: [[UInt8]?]] = [:]
            for (topic, list) in sentRecords { sentBytes[topic] = list }
            for rec in records {
                dlqTotal += 1
                // Read as JSON (not DLQRecord) so DLQ records with more fields decode the same.
                guard let v = rec.value, let d = try? JSONValue.parse(v), case .object = d else { continue }
                let stage = d["stage"]?.stringValue ?? "?"
                let reason = d["reason"]?.stringValue ?? ""
                if reason.isEmpty { withoutReason += 1 }
                reasons[reason, default: 0] += 1
                let topic = d["source_topic"]?.stringValue ?? "?"
                let original = d["original"]?.stringValue.flatMap { Data(base64Encoded: $0) }.map { Array($0) } ?? []
                var h = MalformedFlood.hash(original)
                if d["truncated"]?.boolValue == true, let size = d["original_size"]?.int64Value.map({ Int($0) }),
                    let whole = sentBytes[topic]?.first(where: {
                        ($0 ?? []).count == size && Array(($0 ?? []).prefix(original.count)) == original
                    })
                {
                    h = MalformedFlood.hash(whole)
                    truncatedMatched += 1
                }
                if let c = remaining[topic]?[h], c > 0 {
                    remaining[topic]![h] = c - 1
                    dlqMatched[topic, default: 0] += 1
                } else if sent[topic] != nil {
                    // A dead letter from the topic's own stage whose original is not byte for byte one we sent.
                    alteredOnTopic[topic, default: 0] += 1
                    unmatchedDLQ["\(stage)/\(reason)", default: 0] += 1
                } else {
                    unmatchedDLQ["\(stage)/\(reason)", default: 0] += 1
                }
            }
            for (topic, hashes) in remaining {
                for (h, c) in hashes where c > 0 { unmatchedByKind[kindOf[topic]?[h] ?? "?", default: 0] += c }
            }
        } catch {
            return ChaosOutcome(
                scenario: scenario, passed: false, lost: driver.ledger.lost, duplicated: driver.ledger.duplicates.count,
                deadLettered: -1, detail: "reading herald.dlq failed: \(error)")
        }
        let r = driver.makeResult(modeText: "malformed flood", mixed: false, driveSeconds: 0)
        var problems: [String] = []
        if floodUnrecovered > 0 { problems.append("\(floodUnrecovered) malformed records not accepted by the broker") }
        let dead = stagesAlive(session)
        if !dead.isEmpty { problems.append("stages not running: \(dead.joined(separator: ", "))") }
        let missingPerTopic = topics.compactMap { t -> String? in
            let m = perTopic - (dlqMatched[t] ?? 0)
            return m > 0 ? "\(t) \(m)" : nil
        }
        let altered = alteredOnTopic.values.reduce(0, +)
        if altered > 0 {
            problems.append(
                "\(altered) DLQ entries cite a flooded topic but do not hold a sent record's original bytes ("
                    + alteredOnTopic.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
                    + ")")
        }
        if !missingPerTopic.isEmpty {
            problems.append(
                "not found in herald.dlq with their original bytes: " + missingPerTopic.joined(separator: ", ")
                    + " (by kind: "
                    + unmatchedByKind.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
                    + ")")
        }
        // Informational: dead letters of later stages (a malformed record got past the stage of its topic).
        let downstream =
            unmatchedDLQ.isEmpty
            ? ""
            : "; other DLQ entries (stage/reason): "
                + unmatchedDLQ.sorted { $0.value > $1.value }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        if withoutReason > 0 { problems.append("\(withoutReason) DLQ entries without a reason") }
        let latency = deliveredAt.map { Double($0 - publishedAt) / 1000 }
        if let latency {
            if let limit = options.validEventDeadline, latency > limit {
                problems.append(String(format: "valid event delivered after %.1f s (limit %.0f s)", latency, limit))
            }
        } else {
            problems.append("the valid event was not delivered")
        }
        var o = outcome(
            r, extraProblems: problems,
            detail:
                "\(total) malformed records on \(topics.count) topics, \(dlqMatched.values.reduce(0, +)) matched in herald.dlq (\(dlqTotal) entries"
                + (truncatedMatched > 0 ? ", \(truncatedMatched) of them with a truncated original" : "")
                + "); reasons: "
                + reasons.sorted { $0.value > $1.value }.prefix(6).map { "\($0.key) \($0.value)" }.joined(
                    separator: ", ")
                + (latency.map { String(format: "; valid event after %.1f s", $0) } ?? "") + downstream)
        o.deadLettered = dlqMatched.values.reduce(0, +)
        return o
    }
}
