import CoreMetrics
import Foundation

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

    init(dimensions: [(String, String)]) {
        self.dimensions = dimensions
        retries = Counter(label: "herald_apns_retries_total", dimensions: dimensions)
        resends = Counter(label: "herald_apns_resends_total", dimensions: dimensions)
        deadlines = Counter(label: "herald_apns_deadlines_exceeded_total", dimensions: dimensions)
        goaways = Counter(label: "herald_apns_goaways_total", dimensions: dimensions)
        connects = Counter(label: "herald_apns_connections_opened_total", dimensions: dimensions)
        connectFailures = Counter(label: "herald_apns_connect_failures_total", dimensions: dimensions)
        pingReplacements = Counter(label: "herald_apns_ping_timeouts_total", dimensions: dimensions)
        jwtRenewals = Counter(label: "herald_apns_jwt_renewals_total", dimensions: dimensions)
        inFlight = Gauge(label: "herald_apns_in_flight", dimensions: dimensions)
        connections = Gauge(label: "herald_apns_connections", dimensions: dimensions)
    }

    /// `answerDeltas`: (status or "none", reason) -> answers since the last call.
    func publish(_ s: APNsClientStats, renewals: Int, answerDeltas: [AnswerKey: Int], inFlightNow: Int, openConnections: Int) {
        for (key, n) in answerDeltas where n > 0 {
            let name = key.status + "|" + key.reason
            let counter: Counter
            if let existing = answers[name] {
                counter = existing
            } else {
                counter = Counter(label: "herald_apns_answers_total",
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
