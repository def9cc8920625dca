import CRdKafka

/// The one error type of the Kafka adapter.
///
/// `code` is stable (it is safe to match on, count in metrics and write in logs);
/// `reason` is a human-readable explanation; `librdkafkaCode` is librdkafka's own
/// `rd_kafka_resp_err_t` value (negative values are client-local errors, positive
/// ones came from the broker) when the error originated there.
public struct KafkaError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Stable error codes. New codes may be added; existing raw values never change.
    public struct Code: Hashable, Sendable, RawRepresentable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// A configuration value was rejected by librdkafka or is invalid.
        public static let configuration = Code(rawValue: "kafka.configuration")
        /// `rd_kafka_new` failed.
        public static let clientCreation = Code(rawValue: "kafka.client_creation")
        /// A record could not be enqueued for sending.
        public static let produce = Code(rawValue: "kafka.produce")
        /// The broker did not acknowledge a record (delivery report carried an error).
        public static let delivery = Code(rawValue: "kafka.delivery")
        /// `flush` did not finish within its timeout.
        public static let flushTimeout = Code(rawValue: "kafka.flush_timeout")
        /// Subscribing to topics failed.
        public static let subscribe = Code(rawValue: "kafka.subscribe")
        /// Storing offsets failed.
        public static let offsetStore = Code(rawValue: "kafka.offset_store")
        /// Committing offsets failed.
        public static let commit = Code(rawValue: "kafka.commit")
        /// The consumer reported an error while polling (e.g. broker down, unknown topic).
        public static let consume = Code(rawValue: "kafka.consume")
        /// Pausing or resuming partitions failed.
        public static let pauseResume = Code(rawValue: "kafka.pause_resume")
        /// A topic administration request failed.
        public static let admin = Code(rawValue: "kafka.admin")
        /// The client was already shut down.
        public static let closed = Code(rawValue: "kafka.closed")
        /// librdkafka raised a fatal error; the client must be recreated.
        public static let fatal = Code(rawValue: "kafka.fatal")
    }

    public let code: Code
    public let reason: String
    /// librdkafka's `rd_kafka_resp_err_t` raw value, when the error came from librdkafka.
    public let librdkafkaCode: Int32?
    /// Where it happened: e.g. "topic" / "partition" / "operation". Never carries payloads.
    public let context: [String: String]

    public init(code: Code, reason: String, librdkafkaCode: Int32? = nil, context: [String: String] = [:]) {
        self.code = code
        self.reason = reason
        self.librdkafkaCode = librdkafkaCode
        self.context = context
    }

    /// librdkafka's symbolic name of `librdkafkaCode` (e.g. `_QUEUE_FULL`, `NOT_LEADER_FOR_PARTITION`).
    public var librdkafkaName: String? {
        librdkafkaCode.map { String(cString: rd_kafka_err2name(rd_kafka_resp_err_t($0))) }
    }

    /// True for errors a caller may retry (per librdkafka's classification for
    /// broker errors, plus timeouts and full queues).
    public var isRetriable: Bool {
        guard let raw = librdkafkaCode else { return code == .flushTimeout }
        switch rd_kafka_resp_err_t(raw) {
        case RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__TIMED_OUT, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT,
            RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN,
            RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND, RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION,
            RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS, RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
            RD_KAFKA_RESP_ERR_NOT_COORDINATOR, RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS:
            return true
        default:
            return false
        }
    }

    /// True when the broker (or librdkafka, before sending) refused the record itself: producing the same bytes
    /// again can never succeed (too large, invalid, not allowed). A stage dead-letters such an output instead
    /// of retrying it forever.
    public var isPermanentRecordRejection: Bool {
        guard let raw = librdkafkaCode else { return false }
        switch rd_kafka_resp_err_t(raw) {
        case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, RD_KAFKA_RESP_ERR_INVALID_RECORD, RD_KAFKA_RESP_ERR_INVALID_MSG,
            RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE, RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE,
            RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP, RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS,
            RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION,
            RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT, RD_KAFKA_RESP_ERR__BAD_MSG,
            RD_KAFKA_RESP_ERR__INVALID_ARG:
            return true
        default:
            return false
        }
    }

    public var description: String {
        var text = "\(code.rawValue): \(reason)"
        if let name = librdkafkaName, let raw = librdkafkaCode { text += " [\(name) (\(raw))]" }
        if !context.isEmpty {
            text +=
                " {" + context.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ", ") + "}"
        }
        return text
    }

    /// Builds an error from an `rd_kafka_resp_err_t`.
    static func rdkafka(
        _ code: Code, _ err: rd_kafka_resp_err_t, _ what: String, context: [String: String] = [:]
    ) -> KafkaError {
        KafkaError(
            code: code, reason: "\(what): \(String(cString: rd_kafka_err2str(err)))",
            librdkafkaCode: err.rawValue, context: context)
    }

    /// Builds an error from an `rd_kafka_error_t`, destroying it.
    static func consuming(
        _ code: Code, _ error: OpaquePointer, _ what: String, context: [String: String] = [:]
    ) -> KafkaError {
        defer { rd_kafka_error_destroy(error) }
        let err = rd_kafka_error_code(error)
        let text = rd_kafka_error_string(error).map { String(cString: $0) } ?? "unknown"
        let fatal = rd_kafka_error_is_fatal(error) != 0
        return KafkaError(
            code: fatal ? .fatal : code, reason: "\(what): \(text)", librdkafkaCode: err.rawValue, context: context)
    }
}
