import Foundation
import HeraldCore
import HeraldHTTP
import Logging
import Synchronization

/// The fields of a Google service-account JSON file that FCM HTTP v1 needs. The private key is
/// kept in memory only to sign assertions; no description or log line ever contains it.
public struct FCMServiceAccount: Sendable, CustomStringConvertible {
    public let projectID: String
    public let clientEmail: String
    public let privateKeyID: String?
    /// The OAuth2 token endpoint (`token_uri`): Google's, or a stand-in's in tests.
    public let tokenURI: String
    let privateKeyPEM: String

    public init(projectID: String, clientEmail: String, privateKeyID: String?, tokenURI: String, privateKeyPEM: String)
    {
        self.projectID = projectID; self.clientEmail = clientEmail; self.privateKeyID = privateKeyID
        self.tokenURI = tokenURI; self.privateKeyPEM = privateKeyPEM
    }

    /// Reads a service-account file; the error names the missing field, never the key.
    /// `allowCleartextTokenURI` is for tests only: see `parse`.
    public static func load(path: String, allowCleartextTokenURI: Bool = false) throws(PushError) -> FCMServiceAccount {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw PushError(.credential, "cannot read the FCM service account file \(path)")
        }
        return try parse(Array(data), source: path, allowCleartextTokenURI: allowCleartextTokenURI)
    }

    /// The fields of a service-account JSON. Its `token_uri` must be an `https://` URL with a host: the signed
    /// assertion sent there is a credential, and the access token it returns is one. `http://` is refused unless
    /// `allowCleartextTokenURI` (a stand-in without TLS in a test; no stage or heraldctl setting turns it on).
    public static func parse(
        _ bytes: [UInt8], source: String = "service account", allowCleartextTokenURI: Bool = false
    ) throws(PushError) -> FCMServiceAccount {
        guard let object = try? JSONValue.parse(bytes), case .object = object else {
            throw PushError(.credential, "\(source) is not a JSON object")
        }
        func field(_ name: String) throws(PushError) -> String {
            guard let v = object[name]?.stringValue, !v.isEmpty else {
                throw PushError(.credential, "\(source): \(name) is missing")
            }
            return v
        }
        if let type = object["type"]?.stringValue, type != "service_account" {
            throw PushError(.credential, "\(source): type is \(type), expected service_account")
        }
        let tokenURI = object["token_uri"]?.stringValue ?? "https://oauth2.googleapis.com/token"
        let components = URLComponents(string: tokenURI)
        let scheme = components?.scheme?.lowercased()
        guard scheme == "https" || (scheme == "http" && allowCleartextTokenURI), components?.host?.isEmpty == false
        else {
            throw PushError(
                .credential,
                "\(source): token_uri must be an https:// URL, not \(scheme.map { $0 + "://" } ?? tokenURI)")
        }
        return FCMServiceAccount(
            projectID: try field("project_id"), clientEmail: try field("client_email"),
            privateKeyID: object["private_key_id"]?.stringValue, tokenURI: tokenURI,
            privateKeyPEM: try field("private_key"))
    }

    public var description: String { "FCMServiceAccount(project: \(projectID), client: \(clientEmail))" }
}

/// The OAuth2 JWT-bearer assertion for FCM (RFC 7523):
/// `{"alg":"RS256","typ":"JWT","kid":KEY}.{"iss":EMAIL,"scope":FCM,"aud":TOKEN_URI,"iat":T,"exp":T+3600}.sig`.
public struct FCMAssertion: Sendable {
    public static let scope = "https://www.googleapis.com/auth/firebase.messaging"
    public let account: FCMServiceAccount
    private let signer: JWTSigner

    public init(account: FCMServiceAccount) throws(PushError) {
        self.account = account
        signer = try JWTSigner(
            pem: account.privateKeyPEM, algorithm: .rs256, keyName: "the service account's private_key")
    }

    public func make(issuedAt: Date, lifetime: Int64 = 3600) throws(PushError) -> String {
        let iat = Int64(issuedAt.timeIntervalSince1970.rounded(.down))
        var header = #"{"alg":"RS256","typ":"JWT""#
        if let kid = account.privateKeyID { header += #","kid":"\#(JWTEncoding.jsonEscape(kid))""# }
        header += "}"
        let claims =
            #"{"iss":"\#(JWTEncoding.jsonEscape(account.clientEmail))","scope":"\#(Self.scope)","aud":"\#(JWTEncoding.jsonEscape(account.tokenURI))","iat":\#(iat),"exp":\#(iat + lifetime)}"#
        let input = JWTEncoding.base64URL(Array(header.utf8)) + "." + JWTEncoding.base64URL(Array(claims.utf8))
        return input + "." + JWTEncoding.base64URL(try signer.sign(Array(input.utf8)))
    }
}

/// The OAuth2 access token of one FCM credential: fetched from the service account's `token_uri` over
/// HTTP/1.1 (libcurl), cached, and renewed in the background `renewBefore` ahead of its expiry, never
/// per request. A 401 from FCM (`rejected`) drops the token and fetches a new one at once (at most
/// once per `minimumInterval`). Requests wait while there is no token.
public final class FCMAccessTokens: @unchecked Sendable {
    // @unchecked Sendable: the mutable state is in `state`, behind its lock; the renewal task reaches it only there.
    private let assertion: FCMAssertion
    private let http: HTTP1Client
    private let now: @Sendable () -> Date
    private let renewBefore: Duration
    private let minimumInterval: Duration
    private let logger: Logger
    private struct State {
        var current: (token: String, issuedAt: Date, expiresAt: Date)?
        var renewals = 0
        var renewNow = false
        var task: Task<Void, Never>?
        var lastError: String?
    }
    private let state = Mutex(State())
    /// `waitForToken` callers, woken when a fetch stores a token.
    private let tokenWaiters = WaitList()
    /// The renewal task, woken early by `reject` (a 401 asked for a new token).
    private let renewWaiters = WaitList()

    public init(
        account: FCMServiceAccount, http: HTTP1Client, renewBefore: Duration = .seconds(300),
        minimumInterval: Duration = .seconds(1), now: @escaping @Sendable () -> Date = { Date() },
        logger: Logger = Logger(label: "herald.fcm")
    ) throws(PushError) {
        assertion = try FCMAssertion(account: account)
        self.http = http
        self.renewBefore = renewBefore
        self.minimumInterval = minimumInterval
        self.now = now
        self.logger = logger
    }

    /// Starts the renewal task (the first fetch happens at once).
    public func start() {
        state.withLock { state in
            guard state.task == nil else { return }
            state.task = Task { [weak self] in await self?.renewLoop() }
        }
    }

    public func stop() {
        let t = state.withLock { state -> Task<Void, Never>? in
            let t = state.task
            state.task = nil
            return t
        }
        t?.cancel()
    }

    deinit { state.withLock { $0.task }?.cancel() }

    /// Access tokens fetched so far.
    public var renewalCount: Int { state.withLock { $0.renewals } }
    /// The last fetch failure, if the last fetch failed (no secret in it).
    public var lastFailure: String? { state.withLock { $0.lastError } }

    /// The current token, if there is one that has not expired.
    public func token() -> (token: String, issuedAt: Date)? {
        state.withLock { state in
            guard let c = state.current, c.expiresAt > now() else { return nil }
            return (c.token, c.issuedAt)
        }
    }

    /// Waits until a token is available (woken by the fetch that stores one) or `timeout` passes.
    public func waitForToken(timeout: Duration) async -> Bool {
        _ = await tokenWaiters.wait(timeout: timeout, unlessAlready: { [self] in token() != nil })
        return token() != nil
    }

    /// FCM answered 401 to the token issued at `issuedAt`: drop it and renew now.
    @discardableResult
    public func reject(issuedAt: Date) -> Bool {
        state.withLock { state in
            if let c = state.current, c.issuedAt == issuedAt { state.current = nil }
            state.renewNow = true
        }
        renewWaiters.wakeAll()
        return true
    }

    /// The wait after `n` token fetches failed in a row: 400 ms doubling to 30 s, not randomised.
    public static let retryBackoff = BackoffPolicy(
        initialDelay: .milliseconds(400), maxDelay: .seconds(30), multiplier: 2, jitter: 0, maxAttempts: .max)

    private func renewLoop() async {
        var failures = 0
        while !Task.isCancelled {
            let fetched = await fetch()
            let wait: Duration
            if let expiresIn = fetched {
                failures = 0
                let lifetime = expiresIn - renewBefore
                wait = max(lifetime, minimumInterval)
            } else {
                failures += 1
                wait = Self.retryBackoff.delay(afterAttempt: failures, unit: 0)
            }
            await sleepOrWake(wait)
        }
    }

    /// Sleeps for `d`, or less when a 401 asked for a new token (but never sooner than
    /// `minimumInterval` after the last fetch).
    private func sleepOrWake(_ d: Duration) async {
        // The rate limit first: a plain wait, then a wait that `reject` can cut short.
        let end = ContinuousClock.now + d
        try? await Task.sleep(for: min(d, minimumInterval))
        let left = end - ContinuousClock.now
        if left > .zero, !Task.isCancelled {
            _ = await renewWaiters.wait(timeout: left, unlessAlready: { [self] in state.withLock { $0.renewNow } })
        }
        state.withLock { $0.renewNow = false }
    }

    /// One token exchange; returns the token's lifetime, or nil on failure.
    private func fetch() async -> Duration? {
        let issued = Date(timeIntervalSince1970: now().timeIntervalSince1970.rounded(.down))
        let jwt: String
        do { jwt = try assertion.make(issuedAt: issued) } catch {
            record(failure: error.message)
            return nil
        }
        let form = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=" + jwt
        let response = await http.send(
            HTTPRequest(
                url: assertion.account.tokenURI,
                headers: [("Content-Type", "application/x-www-form-urlencoded")],
                body: Array(form.utf8), timeout: .seconds(10)))
        guard let status = response.status else {
            record(failure: "token endpoint unreachable: \(response.failure?.description ?? "no answer")")
            return nil
        }
        let object = try? JSONValue.parse(response.body)
        guard status == 200, let token = object?["access_token"]?.stringValue, !token.isEmpty else {
            let error = object?["error"]?.stringValue
            record(failure: "token endpoint answered \(status)\(error.map { " \($0)" } ?? "")")
            return nil
        }
        let expiresIn = object?["expires_in"]?.int64Value ?? 3600
        state.withLock { state in
            state.current = (token, issued, issued.addingTimeInterval(TimeInterval(expiresIn)))
            state.renewals += 1
            state.lastError = nil
        }
        tokenWaiters.wakeAll()
        logger.info(
            "fcm access token renewed",
            metadata: [
                "project": "\(assertion.account.projectID)",
                "expires_in_s": "\(expiresIn)",
            ])
        return .seconds(expiresIn)
    }

    private func record(failure: String) {
        state.withLock { $0.lastError = failure }
        logger.warning(
            "fcm access token fetch failed",
            metadata: [
                "project": "\(assertion.account.projectID)",
                "error": "\(failure)",
            ])
    }
}

extension FCMAccessTokens: BearerSource {
    func currentBearer() throws(PushError) -> (token: String, issuedAt: Date)? { token() }
    func rejected(issuedAt: Date) throws(PushError) -> Bool { reject(issuedAt: issuedAt) }
    var scheme: String { "Bearer " }
}
