// Everything herald-mock-apns can be told, with its defaults.

/// A provider signing key the stand-in accepts JWTs from.
public struct MockProviderKey: Sendable, Equatable {
    /// The JWT header's `kid`.
    public var keyID: String
    /// The JWT claim `iss` must equal this.
    public var teamID: String
    /// PEM file holding the P-256 public key (a public key, a certificate or the .p8 private key).
    public var publicKeyPath: String

    public init(keyID: String, teamID: String, publicKeyPath: String) {
        self.keyID = keyID
        self.teamID = teamID
        self.publicKeyPath = publicKeyPath
    }

    /// Parses `KEYID:TEAMID:PUBKEY.pem`.
    public init?(argument: String) {
        let parts = argument.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty, !parts[2].isEmpty else { return nil }
        self.init(keyID: String(parts[0]), teamID: String(parts[1]), publicKeyPath: String(parts[2]))
    }
}

/// Rates in [0, 1] at which valid requests are answered with an injected failure instead of 200.
public struct MockFaultRates: Sendable, Equatable {
    public var tooManyRequests: Double = 0  // 429 TooManyRequests
    public var internalServerError: Double = 0  // 500 InternalServerError
    public var serviceUnavailable: Double = 0  // 503 ServiceUnavailable
    public var unregistered: Double = 0  // 410 Unregistered, timestamp = now
    public var badDeviceToken: Double = 0  // 400 BadDeviceToken

    public init() {}

    public var total: Double {
        tooManyRequests + internalServerError + serviceUnavailable + unregistered + badDeviceToken
    }
}

public struct MockAPNsConfiguration: Sendable {
    /// Address to listen on.
    public var host: String = "127.0.0.1"
    /// TCP port; 0 picks a free one.
    public var port: Int = 0
    /// PEM server certificate (chain) and its private key.
    public var certificatePath: String
    public var privateKeyPath: String
    /// When set, clients may present a certificate signed by this CA (certificate auth): such
    /// connections need no JWT and start at `maxConcurrentStreams`.
    public var clientCAPath: String? = nil
    /// Keys JWTs are verified against. Empty: token auth is not checked.
    public var providerKeys: [MockProviderKey] = []
    /// Accepted bundle ids (`<bundle>.voip` etc. follow from them). Empty: any topic passes.
    public var topics: [String] = []
    /// Tokens answered with 410 Unregistered; the value is the timestamp (millis) or nil for "now".
    public var deadTokens: [String: Int64?] = [:]
    /// The APNs environment this stand-in plays (production: api.push.apple.com; sandbox: its development host).
    public var environment: MockEnvironment = .production
    /// Tokens with the bundle id and environment they were issued for: a request for another environment is
    /// answered `BadDeviceToken`, one for another topic `DeviceTokenNotForTopic`. Tokens not listed pass.
    public var registeredTokens: [String: MockTokenRegistration] = [:]
    /// Seed of the fault injector and of generated apns-ids.
    public var seed: UInt64 = 1
    public var faults = MockFaultRates()
    /// Each answer is sent this many milliseconds after the request completed.
    public var latencyMilliseconds: Int = 0
    /// After this many streams on a connection: GOAWAY(NO_ERROR, last = that stream). 0 = never.
    public var goawayEvery: Int = 0
    /// After this many streams on a connection: drop the TCP connection (RST). 0 = never.
    public var resetEvery: Int = 0
    /// Probability in [0, 1] that a new stream drops its TCP connection (RST) instead of being
    /// served (a seeded draw of its own, independent of the answer faults). 0 = never.
    public var resetRate: Double = 0
    /// Pause answering for this long from start-up (milliseconds, 0 = not paused). A running
    /// stand-in is paused and resumed through its metrics port: `POST /pause?ms=N`, `POST /resume`.
    public var initialPauseMilliseconds: Int = 0
    /// Fault injection: on token-auth connections, every Nth otherwise valid request (counted over
    /// all such connections) is answered 403 InvalidProviderToken. 0 = never.
    public var rejectTokenEvery: Int = 0
    /// SETTINGS_MAX_CONCURRENT_STREAMS of a token-auth connection after a success (and from the
    /// start with a client cert).
    public var maxConcurrentStreams: Int = 1000
    /// SETTINGS_MAX_CONCURRENT_STREAMS a token-auth connection starts with (APNs: 1), and is
    /// lowered back to after a provider-token rejection (403 Invalid/Expired/MissingProviderToken,
    /// 429 TooManyProviderTokenUpdates) until its next success.
    public var initialConcurrentStreams: Int = 1
    /// JSON-lines file of answered requests.
    public var recordPath: String? = nil
    /// Cleartext HTTP/1.1 port serving GET /metrics; nil = none, 0 = any free port.
    public var metricsPort: Int? = nil
    /// Provider tokens older than this are answered 403 ExpiredProviderToken.
    public var providerTokenMaxAgeSeconds: Int64 = 3600
    /// When above 0: a valid token of a key whose `iat` is newer than the key's current token by
    /// less than this is answered 429 TooManyProviderTokenUpdates (APNs: 20 minutes). 0 = off.
    public var minimumTokenUpdateIntervalSeconds: Int64 = 0
    /// Provider tokens whose iat lies further in the future than this are invalid.
    public var providerTokenClockSkewSeconds: Int64 = 300

    public init(certificatePath: String, privateKeyPath: String) {
        self.certificatePath = certificatePath
        self.privateKeyPath = privateKeyPath
    }
}
