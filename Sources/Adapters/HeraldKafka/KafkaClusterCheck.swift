import CRdKafka
import Foundation
import Logging
import Synchronization

/// Whether the cluster answers: a metadata request for its brokers alone (no topics), over one client kept for the
/// check's whole life. A check is then one small request on a connection already open, where a client made per
/// check would open a connection, and against a secured cluster complete a TLS handshake and an authentication,
/// every time; and a request for every topic's metadata costs a large cluster more than the answer is worth here.
///
/// The client is made at the first check, with `configuration`'s brokers, client id and librdkafka properties (so
/// TLS and SASL settings too), and reconnects on its own after the cluster was away. Checks run one at a time on a
/// thread of their own (the librdkafka calls block); the client is destroyed on a thread of its own once the check
/// is released.
public final class KafkaClusterCheck: Sendable {
    private let configuration: KafkaAdminConfiguration
    private let logger: Logger
    private let client = Mutex<RdKafkaHandle?>(nil)
    private let made = Mutex(0)
    private let queue = DispatchQueue(label: "herald-kafka-check")

    /// `configuration.requestTimeout` bounds each check.
    public init(configuration: KafkaAdminConfiguration, logger: Logger = Logger(label: "herald.kafka.check")) {
        self.configuration = configuration
        self.logger = logger
    }

    deinit {
        if let handle = client.withLock({ $0.take() }) {
            let thread = Thread { handle.destroy() }
            thread.name = "herald-kafka-check-close"
            thread.start()
        }
    }

    /// True when a broker answered the metadata request within the timeout; false when none did, or when the client
    /// cannot be made (a bad property: the stage's own clients fail the same way).
    public func answers() async -> Bool {
        await withCheckedContinuation { continuation in
            queue.async { continuation.resume(returning: self.check()) }
        }
    }

    /// How many clients the check has made (one while its settings are valid).
    public var clientsMade: Int { made.withLock { $0 } }

    private func check() -> Bool {
        let handle: RdKafkaHandle
        if let existing = client.withLock({ $0 }) {
            handle = existing
        } else {
            do {
                handle = try RdKafkaHandle(
                    type: RD_KAFKA_PRODUCER, properties: LibrdkafkaProperties.admin(configuration), logger: logger)
            } catch {
                logger.debug("broker check: no client", metadata: ["error": "\(error)"])
                return false
            }
            client.withLock { $0 = handle }
            made.withLock { $0 += 1 }
        }
        var metadata: UnsafePointer<rd_kafka_metadata>?
        // Not every topic (`all_topics` 0), and no topic of this client's (it has none): the brokers alone.
        let err = rd_kafka_metadata(
            handle.pointer, 0, nil, &metadata, Int32(clamping: configuration.requestTimeout.milliseconds))
        if let metadata { rd_kafka_metadata_destroy(metadata) }
        return err == RD_KAFKA_RESP_ERR_NO_ERROR && metadata != nil
    }
}
