import HeraldRedis
import HeraldTestSupport

extension RedisServer {
    /// A client configuration for this server with short timeouts and backoff, so failure tests run fast.
    var configuration: RedisConfiguration {
        RedisConfiguration(
            host: "127.0.0.1", port: port, connectTimeout: .seconds(1), commandTimeout: .seconds(5),
            initialBackoff: .milliseconds(20), maximumBackoff: .milliseconds(200))
    }
}
