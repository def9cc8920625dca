// herald-bench json: HeraldCore's JSON (JSON.swift, RecordCodec.swift) against Foundation's JSONDecoder and
// JSONEncoder on Herald's own records, so the choice of one JSON implementation (docs/architecture.md, "JSON")
// can be checked again on any machine and toolchain.
//
// Each record is taken from what the stages really handle (the `decide` benchmark's event and states). The
// Foundation side decodes into Codable mirrors of the same fields (defined below, only here) and encodes them
// with sorted keys; it does less than HeraldCore's side, which also validates (enum values, HH:mm times, UTF-8).

import ArgumentParser
import Foundation
import HeraldCore

struct JSONBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "json",
        abstract: "Measure HeraldCore's JSON against Foundation's JSONDecoder/JSONEncoder on Herald's records.")

    @Option(help: "Seconds of CPU time to measure each case (three runs, the best counts).")
    var seconds: Double = 0.6

    func run() throws {
        let event = try ChatEvent.decode(Array(Self.eventJSON.utf8))
        var prefs = Preferences(trigger: .mentionOnly, languages: ["fr", "en"])
        prefs.dnd = DoNotDisturb(start: ClockTime(hour: 22), end: ClockTime(hour: 8), timezone: "Europe/Paris")
        prefs.conversations["c-hiking"] = ConversationPreference(trigger: .all, muted: false)
        var state = UserState(preferences: prefs, unread: Unread(total: 7, conversations: ["c-hiking": 2]))
        for d in 0..<2 {
            state.register(
                Device(
                    token: String(repeating: String(format: "%02x", 17 + d), count: 32), kind: .apns,
                    bundleID: "com.example.chat", registeredAt: 1_731_000_000_000 + Int64(d)))
        }
        let device = state.devices[0]
        let deliverable = DeliverableRecord(event: event, recipient: "u1", state: state, targets: state.devices)
        let dlq = DLQRecord(
            original: StageCodec.encode(deliverable), maxOriginalBytes: 4096, sourceTopic: "herald.deliverable",
            sourcePartition: 3, sourceOffset: 9_007_199_254_740_993, stage: "render", reason: "render_error",
            detail: "template: unknown placeholder {x}", time: 1_732_000_000_123)
        let explain = ExplainEntry(
            appID: "bench", eventID: event.eventID, user: "u1", token: device.token, stage: "send",
            decision: "delivered", at: 1_732_000_000_456, status: 200, attempt: 1)

        let decoder = JSONDecoder()
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        var rows: [Row] = []

        // Redis: resolve reads every recipient's devices and preferences.
        let deviceBytes = device.jsonBytes()
        let deviceMirror = try decoder.decode(DeviceMirror.self, from: Data(deviceBytes))
        rows.append(
            Row(
                record: "device (Redis)", bytes: deviceBytes.count,
                coreDecode: measure { _ = try? Device.fromJSON(deviceBytes) },
                foundationDecode: measure { _ = try? decoder.decode(DeviceMirror.self, from: Data(deviceBytes)) },
                coreEncode: measure { _ = device.jsonBytes() },
                foundationEncode: measure { _ = try? encoder.encode(deviceMirror) }))
        let prefsBytes = prefs.jsonBytes()
        let prefsMirror = try decoder.decode(PreferencesMirror.self, from: Data(prefsBytes))
        rows.append(
            Row(
                record: "preferences (Redis)", bytes: prefsBytes.count,
                coreDecode: measure { _ = try? Preferences.fromJSON(prefsBytes) },
                foundationDecode: measure { _ = try? decoder.decode(PreferencesMirror.self, from: Data(prefsBytes)) },
                coreEncode: measure { _ = prefs.jsonBytes() },
                foundationEncode: measure { _ = try? encoder.encode(prefsMirror) }))
        // The explain trail: one entry per recipient and device.
        let explainBytes = explain.jsonBytes
        let explainMirror = try decoder.decode(ExplainMirror.self, from: Data(explainBytes))
        rows.append(
            Row(
                record: "explain entry", bytes: explainBytes.count,
                coreDecode: measure { _ = try? ExplainEntry(json: explainBytes) },
                foundationDecode: measure { _ = try? decoder.decode(ExplainMirror.self, from: Data(explainBytes)) },
                coreEncode: measure { _ = explain.jsonBytes },
                foundationEncode: measure { _ = try? encoder.encode(explainMirror) }))
        // The DLQ record (JSON on the wire; 64-bit offsets must survive).
        let dlqBytes = StageCodec.encode(dlq)
        let dlqMirror = try decoder.decode(DLQMirror.self, from: Data(dlqBytes))
        rows.append(
            Row(
                record: "DLQ record", bytes: dlqBytes.count,
                coreDecode: measure { _ = try? StageCodec.decode(DLQRecord.self, from: dlqBytes) },
                foundationDecode: measure { _ = try? decoder.decode(DLQMirror.self, from: Data(dlqBytes)) },
                coreEncode: measure { _ = StageCodec.encode(dlq) },
                foundationEncode: measure { _ = try? encoder.encode(dlqMirror) }))
        // A stage record's JSON form (event + state + targets) and the chat event as ingest reads it: no Codable
        // mirror here (dozens of fields), so the tree parse is compared (JSONValue against JSONSerialization).
        let deliverableJSON = deliverable.jsonBytes()
        rows.append(
            Row(
                record: "deliverable record, JSON form (tree parse)", bytes: deliverableJSON.count,
                coreDecode: measure { _ = try? JSONValue.parse(deliverableJSON) },
                foundationDecode: measure { _ = try? JSONSerialization.jsonObject(with: Data(deliverableJSON)) },
                coreEncode: nil, foundationEncode: nil))
        let eventBytes = Array(Self.eventJSON.utf8)
        rows.append(
            Row(
                record: "chat event (tree parse)", bytes: eventBytes.count,
                coreDecode: measure { _ = try? JSONValue.parse(eventBytes) },
                foundationDecode: measure { _ = try? JSONSerialization.jsonObject(with: Data(eventBytes)) },
                coreEncode: nil, foundationEncode: nil))

        print(
            "herald-bench json: on-CPU nanoseconds per record, one thread, best of 3 (lower is better); Foundation decodes into"
        )
        print("Codable mirrors of the same fields and encodes with sorted keys; HeraldCore also validates")
        print("")
        print(
            pad("record", 44) + pad("bytes", 7) + pad("decode core", 13) + pad("Foundation", 12) + pad("ratio", 8)
                + pad("encode core", 13) + pad("Foundation", 12) + "ratio")
        for row in rows {
            var line = pad(row.record, 44) + pad(String(row.bytes), 7)
            line +=
                pad(ns(row.coreDecode), 13) + pad(ns(row.foundationDecode), 12)
                + pad(ratio(row.foundationDecode, row.coreDecode), 8)
            if let ce = row.coreEncode, let fe = row.foundationEncode {
                line += pad(ns(ce), 13) + pad(ns(fe), 12) + ratio(fe, ce)
            } else {
                line += pad("-", 13) + pad("-", 12) + "-"
            }
            print(line)
        }
        print("")
        print("ratio: Foundation's time over HeraldCore's (above 1: HeraldCore is faster)")
    }

    struct Row {
        var record: String
        var bytes: Int
        var coreDecode: Double
        var foundationDecode: Double
        var coreEncode: Double?
        var foundationEncode: Double?
    }

    /// On-CPU nanoseconds of this thread per call of `body`: the best of three runs of `seconds / 3` each, after a
    /// short warm-up. CPU time rather than wall time, so other work on a shared machine does not count.
    func measure(_ body: () -> Void) -> Double {
        for _ in 0..<200 { body() }
        var best = Double.infinity
        for _ in 0..<3 {
            let start = threadCPUNanoseconds()
            let budget = seconds / 3 * 1e9
            var calls = 0
            while Double(threadCPUNanoseconds() - start) < budget {
                for _ in 0..<100 { body() }
                calls += 100
            }
            best = min(best, Double(threadCPUNanoseconds() - start) / Double(calls))
        }
        return best
    }

    func threadCPUNanoseconds() -> Int64 { HeraldBenchClock.threadCPUNanoseconds() }

    func ns(_ value: Double) -> String { String(format: "%.0f", value) }
    func ratio(_ foundation: Double, _ core: Double) -> String { String(format: "%.1fx", foundation / core) }
    func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
    }

    static let eventJSON = """
        {"event_id":"e-bench-1","app_id":"bench","kind":"message","created_at":1732000000000,
         "sender":{"id":"u0","name":"Cindy","profile_url":"https://cdn.example/u0.png"},
         "conversation":{"id":"c-hiking","type":"group","name":"Hiking","custom_type":""},
         "message":{"id":"373360335316321408","type":"text","text":"Are we still meeting at the trailhead at 7? Bring water 🥾",
           "mentions":["u3","u7"],"mention_type":"users","language":"en",
           "translations":{"fr":"On se retrouve toujours au départ du sentier à 7 h ? Apportez de l'eau 🥾",
                           "ko":"7시에 등산로 입구에서 만나는 거 맞죠? 물 챙기세요 🥾",
                           "zh":"我们还是7点在步道起点见面吗？带上水 🥾"}},
         "ext":{}}
        """
}

// MARK: Codable mirrors (Foundation's side of the comparison only)

private struct DeviceMirror: Codable {
    var token: String
    var kind: String?
    var environment: String?
    var bundleID: String?
    var registeredAt: Int64?
    var providerID: String?
    enum CodingKeys: String, CodingKey {
        case token, kind, environment, bundleID = "bundle_id", registeredAt = "registered_at", providerID =
            "provider_id"
    }
}

private struct PreferencesMirror: Codable {
    struct Conversation: Codable {
        var trigger: String?
        var muted: Bool?
    }
    struct DND: Codable {
        var start: String
        var end: String
        var timezone: String?
    }
    struct Snooze: Codable {
        var start: Int64
        var end: Int64
    }
    var trigger: String?
    var conversations: [String: Conversation]?
    var dnd: DND?
    var snooze: Snooze?
    var template: String?
    var displayStyle: String?
    var displayName: String?
    var languages: [String]?
    var badge: Bool?
    enum CodingKeys: String, CodingKey {
        case trigger, conversations, dnd, snooze, template, displayStyle = "display_style"
        case displayName = "display_name", languages, badge
    }
}

private struct ExplainMirror: Codable {
    var appID: String
    var eventID: String
    var user: String?
    var token: String?
    var stage: String
    var decision: String
    var reason: String?
    var at: Int64
    var status: Int?
    var attempt: Int?
    var count: Int?
    enum CodingKeys: String, CodingKey {
        case appID = "app_id", eventID = "event_id", user, token, stage, decision, reason, at, status, attempt, count
    }
}

private struct DLQMirror: Codable {
    var original: String
    var sourceTopic: String?
    var sourcePartition: Int32?
    var sourceOffset: Int64?
    var originalSize: Int?
    var originalSHA256: String?
    var truncated: Bool?
    var stage: String
    var reason: String
    var detail: String?
    var time: Int64?
    enum CodingKeys: String, CodingKey {
        case original, sourceTopic = "source_topic", sourcePartition = "source_partition", sourceOffset =
            "source_offset"
        case originalSize = "original_size", originalSHA256 = "original_sha256", truncated, stage, reason, detail, time
    }
}

/// On-CPU time of the calling thread (the micro benchmarks count it rather than wall time, so other work on a
/// shared machine does not count).
enum HeraldBenchClock {
    static func threadCPUNanoseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }
}
