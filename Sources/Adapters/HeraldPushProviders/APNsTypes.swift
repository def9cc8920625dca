import Foundation
import HeraldCore

extension APNsEnvironment {
    /// Apple's gateway for this environment.
    public var host: String {
        switch self {
        case .production: "api.push.apple.com"
        case .sandbox: "api.sandbox.push.apple.com"
        }
    }
}

extension ServiceEndpoint {
    /// Apple's gateway for `environment`, on 443.
    public init(_ environment: APNsEnvironment) {
        self.init(host: environment.host, port: 443)
    }
}

/// `apns-priority`: 10 sends at once, 5 considers the device's power, 1 is lowest.
public enum APNsPriority: Int, Sendable, CaseIterable {
    case immediately = 10
    case considerPower = 5
    case low = 1
}

/// How the client proves who it is to APNs.
public enum APNsClientCredential: Sendable {
    /// Token auth: a .p8 key (PKCS#8 PEM text) with its key id and team id.
    case token(keyID: String, teamID: String, p8PEM: String)
    /// Certificate auth: PEM certificate (chain) file and PEM private key file.
    case certificateFiles(certificatePath: String, privateKeyPath: String)
    /// Certificate auth: a PKCS#12 (.p12) file and its password.
    case pkcs12File(path: String, password: String)

    /// Loads a token credential from a .p8 file.
    public static func token(keyID: String, teamID: String, p8Path: String) throws(PushError) -> APNsClientCredential {
        do {
            return .token(keyID: keyID, teamID: teamID, p8PEM: try String(contentsOfFile: p8Path, encoding: .utf8))
        } catch {
            throw PushError(.credential, "cannot read .p8 key \(p8Path): \(error.localizedDescription)")
        }
    }

    var isToken: Bool { if case .token = self { true } else { false } }

    /// The client credential for a pipeline file's credential entry: loads the .p8 key, or
    /// resolves the .p12 password from `p12_password_env` (in `environment`) or the inline one.
    public init(
        _ entry: APNsCredential, environment: [String: String] = ProcessInfo.processInfo.environment
    ) throws(PushError) {
        switch entry.auth {
        case .token(let teamID, let keyID, let keyFile)?:
            self = try .token(keyID: keyID, teamID: teamID, p8Path: keyFile)
        case .certificate(let certificateFile, let privateKeyFile)?:
            // A PEM file may hold the certificate and its key together.
            self = .certificateFiles(
                certificatePath: certificateFile, privateKeyPath: privateKeyFile ?? certificateFile)
        case .p12(let file, let passwordEnv, let password)?:
            if let passwordEnv {
                guard let value = environment[passwordEnv] else {
                    throw PushError(
                        .credential,
                        "environment variable \(passwordEnv) (the .p12 password of \(entry.bundleID)) is not set")
                }
                self = .pkcs12File(path: file, password: value)
            } else {
                self = .pkcs12File(path: file, password: password ?? "")
            }
        case nil:
            throw PushError(.credential, "credential of \(entry.bundleID) has neither token nor certificate settings")
        }
    }
}

/// Tunables of one client (one credential + environment): the credential, the JWT renewal and the connection pool
/// (`pool`, whose settings read and write as the configuration's own: `configuration.maxInFlight`).
@dynamicMemberLookup
public struct APNsClientConfiguration: Sendable {
    public var credential: APNsClientCredential
    public var environment: APNsEnvironment
    public var pool: ConnectionPoolSettings
    public var tokenRenewal: APNsTokenRenewalPolicy
    /// Wall clock for JWT `iat` and renewal (inject to test renewal).
    public var now: @Sendable () -> Date

    public init(
        credential: APNsClientCredential, environment: APNsEnvironment = .production,
        endpoint: ServiceEndpoint? = nil, trustedCAFile: String? = nil, connections: Int = 2,
        maxStreamsPerConnection: Int = 1000, maxInFlight: Int = 10_000,
        connectTimeout: Duration = .seconds(10), pingInterval: Duration = .seconds(60),
        pingTimeout: Duration = .seconds(10),
        reconnectBackoff: BackoffPolicy = BackoffPolicy(
            initialDelay: .milliseconds(100), maxDelay: .seconds(30)),
        retry: BackoffPolicy = BackoffPolicy(),
        tokenRenewal: APNsTokenRenewalPolicy = APNsTokenRenewalPolicy(),
        now: @escaping @Sendable () -> Date = { Date() }, metricDimensions: [(String, String)] = []
    ) {
        self.init(
            credential: credential, environment: environment,
            pool: ConnectionPoolSettings(
                endpoint: endpoint, trustedCAFile: trustedCAFile, connections: connections,
                maxStreamsPerConnection: maxStreamsPerConnection, maxInFlight: maxInFlight,
                connectTimeout: connectTimeout, pingInterval: pingInterval, pingTimeout: pingTimeout,
                reconnectBackoff: reconnectBackoff, retry: retry, metricDimensions: metricDimensions),
            tokenRenewal: tokenRenewal, now: now)
    }

    public init(
        credential: APNsClientCredential, environment: APNsEnvironment = .production, pool: ConnectionPoolSettings,
        tokenRenewal: APNsTokenRenewalPolicy = APNsTokenRenewalPolicy(),
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.credential = credential
        self.environment = environment
        self.pool = pool
        self.tokenRenewal = tokenRenewal
        self.now = now
    }

    public subscript<T>(dynamicMember keyPath: WritableKeyPath<ConnectionPoolSettings, T>) -> T {
        get { pool[keyPath: keyPath] }
        set { pool[keyPath: keyPath] = newValue }
    }

    var resolvedEndpoint: ServiceEndpoint { pool.endpoint ?? ServiceEndpoint(environment) }
}
