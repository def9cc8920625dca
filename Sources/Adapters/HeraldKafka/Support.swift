import CRdKafka
import Foundation
import Logging
import Synchronization

/// What librdkafka's callbacks reach through `rd_kafka_opaque`. It lives from before
/// `rd_kafka_new` until after `rd_kafka_destroy` returned (retained by hand), so a
/// callback from any librdkafka thread always finds it alive.
final class CallbackContext: @unchecked Sendable {
    // Safe: `logger` is immutable and Sendable; `consumer` is a weak reference
    // (atomic loads) set once before the handle starts serving callbacks.
    let logger: Logger
    weak var consumer: ConsumerCore?
    init(logger: Logger) { self.logger = logger }
}

/// Owns one `rd_kafka_t` and destroys it exactly once.
///
/// `@unchecked Sendable`: librdkafka handles are thread-safe; the only mutable
/// state (`destroyed`) sits behind a lock.
final class RdKafkaHandle: @unchecked Sendable {
    let pointer: OpaquePointer
    private let context: Unmanaged<CallbackContext>
    private let destroyed = Mutex(false)
    private let isConsumer: Bool

    var callbackContext: CallbackContext { context.takeUnretainedValue() }

    /// Creates the handle. `configure` may install callbacks on the conf.
    init(
        type: rd_kafka_type_t, properties: [String: String], logger: Logger, threadNice: Int = 0,
        configure: (OpaquePointer) -> Void = { _ in }
    ) throws(KafkaError) {
        let conf = try LibrdkafkaProperties.makeConf(properties)
        if threadNice > 0 {
            // librdkafka takes thread interceptors only from an on_new interceptor, which rd_kafka_new calls before
            // it starts any thread; the on_thread_start one then runs in each thread librdkafka starts for this
            // client (main, broker, background) before its work. The nice value travels as the opaque pointer.
            let status = rd_kafka_conf_interceptor_add_on_new(
                conf, "herald-thread-nice",
                { rk, _, opaque, _, _ in
                    rd_kafka_interceptor_add_on_thread_start(
                        rk, "herald-thread-nice",
                        { _, _, _, opaque in
                            ThreadNice.apply(Int32(truncatingIfNeeded: Int(bitPattern: opaque)))
                            return RD_KAFKA_RESP_ERR_NO_ERROR
                        }, opaque)
                }, UnsafeMutableRawPointer(bitPattern: threadNice))
            if status != RD_KAFKA_RESP_ERR_NO_ERROR {
                logger.warning(
                    "could not lower librdkafka's thread priority",
                    metadata: ["code": .string(String(cString: rd_kafka_err2name(status)))])
            }
        }
        let context = Unmanaged.passRetained(CallbackContext(logger: logger))
        rd_kafka_conf_set_opaque(conf, context.toOpaque())
        rd_kafka_conf_set_log_cb(conf) { rk, level, facility, message in
            guard let rk, let opaque = rd_kafka_opaque(rk) else { return }
            let ctx = Unmanaged<CallbackContext>.fromOpaque(opaque).takeUnretainedValue()
            let text = message.map { String(cString: $0) } ?? ""
            let fac = facility.map { String(cString: $0) } ?? ""
            let logLevel: Logger.Level = level <= 3 ? .error : (level <= 5 ? .warning : (level == 6 ? .info : .debug))
            ctx.logger.log(
                level: logLevel, "librdkafka", metadata: ["facility": .string(fac), "detail": .string(text)])
        }
        configure(conf)
        var errbuf = [CChar](repeating: 0, count: 512)
        guard let rk = rd_kafka_new(type, conf, &errbuf, errbuf.count) else {
            rd_kafka_conf_destroy(conf)
            context.release()
            throw KafkaError(code: .clientCreation, reason: cStringBuffer(errbuf))
        }
        self.pointer = rk
        self.context = context
        self.isConsumer = type == RD_KAFKA_CONSUMER
    }

    /// Destroys the handle (blocking; call from a thread of our own, never the
    /// cooperative pool). Safe to call more than once.
    func destroy() {
        let first = destroyed.withLock { done -> Bool in
            defer { done = true }
            return !done
        }
        guard first else { return }
        if isConsumer {
            // The consumer was closed explicitly (or never will be): don't let
            // destroy run a close that would call back into a half-torn-down consumer.
            rd_kafka_destroy_flags(pointer, Int32(RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE))
        } else {
            rd_kafka_destroy(pointer)
        }
        context.release()
    }

    deinit { destroy() }
}

/// Builds an `rd_kafka_topic_partition_list_t`; the caller destroys it.
func makePartitionList(_ entries: [(TopicPartition, Int64?)]) -> UnsafeMutablePointer<rd_kafka_topic_partition_list_t> {
    let list = rd_kafka_topic_partition_list_new(Int32(max(1, entries.count)))!
    for (tp, offset) in entries {
        let element = rd_kafka_topic_partition_list_add(list, tp.topic, tp.partition)
        if let offset { element?.pointee.offset = offset }
    }
    return list
}

/// Reads an `rd_kafka_topic_partition_list_t` into Swift values.
func readPartitionList(
    _ list: UnsafePointer<rd_kafka_topic_partition_list_t>?
) -> [(TopicPartition, Int64, rd_kafka_resp_err_t)] {
    guard let list, let elems = list.pointee.elems else { return [] }
    var result: [(TopicPartition, Int64, rd_kafka_resp_err_t)] = []
    for i in 0..<Int(list.pointee.cnt) {
        let e = elems[i]
        let topic = e.topic.map { String(cString: $0) } ?? ""
        result.append((TopicPartition(topic: topic, partition: e.partition), e.offset, e.err))
    }
    return result
}

/// A one-shot signal a thread can wait on.
final class ThreadExit: @unchecked Sendable {
    // Safe: the semaphore is thread-safe by construction.
    private let semaphore = DispatchSemaphore(value: 0)
    func signal() { semaphore.signal() }
    func wait() { semaphore.wait() }
}

/// Per-thread nice values (Linux keeps one per thread; `setpriority(PRIO_PROCESS, 0, n)` sets the calling one's).
enum ThreadNice {
    /// Gives the calling thread nice value `nice` (a failure only leaves it as it was).
    static func apply(_ nice: Int32) {
        if nice > 0 { _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, nice) }
    }
}
