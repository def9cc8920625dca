import Foundation
import HeraldCore

/// Where and how to connect to Redis.
public struct RedisConfiguration: Sendable, Hashable {
    public var host: String
    public var port: Int
    /// Sent with `AUTH` after every (re)connect when set.
    public var password: String?
    /// The ACL user (Redis 6+) sent with the password as `AUTH user password`; nil for the `default` user.
    public var username: String?
    /// Selected with `SELECT` after every (re)connect when not 0.
    public var database: Int
    /// Bound on opening the TCP connection.
    public var connectTimeout: Duration
    /// Bound on every socket read and write of a command or batch; when it passes the connection is dropped
    /// and the call fails with `RedisError.Code.timeout` (retryable).
    public var commandTimeout: Duration
    /// First wait before a reconnect attempt that follows a failed attempt; doubles up to `maximumBackoff`.
    /// The first reconnect after a broken connection is attempted at once.
    public var initialBackoff: Duration
    public var maximumBackoff: Duration
    /// TLS (`rediss://`); nil for a plaintext connection. Every (re)connect does a full handshake that verifies the
    /// server's certificate and host name.
    public var tls: RedisTLSConfiguration?
    /// Redis Cluster: the seed nodes the slot map is first learnt from (empty: one node at `host`:`port`). Every
    /// node connection uses this configuration with only the host and port replaced.
    public var clusterSeeds: [RedisNodeAddress] = []

    public init(
        host: String = "127.0.0.1",
        port: Int = 6379,
        password: String? = nil,
        database: Int = 0,
        connectTimeout: Duration = .seconds(2),
        commandTimeout: Duration = .seconds(5),
        initialBackoff: Duration = .milliseconds(50),
        maximumBackoff: Duration = .seconds(5)
    ) {
        self.host = host
        self.port = port
        self.password = password
        self.database = database
        self.connectTimeout = connectTimeout
        self.commandTimeout = commandTimeout
        self.initialBackoff = initialBackoff
        self.maximumBackoff = maximumBackoff
    }

    /// Parses `redis://[[user]:password@]host[:port][/database]` (the form of `HERALD_REDIS_URL`), or `rediss://`
    /// for TLS with the system trust store (`applyTLS` sets a CA file, a client certificate, a server name).
    /// With a user name, AUTH names that ACL user (Redis 6+); without one it authenticates the default user.
    /// `redis+cluster://[[user]:password@]host[:port][,host[:port]...]` names a Redis Cluster by seed nodes.
    public init(url: String) throws {
        if let cluster = try Self.clusterForm(of: url) {
            self = try RedisConfiguration(url: cluster.nodeURL)
            try useCluster(seeds: cluster.seeds)
            return
        }
        guard let components = URLComponents(string: url), components.scheme == "redis" || components.scheme == "rediss"
        else {
            throw RedisError(.invalidConfiguration, "not a redis:// or rediss:// URL: \(Self.redacted(url))")
        }
        guard let host = components.host, !host.isEmpty else {
            throw RedisError(.invalidConfiguration, "no host in Redis URL: \(Self.redacted(url))")
        }
        self.init(host: host, port: components.port ?? 6379)
        if components.scheme == "rediss" { tls = RedisTLSConfiguration() }
        if let password = components.password, !password.isEmpty {
            self.password = password.removingPercentEncoding ?? password
            if let user = components.user, !user.isEmpty { self.username = user.removingPercentEncoding ?? user }
        }
        let path = components.path.trimmingCharacters(in: CharacterSet(charactersIn: "/"))
        if !path.isEmpty {
            guard let database = Int(path), database >= 0 else {
                throw RedisError(.invalidConfiguration, "database in Redis URL is not a number: \(path)")
            }
            self.database = database
        }
        guard (1...65535).contains(port) else {
            throw RedisError(.invalidConfiguration, "port out of range: \(port)")
        }
    }

    /// Adds the TLS files and server name (`HERALD_REDIS_CA_FILE`, `_CERT_FILE`, `_KEY_FILE`, `_SERVER_NAME`, or
    /// heraldctl's options). They need TLS already on (`rediss://`): a TLS setting beside a plaintext URL is an
    /// error, never a silent plaintext connection. Files are checked to be readable here; their content is loaded
    /// at the first connect.
    public mutating func applyTLS(
        caFile: String? = nil, certificateFile: String? = nil, keyFile: String? = nil, serverName: String? = nil
    ) throws {
        let given = [caFile, certificateFile, keyFile, serverName].compactMap { $0 }
        if given.isEmpty { return }
        guard var tls else {
            throw RedisError(
                .invalidConfiguration,
                "Redis TLS settings (CA file, client certificate, server name) need a rediss:// URL")
        }
        if (certificateFile == nil) != (keyFile == nil) {
            throw RedisError(
                .invalidConfiguration, "a Redis client certificate needs its key file, and a key its certificate")
        }
        for path in [caFile, certificateFile, keyFile].compactMap({ $0 })
        where !FileManager.default.isReadableFile(atPath: path) {
            throw RedisError(.invalidConfiguration, "cannot read \(path)")
        }
        if let serverName, serverName.isEmpty || serverName.contains(where: { $0.isWhitespace }) {
            throw RedisError(.invalidConfiguration, "not a server name: \"\(serverName)\"")
        }
        if let caFile { tls.caFile = caFile }
        if let certificateFile { tls.certificateFile = certificateFile }
        if let keyFile { tls.keyFile = keyFile }
        if let serverName { tls.serverName = serverName }
        self.tls = tls
    }

    /// The URL with any password replaced, fit for logs and error messages.
    public static func redacted(_ url: String) -> String {
        if let redacted = clusterRedacted(url) { return redacted }
        if var components = URLComponents(string: url) {
            guard components.password != nil else { return url }
            components.password = "***"
            return components.string ?? "redis://***"
        }
        // Not a URL (a password with a space or a stray "@" in it, say): whatever stands between the scheme and the
        // last "@" may be credentials, and goes.
        guard let at = url.lastIndex(of: "@") else { return url }
        let start = url.range(of: "://").map(\.upperBound) ?? url.startIndex
        guard start <= at else { return url }
        return String(url[..<start]) + "***" + String(url[at...])
    }
}

/// TLS to Redis (`rediss://`). The server's certificate is always verified, and so is the name it is for: the
/// configured `serverName`, else the host connected to (a DNS name, or an IP literal checked against the
/// certificate's IP addresses). TLS 1.2 is the minimum. A Redis Cluster client reuses one of these for every node
/// (host and port change, the TLS settings do not).
public struct RedisTLSConfiguration: Sendable, Hashable {
    /// PEM file of the certificates to trust; it replaces the system trust store (nil: the system store).
    public var caFile: String?
    /// PEM client certificate (chain) for servers that require one (`tls-auth-clients yes`), with `keyFile`.
    public var certificateFile: String?
    public var keyFile: String?
    /// The name the server's certificate must carry, and the SNI sent, when it is not the host connected to
    /// (e.g. connecting by IP address to a certificate issued for a DNS name).
    public var serverName: String?

    public init(
        caFile: String? = nil, certificateFile: String? = nil, keyFile: String? = nil, serverName: String? = nil
    ) {
        self.caFile = caFile
        self.certificateFile = certificateFile
        self.keyFile = keyFile
        self.serverName = serverName
    }
}

extension RedisConfiguration: CustomStringConvertible {
    /// Host, port and database; the password is never printed.
    public var description: String {
        if !clusterSeeds.isEmpty { return clusterDescription }
        return
            "\(tls == nil ? "redis" : "rediss")://\(password == nil ? "" : "\(username ?? ""):***@")\(host):\(port)/\(database)"
    }
}

extension RedisConfiguration {
    /// The wait before a connect that follows `n` failed ones: `initialBackoff` doubling to `maximumBackoff` (the
    /// doubling stops after 20 steps), the upper half randomised so a fleet of workers does not reconnect in lockstep.
    public var reconnectBackoff: BackoffPolicy {
        BackoffPolicy(
            initialDelay: initialBackoff, maxDelay: min(maximumBackoff, initialBackoff * (1 << 20)), multiplier: 2,
            jitter: 0.5, maxAttempts: .max)
    }

    /// The wait before a subscriber's next round over the nodes after `n` rounds failed: `initialBackoff` doubling
    /// to `maximumBackoff` (the doubling stops after 10 steps), not randomised.
    public var resubscribeBackoff: BackoffPolicy {
        BackoffPolicy(
            initialDelay: initialBackoff, maxDelay: min(maximumBackoff, initialBackoff * (1 << 10)), multiplier: 2,
            jitter: 0, maxAttempts: .max)
    }
}
