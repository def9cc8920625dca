// Counters of the stand-in, kept by its loop thread and rendered as Prometheus text.

struct MockMetrics {
    /// Index 0: 200; then one slot per MockReason in declaration order.
    var answers = [UInt64](repeating: 0, count: MockReason.allCases.count + 1)
    var injected = [UInt64](repeating: 0, count: MockReason.allCases.count + 1)
    var connectionsAccepted: UInt64 = 0
    var connectionsOpen: Int = 0
    var connectionsCertificateAuth: UInt64 = 0
    var handshakeFailures: UInt64 = 0
    var streams: UInt64 = 0
    var refusedStreams: UInt64 = 0
    var streamsOverLimit: UInt64 = 0
    var streamLimitRaises: UInt64 = 0
    var streamLimitLowerings: UInt64 = 0
    var maxStreamsOverLimit = 0
    var goaways: UInt64 = 0
    var resets: UInt64 = 0
    var readBudgetSpent: UInt64 = 0
    var randomResets: UInt64 = 0
    var pauses: UInt64 = 0
    var paused = false
    var heldAnswers = 0
    var providerTokenVerifications: UInt64 = 0

    @inline(__always)
    static func slot(_ reason: MockReason?) -> Int {
        guard let reason else { return 0 }
        return reason.ordinal + 1
    }

    func render() -> String {
        var s = ""
        s.reserveCapacity(4096)
        s += "# HELP herald_mock_apns_requests_total Requests answered, by status and reason.\n"
        s += "# TYPE herald_mock_apns_requests_total counter\n"
        s += "herald_mock_apns_requests_total{status=\"200\",reason=\"\"} \(answers[0])\n"
        for r in MockReason.allCases where answers[r.ordinal + 1] > 0 {
            s +=
                "herald_mock_apns_requests_total{status=\"\(r.status)\",reason=\"\(r.rawValue)\"} \(answers[r.ordinal + 1])\n"
        }
        s += "# HELP herald_mock_apns_faults_injected_total Answers chosen by fault injection, by reason.\n"
        s += "# TYPE herald_mock_apns_faults_injected_total counter\n"
        for r in MockReason.allCases where injected[r.ordinal + 1] > 0 {
            s += "herald_mock_apns_faults_injected_total{reason=\"\(r.rawValue)\"} \(injected[r.ordinal + 1])\n"
        }
        func one(_ name: String, _ type: String, _ help: String, _ value: String) {
            s +=
                "# HELP herald_mock_apns_\(name) \(help)\n# TYPE herald_mock_apns_\(name) \(type)\nherald_mock_apns_\(name) \(value)\n"
        }
        one("connections_total", "counter", "TLS connections accepted.", "\(connectionsAccepted)")
        one("connections_open", "gauge", "Connections open now.", "\(connectionsOpen)")
        one(
            "connections_certificate_auth_total", "counter", "Connections with a verified client certificate.",
            "\(connectionsCertificateAuth)")
        one(
            "handshake_failures_total", "counter", "Connections closed during the TLS handshake or without ALPN h2.",
            "\(handshakeFailures)")
        one("streams_total", "counter", "Request streams opened by clients.", "\(streams)")
        one(
            "refused_streams_total", "counter",
            "Streams refused with RST_STREAM REFUSED_STREAM (above SETTINGS_MAX_CONCURRENT_STREAMS, or after a GOAWAY).",
            "\(refusedStreams)")
        one(
            "streams_over_limit_total", "counter",
            "Streams a client opened beyond the SETTINGS_MAX_CONCURRENT_STREAMS it had acknowledged (0 for a compliant client).",
            "\(streamsOverLimit)")
        one(
            "streams_over_limit_max", "gauge",
            "Highest number of open streams above the acknowledged limit seen on one connection.",
            "\(maxStreamsOverLimit)")
        one(
            "max_streams_raised_total", "counter",
            "SETTINGS frames raising a token-auth connection's SETTINGS_MAX_CONCURRENT_STREAMS (after a success).",
            "\(streamLimitRaises)")
        one(
            "max_streams_lowered_total", "counter",
            "SETTINGS frames lowering it back to --initial-streams (after a provider-token rejection).",
            "\(streamLimitLowerings)")
        one("goaways_total", "counter", "GOAWAY frames sent by --goaway-every.", "\(goaways)")
        one("resets_total", "counter", "Connections dropped by --reset-every.", "\(resets)")
        one(
            "read_budget_spent_total", "counter",
            "Loop passes in which a connection had more input than its share (64 KB): the rest waited for the next pass, after the other connections.",
            "\(readBudgetSpent)")
        one("random_resets_total", "counter", "Connections dropped by --rate-reset.", "\(randomResets)")
        one("pauses_total", "counter", "Pauses started (POST /pause or --pause-ms).", "\(pauses)")
        one("paused", "gauge", "1 while answers are held back by a pause.", paused ? "1" : "0")
        one("held_answers", "gauge", "Answers waiting for their time (--latency-ms or a pause).", "\(heldAnswers)")
        one(
            "provider_token_verifications_total", "counter", "ES256 signature verifications (cached per connection).",
            "\(providerTokenVerifications)")
        return s
    }
}

extension MockReason {
    /// Position in declaration order (a payload-free enum is stored as its case index).
    @inline(__always)
    var ordinal: Int { Int(withUnsafeBytes(of: self) { $0[0] }) }
}
