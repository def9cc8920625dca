import CoreMetrics
import Foundation

/// The metric families of the APNs and FCM clients (herald-send only; no other stage builds a client): the names
/// `APNsMetrics` uses, declared once for docs/operations.md's table (checked by HeraldStageTests).
public enum ClientMetricFamilies {
    /// (name, type, meaning) per family, for `prefix` `herald_apns` or `herald_fcm`.
    public static func families(prefix: String) -> [(name: String, type: String, meaning: String)] {
        [
            (prefix + "_answers_total", "counter", "answers by `status` (`none` with the failure kind for transport failures) and `reason`"),
            (prefix + "_retries_total", "counter", "requests retried by the client"),
            (prefix + "_resends_total", "counter", "requests resent after a connection loss (not counted as attempts)"),
            (prefix + "_deadlines_exceeded_total", "counter", "requests that ran out of time"),
            (prefix + "_goaways_total", "counter", "GOAWAY frames received"),
            (prefix + "_connections_opened_total", "counter", "connections opened"),
            (prefix + "_connect_failures_total", "counter", "connection attempts that failed"),
            (prefix + "_ping_timeouts_total", "counter", "connections replaced after an unanswered PING"),
            (prefix + renewalsSuffix(prefix), "counter", prefix == "herald_apns" ? "provider JWTs renewed (about one per key every 50 minutes)" : "OAuth access tokens renewed"),
            (prefix + "_in_flight", "gauge", "requests in flight"),
            (prefix + "_connections", "gauge", "open connections"),
        ]
    }

    static func renewalsSuffix(_ prefix: String) -> String {
        prefix == "herald_apns" ? "_jwt_renewals_total" : "_token_renewals_total"
    }
}

/// The client's swift-metrics objects. Only the executables bootstrap a backend; without one
/// these are no-ops. Updated by the I/O thread once per loop pass, from counter deltas.
final class APNsMetrics {
    private let dimensions: [(String, String)]
    private var answers: [String: Counter] = [:]
    private let retries: Counter
    private let resends: Counter
    private let deadlines: Counter
    private let goaways: Counter
    private let connects: Counter
    private let connectFailures: Counter
    private let pingReplacements: Counter
    private let jwtRenewals: Counter
    private let inFlight: Gauge
    private let connections: Gauge
    private var last = APNsClientStats()
    private var lastRenewals = 0

    private let prefix: String

    /// `prefix` names the metrics: `herald_apns` for APNs clients, `herald_fcm` for FCM clients.
    init(dimensions: [(String, String)], prefix: String = "herald_apns") {
        self.dimensions = dimensions
        self.prefix = prefix
        retries = Counter(label: prefix + "_retries_total", dimensions: dimensions)
        resends = Counter(label: prefix + "_resends_total", dimensions: dimensions)
        deadlines = Counter(label: prefix + "_deadlines_exceeded_total", dimensions: dimensions)
        goaways = Counter(label: prefix + "_goaways_total", dimensions: dimensions)
        connects = Counter(label: prefix + "_connections_opened_total", dimensions: dimensions)
        connectFailures = Counter(label: prefix + "_connect_failures_total", dimensions: dimensions)
        pingReplacements = Counter(label: prefix + "_ping_timeouts_total", dimensions: dimensions)
        jwtRenewals = Counter(label: prefix + ClientMetricFamilies.renewalsSuffix(prefix), dimensions: dimensions)
        inFlight = Gauge(label: prefix + "_in_flight", dimensions: dimensions)
        connections = Gauge(label: prefix + "_connections", dimensions: dimensions)
    }

    /// `answerDeltas`: (status or "none", reason) -> answers since the last call.
    func publish(_ s: APNsClientStats, renewals: Int, answerDeltas: [AnswerKey: Int], inFlightNow: Int, openConnections: Int) {
        for (key, n) in answerDeltas where n > 0 {
            let name = key.status + "|" + key.reason
            let counter: Counter
            if let existing = answers[name] {
                counter = existing
            } else {
                counter = Counter(label: prefix + "_answers_total",
                                  dimensions: dimensions + [("status", key.status), ("reason", key.reason)])
                answers[name] = counter
            }
            counter.increment(by: n)
        }
        func delta(_ c: Counter, _ now: Int, _ before: Int) { if now > before { c.increment(by: now - before) } }
        delta(retries, s.retries, last.retries)
        delta(resends, s.resends, last.resends)
        delta(deadlines, s.deadlinesExceeded, last.deadlinesExceeded)
        delta(goaways, s.goawaysReceived, last.goawaysReceived)
        delta(connects, s.connectionsOpened, last.connectionsOpened)
        delta(connectFailures, s.connectFailures, last.connectFailures)
        delta(pingReplacements, s.connectionsReplacedAfterPing, last.connectionsReplacedAfterPing)
        delta(jwtRenewals, renewals, lastRenewals)
        inFlight.record(inFlightNow)
        connections.record(openConnections)
        last = s
        lastRenewals = renewals
    }
}

struct AnswerKey: Hashable {
    var status: String
    var reason: String
}
