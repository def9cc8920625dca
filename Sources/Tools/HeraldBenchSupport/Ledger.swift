// What was expected and what the APNs stand-in answered: the stand-in's record files
// (RUN/apns-record*.jsonl, one JSON line per answered request) are read as they grow; every
// 200 is matched by its apns-id (Herald derives it from event id and token) against the
// notifications the bench predicted when it published the events.
import Foundation
import Histogram

package enum NotificationKind: Int, CaseIterable {
    case group = 0, direct, call
    package var name: String { ["group", "direct", "call"][rawValue] }
}

package struct AnswerLine {
    package var apnsID: String
    package var status: Int
    package var at: Int64
}

/// Reads new complete lines from every record file in a run directory.
package final class RecordTail {
    package let run: String
    private var offsets: [String: UInt64] = [:]
    private var partial: [String: [UInt8]] = [:]

    package init(run: String) { self.run = run }

    package func files() -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: run)) ?? []
        return names.filter { $0.hasPrefix("apns-record") && $0.hasSuffix(".jsonl") }.sorted().map { run + "/" + $0 }
    }

    package func poll() -> [AnswerLine] {
        var out: [AnswerLine] = []
        for f in files() {
            guard let h = FileHandle(forReadingAtPath: f) else { continue }
            defer { try? h.close() }
            let off = offsets[f] ?? 0
            try? h.seek(toOffset: off)
            guard let data = try? h.readToEnd(), !data.isEmpty else { continue }
            offsets[f] = off + UInt64(data.count)
            var buf = partial[f] ?? []
            buf.append(contentsOf: data)
            var start = 0
            buf.withUnsafeBufferPointer { p in
                for i in 0..<p.count where p[i] == 0x0A {
                    if let a = Self.parse(UnsafeBufferPointer(rebasing: p[start..<i])) { out.append(a) }
                    start = i + 1
                }
            }
            partial[f] = Array(buf[start...])
        }
        return out
    }

    private static let apnsKey = Array("\"apns_id\":\"".utf8)
    private static let statusKey = Array(",\"status\":".utf8)
    private static let atKey = Array(",\"at\":".utf8)

    /// Field scan (faster than a JSON parse): `apns_id` is the first such key (token, topic and
    /// push type come before it); `status` and `at` are taken from the end, after the payload
    /// (a key inside the payload's strings would carry escaped quotes).
    package static func parse(_ line: UnsafeBufferPointer<UInt8>) -> AnswerLine? {
        guard let a = find(apnsKey, in: line, fromEnd: false), a + apnsKey.count + 36 <= line.count,
            let s = find(statusKey, in: line, fromEnd: true), let t = find(atKey, in: line, fromEnd: true)
        else { return nil }
        let id = String(
            decoding: UnsafeBufferPointer(rebasing: line[(a + apnsKey.count)..<(a + apnsKey.count + 36)]), as: UTF8.self
        )
        return AnswerLine(
            apnsID: id, status: Int(number(line, from: s + statusKey.count)), at: number(line, from: t + atKey.count))
    }

    private static func number(_ line: UnsafeBufferPointer<UInt8>, from: Int) -> Int64 {
        var v: Int64 = 0
        var i = from
        while i < line.count, line[i] >= 0x30, line[i] <= 0x39 { v = v * 10 + Int64(line[i] - 0x30); i += 1 }
        return v
    }

    private static func find(_ needle: [UInt8], in hay: UnsafeBufferPointer<UInt8>, fromEnd: Bool) -> Int? {
        guard hay.count >= needle.count else { return nil }
        let last = hay.count - needle.count
        var i = fromEnd ? last : 0
        while i >= 0 && i <= last {
            if hay[i] == needle[0] {
                var ok = true
                for j in 1..<needle.count where hay[i + j] != needle[j] { ok = false; break }
                if ok { return i }
            }
            i += fromEnd ? -1 : 1
        }
        return nil
    }
}

package struct Duplicate {
    package var apnsID: String
    package var firstAt: Int64
    package var againAt: Int64
}

/// Expected notifications, answers seen, and the latency histograms.
package final class Ledger {
    package struct Expected {
        package var createdAt: Int64
        package var kind: NotificationKind
        package var firstAt: Int64 = 0  // first 200, 0 = not yet
        package var count: Int = 0  // 200s seen
    }

    package private(set) var expected: [String: Expected] = [:]
    package private(set) var expectedCount = 0
    package private(set) var expectedByKind: [NotificationKind: Int] = [:]
    package private(set) var delivered = 0  // unique expected notifications with a 200
    package private(set) var duplicates: [Duplicate] = []
    package private(set) var unexpected200 = 0  // a 200 for an apns-id the bench did not predict
    package private(set) var answersByStatus: [Int: Int] = [:]
    package var overall = Histogram<UInt64>(highestTrackableValue: 3_600_000, numberOfSignificantValueDigits: .three)
    package var perKind: [NotificationKind: Histogram<UInt64>] = [:]
    /// Per second since `origin`: delivered count and latency histogram.
    package var perSecond: [Int: (count: Int, hist: Histogram<UInt64>)] = [:]
    package let origin: Int64
    package private(set) var lastDeliveryAt: Int64 = 0
    /// Notifications of events created before this (ms) count as delivered but stay out of the latency
    /// histograms (the stack's start-up: consumers still joining and making their first fetches).
    package var latencyFrom: Int64 = 0
    /// Notifications counted and checked but left out of the latency histograms (the first calls and DMs).
    package var unmeasured = Set<String>()
    package private(set) var deliveredByKind: [NotificationKind: Int] = [:]
    package private(set) var warmupDelivered = 0

    package init(origin: Int64) { self.origin = origin }

    package func expect(apnsID: String, createdAt: Int64, kind: NotificationKind) {
        if expected[apnsID] == nil { expectedCount += 1; expectedByKind[kind, default: 0] += 1 }
        expected[apnsID] = Expected(createdAt: createdAt, kind: kind)
    }

    package func ingest(_ lines: [AnswerLine]) {
        for a in lines {
            answersByStatus[a.status, default: 0] += 1
            guard a.status == 200 else { continue }
            guard var e = expected[a.apnsID] else { unexpected200 += 1; continue }
            e.count += 1
            if e.count == 1 {
                e.firstAt = a.at
                delivered += 1
                lastDeliveryAt = max(lastDeliveryAt, a.at)
                deliveredByKind[e.kind, default: 0] += 1
                if e.createdAt < latencyFrom || unmeasured.contains(a.apnsID) {
                    warmupDelivered += 1
                    expected[a.apnsID] = e
                    continue
                }
                let latency = UInt64(max(0, a.at - e.createdAt))
                _ = overall.record(latency)
                if perKind[e.kind] == nil {
                    perKind[e.kind] = Histogram<UInt64>(
                        highestTrackableValue: 3_600_000, numberOfSignificantValueDigits: .three)
                }
                _ = perKind[e.kind]!.record(latency)
                let sec = Int(max(0, a.at - origin) / 1000)
                if perSecond[sec] == nil {
                    perSecond[sec] = (
                        0, Histogram<UInt64>(highestTrackableValue: 3_600_000, numberOfSignificantValueDigits: .two)
                    )
                }
                perSecond[sec]!.count += 1
                _ = perSecond[sec]!.hist.record(latency)
            } else {
                duplicates.append(Duplicate(apnsID: a.apnsID, firstAt: e.firstAt, againAt: a.at))
            }
            expected[a.apnsID] = e
        }
    }

    package var lost: Int { expectedCount - delivered }
    package func delivered(_ kind: NotificationKind) -> Int { deliveredByKind[kind] ?? 0 }
    package var missing: [String] { expected.filter { $0.value.count == 0 }.map(\.key) }
}

package struct Percentiles: Codable {
    package var count: UInt64
    package var p50: UInt64
    package var p99: UInt64
    package var p999: UInt64
    package var max: UInt64

    package init(_ h: Histogram<UInt64>?) {
        guard let h, h.totalCount > 0 else { count = 0; p50 = 0; p99 = 0; p999 = 0; max = 0; return }
        count = h.totalCount
        p50 = h.valueAtPercentile(50)
        p99 = h.valueAtPercentile(99)
        p999 = h.valueAtPercentile(99.9)
        max = h.max
    }
}
