import Foundation

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

    /// Parses `redis://[[user]:password@]host[:port][/database]` (the form of `HERALD_REDIS_URL`).
    /// With a user name, AUTH names that ACL user (Redis 6+); without one it authenticates the default user.
    public init(url: String) throws {
        guard let components = URLComponents(string: url), components.scheme == "redis" else {
            throw RedisError(.invalidConfiguration, "not a redis:// URL: \(Self.redacted(url))")
        }
        guard let host = components.host, !host.isEmpty else {
            throw RedisError(.invalidConfiguration, "no host in Redis URL: \(Self.redacted(url))")
        }
        self.init(host: host, port: components.port ?? 6379)
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

    /// The URL with any password replaced, fit for logs and error messages.
    public static func redacted(_ url: String) -> String {
        guard var components = URLComponents(string: url), components.password != nil else { return url }
        components.password = "***"
        return components.string ?? "redis://***"
    }
}

extension RedisConfiguration: CustomStringConvertible {
    /// Host, port and database; the password is never printed.
    public var description: String {
        "redis://\(password == nil ? "" : "\(username ?? ""):***@")\(host):\(port)/\(database)"
    }
}
