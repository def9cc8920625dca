// The fault suite's malformed-record generator: for each stage input topic, records made from a valid one (random
// bytes, truncated JSON, invalid UTF-8, tombstones, wrong types, duplicate keys, unknown apps, deep nesting, 800 KB
// texts), each distinct so that its dead letter can be matched to it.
import ArgumentParser
import Foundation
import HeraldBenchSupport
import HeraldCore

/// Malformed records for every stage input topic.
struct MalformedFlood {
    let workload: Workload
    let perTopic: Int
    let topics = [
        "chat.events", "herald.ingested", "herald.resolved", "herald.deliverable", "herald.outbound",
        "herald.retry", "herald.registry", "herald.token-feedback",
    ]

    struct Record { var kind: String; var value: [UInt8]? }

    /// A tombstone (no value) and an empty value are the same original in herald.dlq.
    static func hash(_ b: [UInt8]?) -> Int {
        let b = b ?? []
        var h: UInt64 = 0xCBF2_9CE4_8422_2325
        for x in b { h = (h ^ UInt64(x)) &* 0x100_0000_01B3 }
        return Int(truncatingIfNeeded: h ^ UInt64(b.count))
    }

    /// A valid record of the topic's type, as JSON (the template the malformed ones are made from).
    /// Throws when the pipeline file's app cannot render the bench's own event (a file the bench reads).
    func validTemplate(for topic: String) throws -> JSONValue {
        let event = workload.groupEvent(1, createdAt: nowMillis())
        let ev = try ChatEvent.decode(event.bytes)
        let user = workload.users[1]
        let state = workload.states[user] ?? UserState()
        let data: [UInt8]
        switch topic {
        case "chat.events": data = event.bytes
        case "herald.ingested": data = IngestedRecord(event: ev, ingestedAt: nowMillis()).jsonBytes()
        case "herald.resolved": data = ResolvedRecord(event: ev, recipient: user, state: state).jsonBytes()
        case "herald.deliverable":
            data = DeliverableRecord(event: ev, recipient: user, state: state, targets: state.devices).jsonBytes()
        case "herald.outbound", "herald.retry":
            let requests = try Renderer.render(
                event: ev, recipient: user, state: state, targets: state.devices, app: workload.app,
                now: Date())
            guard let req = requests.first else { throw ValidationError("the pipeline's app renders no request") }
            data = OutboundRecord(eventID: ev.eventID, appID: ev.appID, recipient: user, request: req).jsonBytes()
        case "herald.registry":
            data = RegistryRecord(
                op: .setMembers, appID: workload.appID, conversation: "mf-conv", members: ["a", "b"]
            ).jsonBytes()
        default:
            // A user outside the valid event's group: a feedback record Herald (rightly) applies must not take a
            // token that event needs.
            let other = workload.users[workload.users.count - 1]
            let token = workload.states[other]?.devices.first?.token ?? state.devices[0].token
            data = TokenFeedbackRecord(
                appID: workload.appID, user: other, token: token, reason: "Unregistered", deadSince: nowMillis()
            ).jsonBytes()
        }
        return (try? JSONValue.parse(data)) ?? .object([])
    }

    func records(for topic: String) throws -> [Record] {
        let template = try validTemplate(for: topic)
        let valid = Self.bytes(template)
        var rng = SystemRandomNumberGenerator()
        var out: [Record] = []
        // A few large ones, then the small kinds in turn.
        let deep =
            Array(repeating: UInt8(ascii: "["), count: 100_000) + Array(repeating: UInt8(ascii: "]"), count: 100_000)
        out.append(Record(kind: "deep_nesting", value: deep))
        out.append(
            Record(
                kind: "deep_nesting_object",
                value: Array("{\"a\":".utf8) + Array(repeating: UInt8(ascii: "["), count: 100_000)))
        var big = template
        setText(&big, String(repeating: "x", count: 800_000))
        setEventID(&big, "mf-big-\(topics.firstIndex(of: topic) ?? 0)")
        out.append(
            Record(
                kind: "text_800kb",
                value: Self.bytes(big)))
        let kinds = [
            "random_bytes", "truncated_json", "invalid_utf8", "tombstone", "wrong_types", "duplicate_keys",
            "unknown_app", "not_an_object",
        ]
        var i = 0
        while out.count < perTopic {
            let kind = kinds[i % kinds.count]
            i += 1
            var v: [UInt8]?
            switch kind {
            case "random_bytes":
                v = (0..<Int.random(in: 1...300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            case "truncated_json":
                v = Array(valid.prefix(max(1, valid.count * (1 + i % 9) / 10)))
            case "invalid_utf8":
                var t = template
                setText(&t, "PLACEHOLDER\(i)")
                var b = Self.bytes(t)
                if let r = find(Array("PLACEHOLDER".utf8), in: b) {
                    b.replaceSubrange(
                        r..<(r + 11), with: [0xC3, 0x28, 0xFF, 0xFE, 0x80, 0xBF, 0xED, 0xA0, 0x80, 0x41, 0x42])
                }
                v = b
            case "tombstone":
                v = nil
            case "wrong_types":
                // Each top-level member of another type: a string becomes a number, a number or a boolean an
                // object, anything else a string.
                let t = Self.replacing(in: template, depth: 1) { _, val in
                    switch val {
                    case .string: .number(String(i))
                    case .number, .bool: .object([("wrong", .string("\(i)"))])
                    default: .string("wrong-\(i)")
                    }
                }
                v = Self.bytes(t)
            case "duplicate_keys":
                // Every key twice: once with a wrong value, once as in the valid record.
                guard case .object(let members) = Self.sortedKeys(template), !members.isEmpty else {
                    v = Array("{\"a\":\(i),\"a\":\(i)}".utf8)
                    break
                }
                let pairs = members.map { k, val in
                    let key = JSONValue.string(k).serialized
                    return "\(key):\(i),\(key):\(val.serialized)"
                }
                v = Array(("{" + pairs.joined(separator: ",") + "}").utf8)
            case "unknown_app":
                var t = template
                setApp(&t, "no-such-app-\(i % 7)")
                v = Self.bytes(t)
            default:
                v = Array("[\(i), \"not an object\"]".utf8)
            }
            // Make every record distinct so DLQ entries can be matched one to one.
            if kind == "tombstone" { out.append(Record(kind: kind, value: nil)); continue }
            if kind == "unknown_app" {
                // Its own (event, token) pair: send would rightly skip a second copy of a pair in flight.
                var t = (try? JSONValue.parse(v ?? [])) ?? .object([])
                setEventID(&t, "mf-\(topic)-\(i)")
                v = Self.bytes(t)
            }
            if var b = v, kind == "random_bytes" || kind == "truncated_json" {
                b.append(contentsOf: Array(" \(i)".utf8)); v = b
            }
            out.append(Record(kind: kind, value: v))
        }
        return Array(out.prefix(perTopic))
    }

    private func find(_ n: [UInt8], in h: [UInt8]) -> Int? {
        guard h.count >= n.count else { return nil }
        for i in 0...(h.count - n.count) where h[i] == n[0] && Array(h[i..<(i + n.count)]) == n { return i }
        return nil
    }

    /// Sets every "text" (message text, or the payload body) found in the record; adds one when there is none.
    private func setText(_ o: inout JSONValue, _ text: String) {
        var found = false
        o = Self.replacing(in: o) { k, x in
            guard k == "text" || k == "payload", case .string = x else { return nil }
            found = true
            return .string(text)
        }
        if !found, case .object(var members) = o {
            members.append(("text", .string(text)))
            o = .object(members)
        }
    }

    /// Sets every `event_id` found in the record (the event's, the outbound record's).
    private func setEventID(_ o: inout JSONValue, _ id: String) {
        o = Self.replacing(in: o) { k, x in
            guard k == "event_id", case .string = x else { return nil }
            return .string(id)
        }
    }

    /// Sets every `app_id` found in the record.
    private func setApp(_ o: inout JSONValue, _ app: String) {
        o = Self.replacing(in: o) { k, _ in k == "app_id" ? .string(app) : nil }
    }

    /// `value` with each object member `transform` gives a new value for replaced; the others are searched further
    /// down, to `depth` levels of objects and arrays.
    private static func replacing(
        in value: JSONValue, depth: Int = .max, _ transform: (String, JSONValue) -> JSONValue?
    ) -> JSONValue {
        guard depth > 0 else { return value }
        switch value {
        case .object(let members):
            return .object(
                members.map { k, x in (k, transform(k, x) ?? replacing(in: x, depth: depth - 1, transform)) })
        case .array(let items):
            return .array(items.map { replacing(in: $0, depth: depth - 1, transform) })
        default:
            return value
        }
    }

    /// The record's bytes: compact JSON with every object's keys sorted.
    static func bytes(_ value: JSONValue) -> [UInt8] { Array(sortedKeys(value).serialized.utf8) }

    static func sortedKeys(_ value: JSONValue) -> JSONValue {
        switch value {
        case .object(let members): .object(members.map { ($0.0, sortedKeys($0.1)) }.sorted { $0.0 < $1.0 })
        case .array(let items): .array(items.map(sortedKeys))
        default: value
        }
    }
}
