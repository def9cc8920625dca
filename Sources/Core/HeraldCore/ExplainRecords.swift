// The explain trail's entries (`heraldctl explain`): what each stage decided and why.
// The stages produce them; HeraldRedis's ExplainStore keeps them.

/// One step of an event's explain trail: what a stage decided for the event, one recipient, or one device.
///
/// Kept compactly (docs/redis-keys.md, "The explain trail"): the entries that say why a user was not notified
/// (and, for what `FullTrailPolicy` selects, every entry) as one line each (`writeLine`) in an hourly log, and
/// each user's latest user-level entry. The subjects are the event (ingest's drop or resolve's fan-out), a user
/// (resolve / suppress / render) and a user's device (send's outcome; the latest attempt wins).
public struct ExplainEntry: Sendable, Hashable {
    public var appID: String
    public var eventID: String
    /// nil for an event-level entry.
    public var user: String?
    /// Set for a device-level (send) entry.
    public var token: String?
    /// ingest, resolve, suppress, render, send.
    public var stage: String
    /// Event level: `drop`, `fanned_out`, `classified` (ingest: reason `<class>:<rule>`); user level: `deliver`, `suppress`, `error`;
    /// device level: `delivered`, `duplicate`, `retry`, `token_dead`, `dlq`.
    public var decision: String
    /// Reason code of docs/behaviour.md §6 (suppress), APNs reason, or DLQ reason; nil when delivered (a `deliver`
    /// decision may carry `coalesced_update`, or `translation_failed:<code>` when the push goes out untranslated; a
    /// digest, §6d: `digest` when produced, `digest_expired` or `digest_no_devices` when dropped).
    public var reason: String?
    /// When the stage decided, epoch milliseconds.
    public var at: Int64
    /// HTTP status of the APNs answer (send).
    public var status: Int?
    /// The send attempt (send).
    public var attempt: Int?
    /// Devices targeted (suppress `deliver`) or recipients found (resolve `fanned_out`).
    public var count: Int?
    /// Set by the stage for an entry that is routine although its decision is not (the sender of a message to a
    /// conversation's members is never woken: nobody asks why). Not stored.
    public var routine = false

    public init(
        appID: String, eventID: String, user: String? = nil, token: String? = nil, stage: String,
        decision: String, reason: String? = nil, at: Int64, status: Int? = nil, attempt: Int? = nil,
        count: Int? = nil
    ) {
        self.appID = appID
        self.eventID = eventID
        self.user = user
        self.token = token
        self.stage = stage
        self.decision = decision
        self.reason = reason
        self.at = at
        self.status = status
        self.attempt = attempt
        self.count = count
    }

    /// The hash field this entry is stored under.
    public var field: String {
        if let token { return "device:\(user ?? ""):\(token)" }
        if let user { return "user:\(user)" }
        // Ingest's priority class sits next to the event-level step (resolve's fan-out or ingest's drop).
        if decision == "classified" { return "class" }
        return "event"
    }
}

extension ExplainEntry {
    /// The entry as JSON, keys sorted, written directly: every stage writes one per recipient or device, so this
    /// is on the hot path. `init(json:)` reads it back.
    public var jsonBytes: [UInt8] {
        var w = JSONWriter(capacity: 160)
        writeJSON(into: &w)
        return w.bytes
    }

    /// Appends `jsonBytes` to `w` (a writer reused across entries allocates nothing per entry).
    public func writeJSON(into w: inout JSONWriter) {
        w.raw("{\"app_id\":"); w.string(appID)
        w.raw(",\"at\":"); w.int(at)
        if let attempt { w.raw(",\"attempt\":"); w.int(attempt) }
        if let count { w.raw(",\"count\":"); w.int(count) }
        w.raw(",\"decision\":"); w.string(decision)
        w.raw(",\"event_id\":"); w.string(eventID)
        if let reason { w.raw(",\"reason\":"); w.string(reason) }
        w.raw(",\"stage\":"); w.string(stage)
        if let status { w.raw(",\"status\":"); w.int(status) }
        if let token { w.raw(",\"token\":"); w.string(token) }
        if let user { w.raw(",\"user\":"); w.string(user) }
        w.byte(UInt8(ascii: "}"))
    }

    /// Reads an entry as `jsonBytes` wrote it; the error names the offending field.
    public init(json bytes: some Collection<UInt8>) throws(StageRecordError) {
        let value: JSONValue
        do { value = try JSONValue.parse(bytes) } catch {
            throw StageRecordError(record: "ExplainEntry", detail: "(record): not valid JSON: \(error.description)")
        }
        let r = try RecordReader(value, path: "")
        guard let at = try r.int("at") else { throw r.fail("at", "missing") }
        self.init(
            appID: try r.requiredString("app_id"), eventID: try r.requiredString("event_id"),
            user: try r.string("user"), token: try r.string("token"), stage: try r.requiredString("stage"),
            decision: try r.requiredString("decision"), reason: try r.string("reason"), at: at,
            status: try r.int("status").map { Int($0) }, attempt: try r.int("attempt").map { Int($0) },
            count: try r.int("count").map { Int($0) })
    }
}

extension ExplainEntry {
    /// Whether the entry records what happens to most notifications: the event fanned out or classified, a
    /// recipient to be notified, a device that took the notification on its first attempt. The compact trail keeps
    /// only the other entries (why a user was not notified, or was only after a retry) unless `FullTrailPolicy`
    /// asks for everything; each user's latest decision is kept either way.
    public var isRoutine: Bool {
        if routine { return true }
        switch decision {
        case "fanned_out", "classified": return true
        // A push that went out untranslated because the translator failed (docs/behaviour.md §7a) is worth a line.
        case "deliver": return !(reason?.hasPrefix(Translation.failedReasonPrefix) ?? false)
        case "delivered": return (attempt ?? 1) <= 1
        default: return false
        }
    }

    /// The entry as one line of the compact trail, without the app (the key holds it): event, user, token,
    /// stage, decision, reason, at, status, attempt, count, separated by tabs, absent values empty, `\\`, tab
    /// and newline escaped, ending in a newline. The stage and the decision are written as their one-letter codes
    /// (`ExplainCodes`), and the empty fields after the last one with a value are left out (with their tabs).
    /// With `base` (the start of the hourly log the line goes to), `at` is written as the milliseconds since it:
    /// 7 digits instead of 13. `init(line:appID:base:)` reads it back. `omittingUser` leaves the user field empty,
    /// as for an entry without one (a last decision, keyed by its user).
    public func writeLine(into out: inout [UInt8], base: Int64? = nil, omittingUser: Bool = false) {
        func text(_ s: String?) {
            guard var s else { return }
            s.withUTF8 { bytes in
                // Most ids hold nothing to escape: then the bytes go in at once.
                if !bytes.contains(where: { $0 == UInt8(ascii: "\\") || $0 == 9 || $0 == 10 }) {
                    out.append(contentsOf: bytes)
                    return
                }
                for b in bytes {
                    switch b {
                    case UInt8(ascii: "\\"): out.append(b); out.append(b)
                    case 9: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "t"))
                    case 10: out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "n"))
                    default: out.append(b)
                    }
                }
            }
        }
        func number(_ n: Int64?) {
            guard let n else { return }
            DecimalASCII.append(n, to: &out)
        }
        text(eventID); out.append(9)
        text(omittingUser ? nil : user); out.append(9)
        text(token); out.append(9)
        func named(_ value: String, code: UInt8?) {
            if let code {
                out.append(code)
            } else if value.utf8.count == 1, let b = value.utf8.first, b != UInt8(ascii: "\\"), b != 9, b != 10 {
                // A one-letter value that is not a code is written escaped, so that it does not read as one.
                out.append(UInt8(ascii: "\\"))
                out.append(b)
            } else {
                text(value)
            }
            out.append(9)
        }
        named(stage, code: ExplainCodes.stageCode(stage))
        named(decision, code: ExplainCodes.decisionCode(decision))
        text(reason); out.append(9)
        number(at - (base ?? 0))
        // status, attempt, count: only up to the last one present.
        if status != nil || attempt != nil || count != nil {
            out.append(9); number(status.map(Int64.init))
            if attempt != nil || count != nil {
                out.append(9); number(attempt.map(Int64.init))
                if let count { out.append(9); number(Int64(count)) }
            }
        }
        out.append(10)
    }

    /// Reads one line as `writeLine` wrote it (with or without its newline), and lines of the earlier form too:
    /// stage and decision spelled out, all ten fields present. `base`: the start of the hourly log the line was
    /// read from; an `at` below it is relative to it (lines written with an absolute `at` read alike).
    public init(line: some Collection<UInt8>, appID: String, base: Int64? = nil) throws(StageRecordError) {
        var fields: [String?] = []
        // Stored bytes per field: a code is one unescaped byte.
        var storedLengths: [Int] = []
        var current: [UInt8] = []
        var stored = 0
        var escaped = false
        var ended = false
        func fail(_ detail: String) -> StageRecordError { StageRecordError(record: "ExplainEntry", detail: detail) }
        for b in line {
            if b != 9 && b != 10 || escaped { stored += 1 }
            if escaped {
                current.append(b == UInt8(ascii: "t") ? 9 : b == UInt8(ascii: "n") ? 10 : b)
                escaped = false
            } else if b == UInt8(ascii: "\\") {
                escaped = true
            } else if b == 9 || b == 10 {
                fields.append(current.isEmpty ? nil : String(decoding: current, as: UTF8.self))
                storedLengths.append(stored)
                stored = 0
                current.removeAll(keepingCapacity: true)
                if b == 10 {
                    ended = true
                    break
                }
            } else {
                current.append(b)
            }
        }
        if !ended { fields.append(current.isEmpty ? nil : String(decoding: current, as: UTF8.self)) }
        // Event to `at` are always written; status, attempt and count only up to the last one present.
        guard (7...10).contains(fields.count) else { throw fail("(line): \(fields.count) fields, expected 7 to 10") }
        while fields.count < 10 { fields.append(nil) }
        guard let event = fields[0], let stageText = fields[3], let decisionText = fields[4] else {
            throw fail("(line): event, stage or decision missing")
        }
        let stage = storedLengths[3] == 1 ? ExplainCodes.stage(stageText) : stageText
        let decision = storedLengths[4] == 1 ? ExplainCodes.decision(decisionText) : decisionText
        guard let atText = fields[6], var at = Int64(atText) else { throw fail("at: not a number") }
        if let base, at < base { at += base }
        func int(_ i: Int) throws(StageRecordError) -> Int? {
            guard let t = fields[i] else { return nil }
            guard let n = Int(t) else { throw fail("(line): field \(i + 1) is not a number") }
            return n
        }
        self.init(
            appID: appID, eventID: event, user: fields[1], token: fields[2], stage: stage, decision: decision,
            reason: fields[5], at: at, status: try int(7), attempt: try int(8), count: try int(9))
    }
}

/// The one-letter codes the compact trail stores for the stages and decisions it knows (docs/redis-keys.md). A
/// value without a code is stored as written, a one-letter one escaped (`\\x`), so that a field of one unescaped
/// byte is always a code. A code this build does not know reads as the letter itself.
public enum ExplainCodes {
    /// Stage name and its code.
    static let stages: [(String, UInt8)] = [
        ("suppress", UInt8(ascii: "s")), ("send", UInt8(ascii: "d")), ("resolve", UInt8(ascii: "r")),
        ("render", UInt8(ascii: "n")), ("ingest", UInt8(ascii: "i")), ("registry", UInt8(ascii: "g")),
    ]
    /// Decision name and its code.
    static let decisions: [(String, UInt8)] = [
        ("deliver", UInt8(ascii: "v")), ("suppress", UInt8(ascii: "s")), ("delivered", UInt8(ascii: "d")),
        ("retry", UInt8(ascii: "r")), ("duplicate", UInt8(ascii: "u")), ("token_dead", UInt8(ascii: "t")),
        ("dlq", UInt8(ascii: "q")), ("error", UInt8(ascii: "e")), ("drop", UInt8(ascii: "x")),
        ("fanned_out", UInt8(ascii: "f")), ("classified", UInt8(ascii: "c")), ("read_sync", UInt8(ascii: "y")),
    ]

    /// The code of a stage name, nil for a name without one.
    public static func stageCode(_ name: String) -> UInt8? { code(name, in: stages) }
    /// The code of a decision, nil for a decision without one.
    public static func decisionCode(_ name: String) -> UInt8? { code(name, in: decisions) }
    /// The stage a stored field names: a code's name, else the field as stored.
    public static func stage(_ stored: String) -> String { name(stored, in: stages) }
    /// The decision a stored field names: a code's name, else the field as stored.
    public static func decision(_ stored: String) -> String { name(stored, in: decisions) }

    private static func code(_ name: String, in table: [(String, UInt8)]) -> UInt8? {
        for (n, c) in table where n == name { return c }
        return nil
    }

    private static func name(_ stored: String, in table: [(String, UInt8)]) -> String {
        let bytes = stored.utf8
        guard bytes.count == 1, let b = bytes.first else { return stored }
        for (n, c) in table where c == b { return n }
        return stored
    }
}

/// Which entries the explain trail keeps in full, routine ones included (the pipeline file's
/// `explain.full_trail`): support's tool when a user says "I get nothing". Everything else keeps only the
/// entries that say why a user was not notified, and each user's latest decision.
public struct FullTrailPolicy: Sendable, Hashable {
    /// Users whose every entry (their decisions and their devices' outcomes) is kept.
    public var users: Set<String>
    /// Apps whose every entry is kept.
    public var apps: Set<String>
    /// Share of events (0 to 1) whose every entry is kept, picked by a hash of the event id so that every stage
    /// picks the same events.
    public var sample: Double

    public init(users: Set<String> = [], apps: Set<String> = [], sample: Double = 0) {
        self.users = users
        self.apps = apps
        self.sample = sample
    }

    /// Nothing beyond the compact trail.
    public var isEmpty: Bool { users.isEmpty && apps.isEmpty && sample <= 0 }

    /// Whether `entry` is kept although it is routine.
    public func wantsAll(_ entry: ExplainEntry) -> Bool {
        wantsAll(appID: entry.appID, eventID: entry.eventID, user: entry.user)
    }

    /// Whether an entry of event `eventID` in `appID` about `user` (nil: about the event) is kept although it is
    /// routine.
    public func wantsAll(appID: String, eventID: String, user: String?) -> Bool {
        if isEmpty { return false }
        if apps.contains(appID) { return true }
        if let user, users.contains(user) { return true }
        return sample > 0 && Self.share(eventID) < sample
    }

    /// Where an event id falls in [0, 1): FNV-1a 64 of its bytes, top 53 bits.
    static func share(_ eventID: String) -> Double {
        let hash = FNV1a.hash(eventID)
        return Double(hash >> 11) / Double(UInt64(1) << 53)
    }
}
