// The explain trail's entries (`heraldctl explain`): what each stage decided and why.
// The stages produce them; HeraldRedis's ExplainStore keeps them.

/// One step of an event's explain trail: what a stage decided for the event, one recipient, or one device.
///
/// Stored as JSON (snake_case) in the hash `herald:<app>:explain:{<event id>}`, one field per subject:
/// `event` (ingest's drop or resolve's fan-out), `user:<user>` (resolve / suppress / render), and
/// `device:<user>:<token>` (send's outcome for one device; the latest attempt wins).
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
    /// Reason code of docs/behaviour.md §6 (suppress), APNs reason, or DLQ reason; nil when delivered.
    public var reason: String?
    /// When the stage decided, epoch milliseconds.
    public var at: Int64
    /// HTTP status of the APNs answer (send).
    public var status: Int?
    /// The send attempt (send).
    public var attempt: Int?
    /// Devices targeted (suppress `deliver`) or recipients found (resolve `fanned_out`).
    public var count: Int?

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
