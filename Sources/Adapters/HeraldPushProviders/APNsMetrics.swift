import CoreMetrics
import Foundation

/// The metric families of the APNs and FCM clients (herald-send only; no other stage builds a client), declared
/// once: `APNsMetrics` names its objects from this list, and docs/operations.md's table is checked against it
/// (HeraldStageTests).
public enum ClientMetricFamilies {
    public enum Family: CaseIterable, Sendable {
        case answers, retries, resends, deadlines, goaways, connectionsOpened, connectFailures, pingTimeouts
        case renewals, inFlight, connections

        /// The metric's name under `prefix` (`herald_apns` or `herald_fcm`).
        public func name(prefix: String) -> String {
            switch self {
            case .answers: prefix + "_answers_total"
            case .retries: prefix + "_retries_total"
            case .resends: prefix + "_resends_total"
            case .deadlines: prefix + "_deadlines_exceeded_total"
            case .goaways: prefix + "_goaways_total"
            case .connectionsOpened: prefix + "_connections_opened_total"
            case .connectFailures: prefix + "_connect_failures_total"
            case .pingTimeouts: prefix + "_ping_timeouts_total"
            case .renewals: prefix + (prefix == "herald_apns" ? "_jwt_renewals_total" : "_token_renewals_total")
            case .inFlight: prefix + "_in_flight"
            case .connections: prefix + "_connections"
            }
        }

        public var type: String { self == .inFlight || self == .connections ? "gauge" : "counter" }

        public func meaning(prefix: String) -> String {
            switch self {
            case .answers: "answers by `status` (`none` with the failure kind for transport failures) and `reason`"
            case .retries: "requests retried by the client"
            case .resends: "requests resent after a connection loss (not counted as attempts)"
            case .deadlines: "requests that ran out of time"
            case .goaways: "GOAWAY frames received"
            case .connectionsOpened: "connections opened"
            case .connectFailures: "connection attempts that failed"
            case .pingTimeouts: "connections replaced after an unanswered PING"
            case .renewals:
                prefix == "herald_apns"
                    ? "provider JWTs renewed (about one per key every 50 minutes)"
                    : prefix == "herald_webpush"
                        ? "VAPID tokens signed (about one per push service every 6 hours)"
                        : "OAuth access tokens renewed"
            case .inFlight: "requests in flight"
            case .connections: "open connections"
            }
        }
    }

    /// (name, type, meaning) per family, for `prefix` `herald_apns` or `herald_fcm`.
    public static func families(prefix: String) -> [(name: String, type: String, meaning: String)] {
        Family.allCases.map { ($0.name(prefix: prefix), $0.type, $0.meaning(prefix: prefix)) }
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
    private var last = PushClientStats()
    private var lastRenewals = 0

    private let prefix: String

    /// `prefix` names the metrics: `herald_apns` for APNs clients, `herald_fcm` for FCM clients.
    init(dimensions: [(String, String)], prefix: String = "herald_apns") {
        self.dimensions = dimensions
        self.prefix = prefix
        typealias Family = ClientMetricFamilies.Family
        retries = Counter(label: Family.retries.name(prefix: prefix), dimensions: dimensions)
        resends = Counter(label: Family.resends.name(prefix: prefix), dimensions: dimensions)
        deadlines = Counter(label: Family.deadlines.name(prefix: prefix), dimensions: dimensions)
        goaways = Counter(label: Family.goaways.name(prefix: prefix), dimensions: dimensions)
        connects = Counter(label: Family.connectionsOpened.name(prefix: prefix), dimensions: dimensions)
        connectFailures = Counter(label: Family.connectFailures.name(prefix: prefix), dimensions: dimensions)
        pingReplacements = Counter(label: Family.pingTimeouts.name(prefix: prefix), dimensions: dimensions)
        jwtRenewals = Counter(label: Family.renewals.name(prefix: prefix), dimensions: dimensions)
        inFlight = Gauge(label: Family.inFlight.name(prefix: prefix), dimensions: dimensions)
        connections = Gauge(label: Family.connections.name(prefix: prefix), dimensions: dimensions)
    }

    /// `answerDeltas`: (status or "none", reason) -> answers since the last call.
    func publish(
        _ s: PushClientStats, renewals: Int, answerDeltas: [AnswerKey: Int], inFlightNow: Int, openConnections: Int
    ) {
        for (key, n) in answerDeltas where n > 0 {
            let name = key.status + "|" + key.reason
            let counter: Counter
            if let existing = answers[name] {
                counter = existing
            } else {
                counter = Counter(
                    label: ClientMetricFamilies.Family.answers.name(prefix: prefix),
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
