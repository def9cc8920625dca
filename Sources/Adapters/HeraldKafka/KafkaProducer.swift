import CRdKafka
import Foundation
import HeraldCore
import Logging
import Synchronization

/// An idempotent Kafka producer.
///
/// Records are enqueued with `rd_kafka_produceva` (non-blocking) and acknowledged
/// through librdkafka's delivery reports, which a thread of the producer's own serves;
/// each `send` resolves when the broker acknowledged (or finally failed) every record
/// of its batch. A batch of thousands is pipelined: librdkafka packs it into a few
/// ProduceRequests, it is not one round trip per record.
///
/// Call `shutdown(timeout:)` before dropping the producer so queued records are flushed;
/// records still queued when the last reference goes away are purged and reported failed.
public final class KafkaProducer: Sendable {
    private let core: ProducerCore
    private let packer: Packer?
    public let configuration: KafkaProducerConfiguration

    public init(
        configuration: KafkaProducerConfiguration, logger: Logger = Logger(label: "herald.kafka.producer")
    ) throws(KafkaError) {
        self.configuration = configuration
        self.core = try ProducerCore(configuration: configuration, logger: logger)
        self.packer = configuration.packTopics.isEmpty ? nil : Packer(configuration: configuration, logger: logger)
    }

    deinit { core.stop() }

    /// Sends `records` and waits for the broker's answer to every one of them.
    /// Returns one report per record, in the order given. Never throws for a record the
    /// broker rejected (see each report's `error`); throws `KafkaError.Code.closed` if the
    /// producer was shut down.
    public func send(_ records: [ProducerRecord]) async throws(KafkaError) -> [DeliveryReport] {
        try await enqueue(records).reports()
    }

    /// Enqueues `records` in the order given and returns without waiting for the broker (it waits only while
    /// librdkafka's local queue is full). Records enqueued by successive calls keep their order per partition
    /// (the producer is idempotent), so a caller can enqueue the next batch while the previous one is still
    /// being acknowledged. `reports()` on the result waits for the broker's answers.
    ///
    /// Records for a topic in `configuration.packTopics` that go to the same partition are sent as packs
    /// (`RecordPack`); each record's report is then its pack's.
    public func enqueue(_ records: [ProducerRecord]) async throws(KafkaError) -> PendingDelivery {
        if records.isEmpty { return PendingDelivery(sink: nil) }
        let (units, unitOf) = packer.map { $0.pack(records) } ?? (records, nil)
        let sink = BatchSink(count: units.count)
        for index in units.indices {
            try await core.enqueue(units[index], sink: sink, index: index)
        }
        return PendingDelivery(sink: sink, unitOf: unitOf)
    }

    /// Sends `records` and throws the first failure, if any record was not acknowledged.
    public func sendAll(_ records: [ProducerRecord]) async throws(KafkaError) {
        for report in try await send(records) {
            try report.get()
        }
    }

    /// Sends one record and waits for its delivery report.
    public func send(_ record: ProducerRecord) async throws(KafkaError) -> DeliveryReport {
        let reports = try await send([record])
        return reports[0]
    }

    /// Fire and track: enqueues `record` without waiting; `onDelivery` runs once on the
    /// producer's polling thread when the broker answered (keep it short, don't block).
    /// Throws if the record cannot be enqueued (e.g. `_QUEUE_FULL`, which is retriable).
    public func produce(
        _ record: ProducerRecord, onDelivery: @escaping @Sendable (DeliveryReport) -> Void
    ) throws(KafkaError) {
        try core.enqueueNow(record, sink: CallbackSink(onDelivery), index: 0)
    }

    /// Records enqueued and not yet acknowledged or failed.
    public var outstanding: Int { core.outstanding }

    /// Raises a fatal error in librdkafka as a broker fencing the producer would (`rd_kafka_test_fatal_error`):
    /// for tests of what a stage does when its producer dies.
    public func raiseFatalErrorForTesting() {
        core.raiseFatalErrorForTesting()
    }

    /// librdkafka's fatal error, once the producer has one (e.g. the idempotent producer was fenced): nothing
    /// it produces will be acknowledged any more, and the producer must be recreated.
    public var fatalError: KafkaError? { core.fatalError }

    /// Waits until every enqueued record got its delivery report, or `timeout` passed
    /// (then throws `flushTimeout`).
    public func flush(timeout: Duration) async throws(KafkaError) {
        try await core.flush(timeout: timeout)
    }

    /// Flushes (up to `timeout`) and stops the producer. Later sends throw `closed`.
    /// Records still unacknowledged at the deadline are purged and reported failed.
    public func shutdown(timeout: Duration = .seconds(10)) async throws(KafkaError) {
        var flushError: KafkaError?
        do { try await core.flush(timeout: timeout) } catch { flushError = error }
        core.stop()
        await core.waitStopped()
        if let flushError { throw flushError }
    }
}

/// Records enqueued by `KafkaProducer.enqueue`, whose broker answers are still to come.
public struct PendingDelivery: Sendable {
    let sink: BatchSink?
    /// For each record, the Kafka record (pack or record) it went in; nil when none was packed.
    var unitOf: [Int]? = nil

    /// One report per record, in the order enqueued, once the broker answered (or finally failed) all of them.
    public func reports() async -> [DeliveryReport] {
        let reports = await unitReports()
        guard let unitOf = reports.unitOf else { return reports.units }
        return unitOf.map { reports.units[$0] }
    }

    /// The same reports without a copy of a pack's report for each of its records: the stage loop reads each
    /// record's report in place.
    public func unitReports() async -> DeliveryReports {
        guard let sink else { return DeliveryReports(units: [], unitOf: nil) }
        return DeliveryReports(units: await sink.wait(), unitOf: unitOf)
    }
}

/// The broker's answers to the records of one `enqueue`: one report per Kafka record produced (a pack or a
/// record), and for each record enqueued the one it went in.
public struct DeliveryReports: Sendable {
    /// One per Kafka record produced.
    public let units: [DeliveryReport]
    /// For each record enqueued, its Kafka record's place in `units`; nil when each went on its own.
    public let unitOf: [Int]?

    public init(units: [DeliveryReport], unitOf: [Int]?) {
        self.units = units
        self.unitOf = unitOf
    }

    /// Reports for this many records.
    public var count: Int { unitOf?.count ?? units.count }

    /// The place in `units` of the report of the record enqueued at `position`.
    @inlinable public func unit(_ position: Int) -> Int { unitOf?[position] ?? position }
}

/// Packs the records of one `enqueue` call (`RecordPack`, docs/kafka.md "Packed records").
final class Packer: Sendable {
    let topics: Set<String>
    let maxRecords: Int
    let maxBytes: Int
    let packableHeaders: Set<String>
    let partitions: PartitionCounts

    init(configuration: KafkaProducerConfiguration, logger: Logger) {
        topics = configuration.packTopics
        maxRecords = max(1, configuration.packMaxRecords)
        maxBytes = max(64, configuration.packMaxBytes)
        packableHeaders = configuration.packableHeaders
        var admin = KafkaAdminConfiguration(client: configuration.client)
        admin.requestTimeout = .seconds(5)
        partitions = PartitionCounts(topics: topics.sorted(), admin: admin, logger: logger)
        partitions.refreshIfDue()
    }

    /// The Kafka records to produce for `records`, and for each record the index of the one it went in (nil when
    /// nothing was packed). A packed topic's record goes to the partition its key picks, in a pack with the other
    /// records of this call for that partition, in their order; a record that is not packed (no key, a header not
    /// in `packableHeaders`, an explicit partition, or larger than half a pack) closes its partition's open pack
    /// first, so every partition's order is the order given. The headers of packed records travel in the pack's
    /// `herald-part-headers` header (`PackHeaders`).
    func pack(_ records: [ProducerRecord]) -> (units: [ProducerRecord], unitOf: [Int]?) {
        guard records.count > 1 else { return (records, nil) }
        let counts = partitions.current()
        guard !counts.isEmpty else { return (records, nil) }
        var units: [ProducerRecord] = []
        var unitOf = [Int](repeating: 0, count: records.count)
        // Open packs by topic (its place in `packedTopics`) and partition, in one integer: records are hashed by
        // an integer, not a topic name, and the topic's settings are looked up once per run of records to it.
        var open: [Int: OpenPack] = [:]
        var packedTopics: [(topic: String, count: Int32)] = []
        var last: (topic: String, slot: Int?)?
        var packed = false

        func close(_ key: Int) {
            guard let members = open.removeValue(forKey: key)?.members else { return }
            let unit = units.count
            if members.count == 1 {
                units.append(records[members[0]])
            } else {
                var pack = ProducerRecord(
                    topic: packedTopics[key >> 32].topic, keyOf: records[members[0]],
                    value: RecordPack.encode(records, members: members), partition: Int32(truncatingIfNeeded: key))
                if members.contains(where: { !records[$0].headers.isEmpty }) {
                    let entries: [(part: Int, headers: [KafkaHeader])] = members.indices.compactMap { part in
                        records[members[part]].headers.isEmpty ? nil : (part, records[members[part]].headers)
                    }
                    pack.headers = [KafkaHeader(key: PackHeaders.headerKey, value: PackHeaders.encode(entries))]
                }
                units.append(pack)
                packed = true
            }
            for member in members { unitOf[member] = unit }
        }

        // By index: each record read in place, not copied out.
        for index in records.indices {
            if last?.topic != records[index].topic {
                var slot: Int?
                if topics.contains(records[index].topic), let count = counts[records[index].topic], count > 0 {
                    slot = packedTopics.firstIndex { $0.topic == records[index].topic }
                    if slot == nil {
                        slot = packedTopics.count
                        packedTopics.append((records[index].topic, count))
                    }
                }
                last = (records[index].topic, slot)
            }
            guard let slot = last?.slot, records[index].partition == nil, let keyCount = records[index].keyCount,
                keyCount > 0
            else {
                unitOf[index] = units.count
                units.append(records[index])
                continue
            }
            let partitions = packedTopics[slot].count
            let partition = records[index].withKeyBytes { key in
                key.map { RecordPack.partition(key: $0, partitions: partitions) } ?? 0
            }
            let openKey = slot << 32 | Int(partition)
            var size = RecordPack.size(keyCount: keyCount, value: records[index].value)
            let headers = records[index].headers
            if !headers.isEmpty {
                // What the part adds to the pack's `herald-part-headers`, counted for the largest part index and
                // with room for the header's own bytes, so a pack stays within `maxBytes`.
                size += 16 + PackHeaders.size(part: maxRecords, headers: headers)
            }
            if records[index].value == nil || !headers.allSatisfy({ packableHeaders.contains($0.key) })
                || size > maxBytes / 2
            {
                close(openKey)
                unitOf[index] = units.count
                units.append(records[index])
                continue
            }
            if let current = open[openKey], current.members.count >= maxRecords || current.bytes + size > maxBytes {
                close(openKey)
            }
            open[openKey, default: OpenPack()].add(index, bytes: size)
        }
        // Closed in a fixed order (topic, then partition), whatever the dictionary's.
        for key in open.keys.sorted() { close(key) }
        return packed ? (units, unitOf) : (records, nil)
    }

    /// The records of a pack being filled, and its encoded size so far (8 bytes of header).
    private struct OpenPack {
        var members: [Int] = []
        var bytes = 8

        mutating func add(_ index: Int, bytes size: Int) {
            members.append(index)
            bytes += size
        }
    }
}

/// Partition counts of the packed topics, read in the background (never on the produce path) when the producer
/// starts and again every minute, so a topic that gained partitions is packed for its new count within a minute.
/// Until a topic's count is known its records go unpacked.
final class PartitionCounts: Sendable {
    private struct State {
        var counts: [String: Int32] = [:]
        var due = ContinuousClock.now
        var reading = false
    }

    private let state = Mutex(State())
    private let topics: [String]
    private let admin: KafkaAdminConfiguration
    private let logger: Logger

    init(topics: [String], admin: KafkaAdminConfiguration, logger: Logger) {
        self.topics = topics
        self.admin = admin
        self.logger = logger
    }

    /// The counts known now (starting a refresh when one is due).
    func current() -> [String: Int32] {
        refreshIfDue()
        return state.withLock { $0.counts }
    }

    func refreshIfDue() {
        let start = state.withLock { s -> Bool in
            guard !s.reading, ContinuousClock.now >= s.due else { return false }
            s.reading = true
            return true
        }
        guard start else { return }
        let topics = self.topics
        let admin = self.admin
        let logger = self.logger
        // The short-lived metadata client's own librdkafka logs (connection refused while the broker is down) would
        // repeat every few seconds beside the producer's: only its outcome is logged, here.
        var quiet = logger
        quiet.logLevel = .critical
        Task.detached { [self, quiet] in
            let read: [String: Int]?
            do { read = try await KafkaAdmin.partitionCounts(topics, configuration: admin, logger: quiet) } catch {
                logger.debug("partition counts for packing not read; trying again", metadata: ["error": "\(error)"])
                read = nil
            }
            self.state.withLock { s in
                if let read, !read.isEmpty {
                    s.counts = read.mapValues { Int32(clamping: $0) }
                    s.due = .now + .seconds(60)
                } else {
                    s.due = .now + .seconds(read == nil ? 5 : 2)
                }
                s.reading = false
            }
        }
    }
}

// MARK: - Delivery sinks

/// Receives delivery reports; called on the producer's polling thread.
protocol DeliverySink: AnyObject, Sendable {
    func deliver(_ report: DeliveryReport, index: Int)
}

/// Per-message opaque handed to librdkafka: retained on enqueue, released in the
/// delivery report callback.
final class DeliveryToken: Sendable {
    let sink: any DeliverySink
    let index: Int
    init(sink: any DeliverySink, index: Int) {
        self.sink = sink
        self.index = index
    }
}

/// Collects the reports of one `send` batch and resumes the waiter when all arrived.
final class BatchSink: DeliverySink, @unchecked Sendable {
    // Safe: all mutable state is inside `state`, guarded by its lock.
    private struct State {
        var reports: [DeliveryReport?]
        var remaining: Int
        var waiter: CheckedContinuation<[DeliveryReport], Never>?
    }
    private let state: Mutex<State>

    init(count: Int) {
        state = Mutex(State(reports: Array(repeating: nil, count: count), remaining: count, waiter: nil))
    }

    func deliver(_ report: DeliveryReport, index: Int) {
        let done: (CheckedContinuation<[DeliveryReport], Never>, [DeliveryReport])? = state.withLock { s in
            guard s.reports[index] == nil else { return nil }
            s.reports[index] = report
            s.remaining -= 1
            guard s.remaining == 0, let waiter = s.waiter else { return nil }
            s.waiter = nil
            return (waiter, s.reports.compactMap { $0 })
        }
        if let (waiter, reports) = done { waiter.resume(returning: reports) }
    }

    func wait() async -> [DeliveryReport] {
        await withCheckedContinuation { continuation in
            let ready: [DeliveryReport]? = state.withLock { s in
                if s.remaining == 0 { return s.reports.compactMap { $0 } }
                s.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

final class CallbackSink: DeliverySink, Sendable {
    private let callback: @Sendable (DeliveryReport) -> Void
    init(_ callback: @escaping @Sendable (DeliveryReport) -> Void) { self.callback = callback }
    func deliver(_ report: DeliveryReport, index: Int) { callback(report) }
}

// MARK: - The handle and its polling thread

/// Owns the producer handle and the thread that serves its delivery reports.
///
/// `@unchecked Sendable`: the handle is thread-safe; the flags sit behind `lifecycle`'s
/// lock, and every use of the handle from outside the poll thread happens while holding
/// that lock after checking `destroyed`, so the poll thread never destroys the handle
/// under a concurrent call.
final class ProducerCore: @unchecked Sendable {
    private struct Lifecycle {
        var running = true
        var destroyed = false
        var stopped = false
        var waiters: [CheckedContinuation<Void, Never>] = []
        /// Topic handles by name, so a produce does not look the topic up by name each time.
        var topics: [String: OpaquePointer] = [:]
    }

    let handle: RdKafkaHandle
    let logger: Logger
    private let lifecycle = Mutex(Lifecycle())
    /// `flush` callers: woken by the poll thread when the output queue is empty after a poll (delivery reports
    /// arrive only from `rd_kafka_poll`, so that is where the queue can become empty), or when the handle goes.
    private let flushWaiters = WaitList()
    /// `enqueue` callers waiting for room in librdkafka's local queue: woken after every poll that served delivery
    /// reports (which is when room appears), with a short deadline as a safety net.
    private let roomWaiters = WaitList()
    /// Counts polls that served events, so a waiter can tell that room may have appeared since it last tried.
    private let servedPolls = PollCount()

    init(configuration: KafkaProducerConfiguration, logger: Logger) throws(KafkaError) {
        self.logger = logger
        handle = try RdKafkaHandle(
            type: RD_KAFKA_PRODUCER, properties: LibrdkafkaProperties.producer(configuration), logger: logger,
            threadNice: configuration.client.threadNice
        ) { conf in
            rd_kafka_conf_set_dr_msg_cb(conf) { _, message, _ in
                guard let message, let opaque = message.pointee._private else { return }
                let token = Unmanaged<DeliveryToken>.fromOpaque(opaque).takeRetainedValue()
                let m = message.pointee
                let topic = m.rkt.map { String(cString: rd_kafka_topic_name($0)) } ?? ""
                let report: DeliveryReport
                if m.err == RD_KAFKA_RESP_ERR_NO_ERROR {
                    report = DeliveryReport(
                        topic: topic, partition: m.partition, offset: m.offset >= 0 ? m.offset : nil, error: nil)
                } else {
                    let error = KafkaError.rdkafka(
                        .delivery, m.err, "record not acknowledged",
                        context: ["topic": topic, "partition": String(m.partition)])
                    report = DeliveryReport(topic: topic, partition: m.partition, offset: nil, error: error)
                }
                token.sink.deliver(report, index: token.index)
            }
        }
        let handle = self.handle
        let flushWaiters = self.flushWaiters
        let roomWaiters = self.roomWaiters
        let servedPolls = self.servedPolls
        let timeout = Int32(clamping: max(1, configuration.pollInterval.milliseconds))
        let nice = Int32(clamping: configuration.client.threadNice)
        // Holds the core (its `lifecycle`) until the loop ends: `stop()`, which the producer's deinit calls, ends it.
        let thread = Thread { [self] in
            ThreadNice.apply(nice)
            while lifecycle.withLock({ $0.running }) {
                // With nothing outstanding there is no report to wait for: poll for up to a second (a produce's
                // report, an error event or `stop()`'s yield ends the wait at once).
                let idle = lifecycle.withLock { _ in rd_kafka_outq_len(handle.pointer) == 0 }
                let served = rd_kafka_poll(handle.pointer, idle ? max(timeout, 1000) : timeout)
                if served > 0 {
                    servedPolls.bump()
                    if !roomWaiters.isEmpty { roomWaiters.wakeAll() }
                }
                if !flushWaiters.isEmpty, lifecycle.withLock({ _ in rd_kafka_outq_len(handle.pointer) == 0 }) {
                    flushWaiters.wakeAll()
                }
            }
            // Anything still queued fails now (purge reports) rather than hanging its sender.
            rd_kafka_purge(handle.pointer, Int32(RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT))
            rd_kafka_flush(handle.pointer, 1000)
            rd_kafka_poll(handle.pointer, 0)
            let (waiters, topics) = lifecycle.withLock { s -> ([CheckedContinuation<Void, Never>], [OpaquePointer]) in
                s.destroyed = true
                s.stopped = true
                defer { s.waiters = []; s.topics = [:] }
                return (s.waiters, Array(s.topics.values))
            }
            waiters.forEach { $0.resume() }
            flushWaiters.wakeAll()  // purged: nothing is outstanding any more
            roomWaiters.wakeAll()  // their next try fails with `closed`
            topics.forEach { rd_kafka_topic_destroy($0) }
            // Takes about a second for an idempotent producer; nobody waits for it.
            handle.destroy()
        }
        thread.name = "herald-kafka-producer"
        thread.start()
    }

    func raiseFatalErrorForTesting() {
        lifecycle.withLock { s in
            guard !s.destroyed else { return }
            _ = rd_kafka_test_fatal_error(handle.pointer, RD_KAFKA_RESP_ERR_PRODUCER_FENCED, "raised by a test")
        }
    }

    var fatalError: KafkaError? {
        lifecycle.withLock { s -> KafkaError? in
            guard !s.destroyed else { return nil }
            var errbuf = [CChar](repeating: 0, count: 512)
            let code = rd_kafka_fatal_error(handle.pointer, &errbuf, errbuf.count)
            guard code != RD_KAFKA_RESP_ERR_NO_ERROR else { return nil }
            return KafkaError.rdkafka(.fatal, code, "fatal producer error: \(cStringBuffer(errbuf))")
        }
    }

    var outstanding: Int {
        lifecycle.withLock { s in s.destroyed ? 0 : Int(rd_kafka_outq_len(handle.pointer)) }
    }

    func stop() {
        lifecycle.withLock { s in
            s.running = false
            // Ends the poll thread's current wait at once.
            if !s.destroyed { rd_kafka_yield(handle.pointer) }
        }
    }

    func waitStopped() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let done = lifecycle.withLock { s -> Bool in
                if s.stopped { return true }
                s.waiters.append(c)
                return false
            }
            if done { c.resume() }
        }
    }

    /// Enqueues, waiting (without blocking a thread) while the local queue is full: woken by the poll thread
    /// when delivery reports free room, at the latest after 50 ms.
    func enqueue(_ record: ProducerRecord, sink: any DeliverySink, index: Int) async throws(KafkaError) {
        while true {
            let polls = servedPolls.value
            do {
                try enqueueNow(record, sink: sink, index: index)
                return
            } catch  where error.librdkafkaCode == RD_KAFKA_RESP_ERR__QUEUE_FULL.rawValue {
                let servedPolls = self.servedPolls
                _ = await roomWaiters.wait(timeout: .milliseconds(50), unlessAlready: { servedPolls.value != polls })
            } catch  where error.code == .closed || error.code == .fatal {
                throw error
            } catch {
                // Rejected locally (e.g. too large, unknown partition): report it as this record's failure.
                sink.deliver(
                    DeliveryReport(topic: record.topic, partition: record.partition ?? -1, offset: nil, error: error),
                    index: index)
                return
            }
        }
    }

    /// One `rd_kafka_produceva` call. The value is handed over with `RD_KAFKA_MSG_F_FREE`
    /// (one copy); key and headers are copied by librdkafka.
    func enqueueNow(_ record: ProducerRecord, sink: any DeliverySink, index: Int) throws(KafkaError) {
        var transient: [UnsafeMutableRawPointer] = []
        defer { transient.forEach { free($0) } }
        func copy(_ bytes: [UInt8]) -> UnsafeMutableRawPointer? {
            guard let p = malloc(max(1, bytes.count)) else { return nil }
            bytes.withUnsafeBytes { if let base = $0.baseAddress { p.copyMemory(from: base, byteCount: bytes.count) } }
            return p
        }
        func cString(_ s: String) -> UnsafePointer<CChar>? {
            guard let p = strdup(s) else { return nil }
            transient.append(UnsafeMutableRawPointer(p))
            return UnsafePointer(p)
        }

        var vus: [rd_kafka_vu_t] = []
        vus.reserveCapacity(6 + record.headers.count)
        var vu = rd_kafka_vu_t()
        vu.vtype = RD_KAFKA_VTYPE_TOPIC  // replaced by the cached topic handle below
        vus.append(vu)
        if let partition = record.partition {
            vu = rd_kafka_vu_t()
            vu.vtype = RD_KAFKA_VTYPE_PARTITION
            vu.u.i32 = partition
            vus.append(vu)
        }
        var payload: UnsafeMutableRawPointer?
        if let value = record.value {
            payload = copy(value)
            guard payload != nil else { throw KafkaError(code: .produce, reason: "out of memory copying value") }
            vu = rd_kafka_vu_t()
            vu.vtype = RD_KAFKA_VTYPE_VALUE
            vu.u.mem.ptr = payload
            vu.u.mem.size = value.count
            vus.append(vu)
        }
        // librdkafka copies the key before `rd_kafka_produceva` returns: the call below reads it in place.
        // Its pointer and size are filled in around the call, where the key's bytes are at hand.
        var keySlot: Int?
        if record.keyCount != nil {
            keySlot = vus.count
            vu = rd_kafka_vu_t()
            vu.vtype = RD_KAFKA_VTYPE_KEY
            vus.append(vu)
        }
        // The headers go in as one list of our own (`VTYPE_HEADERS`): the message takes it over when the call
        // succeeds, and it stays ours (destroyed below) when the call fails. Not header by header
        // (`VTYPE_HEADER`): librdkafka builds that list itself and, when the partitioner refuses the message (a
        // topic that does not exist, a partition it does not have), frees it twice (librdkafka issue 4627).
        var headers: OpaquePointer?
        if !record.headers.isEmpty {
            headers = rd_kafka_headers_new(record.headers.count)
            for header in record.headers {
                let added: rd_kafka_resp_err_t
                if let value = header.value {
                    added = value.withUnsafeBytes { bytes in
                        // A non-null pointer for an empty value: a null one would be a header without a value.
                        var empty: UInt8 = 0
                        return withUnsafeMutableBytes(of: &empty) { fallback in
                            rd_kafka_header_add(
                                headers, header.key, -1, bytes.baseAddress ?? UnsafeRawPointer(fallback.baseAddress),
                                bytes.count)
                        }
                    }
                } else {
                    added = rd_kafka_header_add(headers, header.key, -1, nil, 0)
                }
                if added != RD_KAFKA_RESP_ERR_NO_ERROR {
                    rd_kafka_headers_destroy(headers)
                    if let payload { free(payload) }
                    throw KafkaError.rdkafka(.produce, added, "header not added", context: ["topic": record.topic])
                }
            }
            vu = rd_kafka_vu_t()
            vu.vtype = RD_KAFKA_VTYPE_HEADERS
            vu.u.headers = headers
            vus.append(vu)
        }
        vu = rd_kafka_vu_t()
        vu.vtype = RD_KAFKA_VTYPE_MSGFLAGS
        vu.u.i = RD_KAFKA_MSG_F_FREE
        vus.append(vu)
        let token = Unmanaged.passRetained(DeliveryToken(sink: sink, index: index))
        vu = rd_kafka_vu_t()
        vu.vtype = RD_KAFKA_VTYPE_OPAQUE
        vu.u.ptr = token.toOpaque()
        vus.append(vu)

        let enqueued: Result<Void, KafkaError> = lifecycle.withLock { s in
            guard s.running, !s.destroyed else {
                return .failure(
                    KafkaError(code: .closed, reason: "producer is shut down", context: ["topic": record.topic]))
            }
            if let rkt = s.topics[record.topic] ?? rd_kafka_topic_new(handle.pointer, record.topic, nil) {
                s.topics[record.topic] = rkt
                vus[0].vtype = RD_KAFKA_VTYPE_RKT
                vus[0].u.rkt = rkt
            } else {
                vus[0].u.cstr = cString(record.topic)
            }
            // An empty key is a key (a null pointer would be none): it points at `empty`, of which librdkafka
            // reads nothing.
            var empty: UInt8 = 0
            let error = withUnsafeMutableBytes(of: &empty) { empty in
                record.withKeyBytes { key -> OpaquePointer? in
                    if let slot = keySlot, let key {
                        vus[slot].u.mem.ptr = UnsafeMutableRawPointer(mutating: key.baseAddress) ?? empty.baseAddress
                        vus[slot].u.mem.size = key.count
                    }
                    return rd_kafka_produceva(handle.pointer, vus, vus.count)
                }
            }
            guard let error else { return .success(()) }
            return .failure(KafkaError.consuming(.produce, error, "enqueue failed", context: ["topic": record.topic]))
        }
        if case .failure(let error) = enqueued {
            token.release()
            if let payload { free(payload) }  // not taken over on failure
            if let headers { rd_kafka_headers_destroy(headers) }  // nor are the headers
            throw error
        }
    }

    /// Waits until every enqueued record got its delivery report: woken by the poll thread, not by polling.
    func flush(timeout: Duration) async throws(KafkaError) {
        _ = await flushWaiters.wait(timeout: timeout, unlessAlready: { [self] in outstanding == 0 })
        let pending = outstanding
        if pending > 0 {
            throw KafkaError(
                code: .flushTimeout, reason: "records still unacknowledged after \(timeout)",
                context: ["outstanding": String(pending)])
        }
    }
}

/// How many polls of the producer's thread served events (delivery reports): a waiter for room in the queue reads
/// it before trying, and knows room may have appeared when it changed.
final class PollCount: Sendable {
    private let count = Mutex<UInt64>(0)
    var value: UInt64 { count.withLock { $0 } }
    func bump() { count.withLock { $0 &+= 1 } }
}
