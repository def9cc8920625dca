import CRdKafka
import Foundation
import Logging
import Metrics
import Synchronization

/// A Kafka consumer-group member that hands out records in batches and advances its
/// committed offsets only past records the caller marked complete.
///
/// - A thread of its own polls librdkafka (`rd_kafka_consumer_poll`), serves rebalance
///   callbacks, fetches up to `prefetchBatches × batchSize` records ahead and pauses
///   fetching beyond that, so memory stays bounded when the caller is slow.
/// - `nextBatch()` (or the `batches` sequence) returns what is there, up to `batchSize`
///   records, at once; only when nothing is there does it wait, until a record arrives or
///   `batchMaxWait` passed (then it returns an empty batch).
/// - `complete(_:)` marks records done (call it after their outputs were acknowledged).
///   Completions may come in any order; per partition the consumer stores
///   (`rd_kafka_offsets_store`) only the low-water mark of contiguous completed records,
///   and librdkafka commits stored offsets every `autoCommitInterval`, on every
///   rebalance and on `shutdown()`.
/// - Rebalancing is cooperative by default (`cooperative-sticky`; `RebalanceProtocol`): a rebalance
///   revokes only the partitions that move. On revoke, prefetched records of those partitions are
///   given back, the records the caller holds get `revokeDrainTimeout` to complete, stored offsets
///   are committed, and records of those partitions completed later are ignored (the new owner
///   redelivers them); on assign, tracking starts fresh from the committed offsets. The eager
///   protocol revokes the whole assignment the same way.
/// - `pause()` / `resume()` stop and restart fetching on the whole assignment
///   (`rd_kafka_pause_partitions`); already prefetched records are still handed out.
/// - `lag` is per-partition high watermark minus position, refreshed every `lagInterval`
///   (the stage loop exports it as `herald_consumer_lag`; the adapter exports no gauge of its own).
///
/// Use it from one task at a time for `nextBatch` (completions may come from any task).
public final class KafkaConsumer: Sendable {
    private let core: ConsumerCore
    public let configuration: KafkaConsumerConfiguration

    /// Creates the consumer, subscribes to `configuration.topics` and starts polling.
    public init(
        configuration: KafkaConsumerConfiguration, logger: Logger = Logger(label: "herald.kafka.consumer")
    ) throws(KafkaError) {
        guard configuration.batchSize > 0 else {
            throw KafkaError(code: .configuration, reason: "batchSize must be positive")
        }
        guard !configuration.topics.isEmpty else {
            throw KafkaError(code: .configuration, reason: "no topics to subscribe to")
        }
        self.configuration = configuration
        self.core = try ConsumerCore(configuration: configuration, logger: logger)
    }

    deinit { core.requestStop() }

    /// The next batch: up to `batchSize` records, possibly empty when nothing arrived within
    /// `batchMaxWait`. `nil` once the consumer is shut down. Throws on a fatal client error.
    public func nextBatch() async throws(KafkaError) -> [ConsumerRecord]? {
        try await core.nextBatch()
    }

    /// Non-empty batches until the consumer is shut down.
    public var batches: Batches { Batches(consumer: self) }

    /// Marks a record done: its outputs were acknowledged, its offset may be committed
    /// once every earlier record of its partition is done too.
    public func complete(_ record: ConsumerRecord) { core.complete([record]) { _ in true } }

    /// Marks records done (any order, any partitions).
    public func complete<S: Sequence>(_ records: S) where S.Element == ConsumerRecord {
        core.complete(Array(records)) { _ in true }
    }

    /// Marks done the records of `batch` at the positions `include` accepts, read in place (no record is copied).
    public func complete(_ batch: [ConsumerRecord], where include: (Int) -> Bool) {
        core.complete(batch, where: include)
    }

    /// Stops fetching on every assigned partition (and on partitions assigned later)
    /// until `resume()`. Group membership and heartbeats continue.
    public func pause() { core.setUserPaused(true) }

    /// Resumes fetching after `pause()`.
    public func resume() { core.setUserPaused(false) }

    public var isPaused: Bool { core.isUserPaused }

    /// Whether the idle backoff (`idleAfter`) has paused fetching because nothing arrived: the consumer then only
    /// probes the end offsets every `idleProbeInterval`.
    public var isIdle: Bool { core.isIdle }

    /// Ends the idle state now, as a probe that found records would: fetching resumes at once and stays on until
    /// nothing arrived for `idleAfter` again. For a doorbell: another process says it just produced to one of this
    /// consumer's topics, so the consumer need not wait for its next probe. Harmless when not idle (it only keeps
    /// the consumer fetching for another `idleAfter`) and without an idle backoff (nothing happens).
    public func wake() { core.wake() }

    /// True once the member joined its group and received its first assignment (which may be empty: more
    /// members than partitions). Until then nothing it is subscribed to is fetched; a join takes about half of
    /// `session.timeout.ms` on Tansu.
    public var hasJoinedGroup: Bool { core.hasJoinedGroup }

    /// The partitions currently assigned to this member.
    public var assignment: [TopicPartition] { core.assignment }

    /// Every partition revoked from this member since it started, in order (a partition revoked twice is listed
    /// twice). Under the cooperative protocol only the partitions that moved; under the eager one the whole
    /// assignment at every rebalance.
    public var revokedPartitions: [TopicPartition] { core.revokedPartitions }

    /// Revokes whose commit the broker refused (for example `REBALANCE_IN_PROGRESS`: the group began another
    /// rebalance meanwhile). The work those partitions completed since their last commit is then done again by
    /// their new owner: at least once, never lost.
    public var revokeCommitsFailed: Int { core.revokeCommitsFailed }

    /// True while a revoke waits for the records handed out from its partitions to complete
    /// (`revokeDrainTimeout`).
    public var isHandingOver: Bool { core.isHandingOver }

    /// Last measured lag per assigned partition (high watermark - position); partitions
    /// whose position is not known yet are absent.
    public var lag: [TopicPartition: Int64] { core.lagSnapshot }

    /// Records fetched (prefetched or handed out) whose offsets are not committable yet:
    /// not completed, or completed behind an earlier record that is not. 0 when all done.
    public var outstanding: Int { core.outstanding }

    /// Commits the stored offsets now (synchronously against the broker, on the poll thread).
    /// Succeeds when there was nothing to commit.
    public func commit() async throws(KafkaError) { try await core.commit() }

    /// The group's committed offsets for `partitions`, as the broker reports them
    /// (-1001 for none). Intended for tests and `heraldctl`.
    public func committed(
        _ partitions: [TopicPartition], timeout: Duration = .seconds(5)
    ) async throws(KafkaError) -> [TopicPartition: Int64] {
        try await core.committed(partitions, timeout: timeout)
    }

    /// Stops handing out records, commits what is stored, leaves the group
    /// (`rd_kafka_consumer_close`) and destroys the handle. Idempotent. A pending
    /// `nextBatch` returns `nil`.
    public func shutdown() async { await core.shutdown() }

    /// An `AsyncSequence` of non-empty batches, ending when the consumer shuts down.
    public struct Batches: AsyncSequence, Sendable {
        public typealias Element = [ConsumerRecord]
        let consumer: KafkaConsumer
        public struct AsyncIterator: AsyncIteratorProtocol {
            let consumer: KafkaConsumer
            public mutating func next() async throws(KafkaError) -> [ConsumerRecord]? {
                while true {
                    guard let batch = try await consumer.nextBatch() else { return nil }
                    if !batch.isEmpty { return batch }
                    if Task.isCancelled { return nil }
                }
            }
        }
        public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(consumer: consumer) }
    }
}

// MARK: - The core: state behind one lock, driven by one thread

/// `@unchecked Sendable`: all mutable state is in `state` (behind its lock); the
/// librdkafka handle is thread-safe and is destroyed only by the poll thread after
/// `state.closed` was set under the lock, which every outside caller checks first.
final class ConsumerCore: @unchecked Sendable {
    typealias BatchResult = Result<[ConsumerRecord]?, KafkaError>

    private struct Waiter {
        let continuation: CheckedContinuation<BatchResult, Never>
        let deadline: ContinuousClock.Instant
    }

    private struct Tracked {
        let epoch: UInt64
        var tracker = PartitionOffsetTracker()
    }

    private struct State {
        var buffer = RecordBuffer()
        var waiter: Waiter?
        var epochs: [TopicPartition: UInt64] = [:]
        var trackers: [TopicPartition: Tracked] = [:]
        var nextEpoch: UInt64 = 1
        /// Set by the first assignment (possibly empty) after joining the group.
        var joined = false
        var userPaused = false
        var flow: FetchFlowControl
        var stopRequested = false
        var closed = false
        var fatal: KafkaError?
        var commands: [(OpaquePointer?) -> Void] = []
        var lag: [TopicPartition: Int64] = [:]
        var stopWaiters: [CheckedContinuation<Void, Never>] = []
        var exited = false
        /// A revoke is waiting for handed-out records of its partitions to complete (`drainRevoked`).
        var draining = false
        var revoked: [TopicPartition] = []
        var revokeCommitsFailed = 0
    }

    private let state: Mutex<State>
    /// Signalled when the caller takes records from a full buffer (the poll thread waits on it instead of polling).
    private let room = DispatchSemaphore(value: 0)
    /// Signalled by completions while a revoke waits for them (`drainRevoked`).
    private let drained = DispatchSemaphore(value: 0)
    private let handle: RdKafkaHandle
    private let logger: Logger
    private let configuration: KafkaConsumerConfiguration
    private let capacity: Int
    private let pollSliceMs: Int32
    private let errorCounter: Counter
    private let assignedCounter: Counter
    private let revokedCounter: Counter
    /// The consumer queue `rd_kafka_consumer_poll` waits on (a reference of our own, released in `finish`, under the
    /// state lock): `rd_kafka_queue_yield` on it ends a long idle poll at once (a wake, a command, a stop request).
    nonisolated(unsafe) private var consumerQueue: OpaquePointer?

    init(configuration: KafkaConsumerConfiguration, logger: Logger) throws(KafkaError) {
        self.configuration = configuration
        self.logger = logger
        self.capacity = configuration.prefetchCapacity
        self.state = Mutex(State(flow: FetchFlowControl(capacity: capacity, idle: configuration.idlePolicy)))
        let wait = configuration.batchMaxWait.milliseconds
        self.pollSliceMs = Int32(clamping: min(50, max(1, wait / 2)))
        self.errorCounter = Counter(
            label: "\(configuration.metricsPrefix)_consumer_errors_total",
            dimensions: [("group", configuration.groupID)])
        self.assignedCounter = Counter(
            label: "\(configuration.metricsPrefix)_partitions_assigned_total",
            dimensions: [("group", configuration.groupID)])
        self.revokedCounter = Counter(
            label: "\(configuration.metricsPrefix)_partitions_revoked_total",
            dimensions: [("group", configuration.groupID)])
        handle = try RdKafkaHandle(
            type: RD_KAFKA_CONSUMER, properties: LibrdkafkaProperties.consumer(configuration), logger: logger,
            threadNice: configuration.client.threadNice
        ) { conf in
            rd_kafka_conf_set_offset_commit_cb(conf) { _, err, offsets, opaque in
                guard err != RD_KAFKA_RESP_ERR_NO_ERROR, err != RD_KAFKA_RESP_ERR__NO_OFFSET, let opaque else { return }
                let ctx = Unmanaged<CallbackContext>.fromOpaque(opaque).takeUnretainedValue()
                let partitions = readPartitionList(offsets).map { "\($0.0)@\($0.1)" }.joined(separator: ",")
                ctx.logger.warning(
                    "offset commit failed",
                    metadata: [
                        "code": .string(String(cString: rd_kafka_err2name(err))), "partitions": .string(partitions),
                    ])
                ctx.consumer?.countError()
            }
            rd_kafka_conf_set_rebalance_cb(conf) { rk, err, partitions, opaque in
                guard let rk else { return }
                let consumer =
                    opaque.map { Unmanaged<CallbackContext>.fromOpaque($0).takeUnretainedValue().consumer } ?? nil
                if let consumer {
                    consumer.rebalance(rk, err, partitions)
                } else if err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS {
                    rd_kafka_assign(rk, partitions)
                } else {
                    rd_kafka_assign(rk, nil)
                }
            }
        }
        handle.callbackContext.consumer = self
        // (Auto-commit results are logged by the offset-commit callback installed above.)
        rd_kafka_poll_set_consumer(handle.pointer)
        consumerQueue = rd_kafka_queue_get_consumer(handle.pointer)

        let topics = makePartitionList(configuration.topics.map { (TopicPartition(topic: $0, partition: -1), nil) })
        defer { rd_kafka_topic_partition_list_destroy(topics) }
        let err = rd_kafka_subscribe(handle.pointer, topics)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            handle.destroy()
            throw KafkaError.rdkafka(
                .subscribe, err, "subscribe failed", context: ["topics": configuration.topics.joined(separator: ",")])
        }

        let nice = Int32(clamping: configuration.client.threadNice)
        let thread = Thread { [self] in
            ThreadNice.apply(nice)
            self.runLoop()
        }
        thread.name = "herald-kafka-consumer"
        thread.start()
    }

    // MARK: Caller-facing operations

    func nextBatch() async throws(KafkaError) -> [ConsumerRecord]? {
        let maxWait = configuration.batchMaxWait
        let n = configuration.batchSize
        let result: BatchResult = await withCheckedContinuation { continuation in
            let immediate: BatchResult? = state.withLock { s in
                if let fatal = s.fatal { return .failure(fatal) }
                if s.stopRequested || s.closed { return .success(nil) }
                if !s.buffer.isEmpty { return .success(self.takeAndSignal(&s, n)) }
                if s.waiter != nil {
                    return .failure(KafkaError(code: .consume, reason: "nextBatch called concurrently"))
                }
                // An idle consumer's records come only with its next probe: the caller waits longer between empty
                // batches (a record still ends the wait at once).
                let wait = s.flow.isIdle ? max(maxWait, self.configuration.idleProbeInterval) : maxWait
                s.waiter = Waiter(continuation: continuation, deadline: .now + wait)
                return nil
            }
            if let immediate { continuation.resume(returning: immediate) }
        }
        return try result.get()
    }

    func complete(_ records: [ConsumerRecord], where include: (Int) -> Bool) {
        state.withLock { s in
            guard !s.closed else { return }
            var toStore: [TopicPartition: Int64] = [:]
            // The parts of a pack come one after another: each run of parts of one record is completed in one step.
            var run: (first: Int, parts: Int)?
            func completeRun() {
                guard let (first, parts) = run else { return }
                let tp = records[first].topicPartition
                // In place: a copy of the tracker taken out of the dictionary would copy its offsets to change them.
                guard s.trackers[tp]?.epoch == records[first].epoch else { return }
                if let committable = s.trackers[tp]?.tracker.complete(records[first].offset, parts: parts) {
                    toStore[tp] = committable
                }
            }
            for index in records.indices where include(index) {
                if let current = run, records[current.first].offset == records[index].offset,
                    records[current.first].partition == records[index].partition,
                    records[current.first].epoch == records[index].epoch,
                    records[current.first].topic == records[index].topic
                {
                    run?.parts += 1
                    continue
                }
                completeRun()
                run = (index, 1)
            }
            completeRun()
            if s.draining { drained.signal() }
            guard !toStore.isEmpty else { return }
            // Stored under the lock so a concurrent revoke never sees a half-applied store.
            let list = makePartitionList(toStore.map { ($0.key, $0.value) })
            defer { rd_kafka_topic_partition_list_destroy(list) }
            let err = rd_kafka_offsets_store(handle.pointer, list)
            if err != RD_KAFKA_RESP_ERR_NO_ERROR {
                logger.debug(
                    "offset store partially failed",
                    metadata: ["error": .string(String(cString: rd_kafka_err2name(err)))])
            }
        }
    }

    func countError() { errorCounter.increment() }

    func setUserPaused(_ paused: Bool) { state.withLock { $0.userPaused = paused } }
    var isUserPaused: Bool { state.withLock { $0.userPaused } }
    var assignment: [TopicPartition] {
        state.withLock { s in s.epochs.keys.sorted { ($0.topic, $0.partition) < ($1.topic, $1.partition) } }
    }
    var lagSnapshot: [TopicPartition: Int64] { state.withLock { $0.lag } }
    var hasJoinedGroup: Bool { state.withLock { $0.joined } }
    var revokedPartitions: [TopicPartition] { state.withLock { $0.revoked } }
    var revokeCommitsFailed: Int { state.withLock { $0.revokeCommitsFailed } }
    var isHandingOver: Bool { state.withLock { $0.draining } }
    var outstanding: Int { state.withLock { s in s.trackers.values.reduce(0) { $0 + $1.tracker.outstanding } } }

    var isIdle: Bool { state.withLock { $0.flow.isIdle } }

    func wake() {
        guard configuration.idlePolicy != nil else { return }
        let now = ContinuousClock.now
        state.withLock { s in
            guard !s.exited else { return }
            s.flow.wake(now: now)
            // The poll thread may be blocked in a long idle poll: make it return and act on the wake now.
            self.yieldPoll()
        }
    }

    func commit() async throws(KafkaError) {
        let result: Result<Void, KafkaError> = await runOnPollThread { rk in
            let err = rd_kafka_commit(rk, nil, 0)
            if err == RD_KAFKA_RESP_ERR_NO_ERROR || err == RD_KAFKA_RESP_ERR__NO_OFFSET { return .success(()) }
            return .failure(
                KafkaError.rdkafka(.commit, err, "commit failed", context: ["group": self.configuration.groupID]))
        }
        try result.get()
    }

    func committed(
        _ partitions: [TopicPartition], timeout: Duration
    ) async throws(KafkaError) -> [TopicPartition: Int64] {
        let result: Result<[TopicPartition: Int64], KafkaError> = await runOnPollThread { rk in
            let list = makePartitionList(partitions.map { ($0, nil) })
            defer { rd_kafka_topic_partition_list_destroy(list) }
            let err = rd_kafka_committed(rk, list, Int32(clamping: timeout.milliseconds))
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR else {
                return .failure(KafkaError.rdkafka(.commit, err, "reading committed offsets failed"))
            }
            var offsets: [TopicPartition: Int64] = [:]
            for (tp, offset, _) in readPartitionList(list) { offsets[tp] = offset }
            return .success(offsets)
        }
        return try result.get()
    }

    /// Runs `body` on the poll thread between polls (for blocking librdkafka calls).
    private func runOnPollThread<T: Sendable>(
        _ body: @escaping @Sendable (OpaquePointer) -> Result<T, KafkaError>
    ) async -> Result<T, KafkaError> {
        await withCheckedContinuation { (continuation: CheckedContinuation<Result<T, KafkaError>, Never>) in
            let accepted = state.withLock { s -> Bool in
                guard !s.exited, !s.closed else { return false }
                s.commands.append { rk in
                    guard let rk else {
                        continuation.resume(
                            returning: .failure(KafkaError(code: .closed, reason: "consumer is shut down")))
                        return
                    }
                    continuation.resume(returning: body(rk))
                }
                self.yieldPoll()
                return true
            }
            if !accepted {
                continuation.resume(returning: .failure(KafkaError(code: .closed, reason: "consumer is shut down")))
            }
        }
    }

    func requestStop() {
        state.withLock { s in
            s.stopRequested = true
            if !s.exited { self.yieldPoll() }
        }
    }

    /// Ends the poll thread's current `rd_kafka_consumer_poll` at once (or the next one, if it is not polling).
    /// Called under the state lock while not `exited`, so the queue is still ours.
    private func yieldPoll() {
        if let queue = consumerQueue { rd_kafka_queue_yield(queue) }
    }

    func shutdown() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = state.withLock { s -> Bool in
                s.stopRequested = true
                if s.exited { return true }
                self.yieldPoll()
                s.stopWaiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }

    // MARK: The poll thread

    /// Takes a batch (under the state lock) and, if the buffer was full, wakes the poll thread waiting for room.
    private func takeAndSignal(_ s: inout State, _ n: Int) -> [ConsumerRecord] {
        let wasFull = s.buffer.count >= capacity
        let batch = s.buffer.take(n)
        if wasFull { room.signal() }
        return batch
    }

    /// The poll thread's loop; `FetchFlowControl` decides when to wait or pause.
    private func runLoop() {
        let rk = handle.pointer
        var nextLag = ContinuousClock.now + configuration.lagInterval
        while true {
            // 1. Commands, stop requests, pause/resume and fetch decisions.
            let now = ContinuousClock.now
            let shared = configuration.activity?.lastRecords
            let (commands, stop, decision) = state.withLock {
                s -> ([(OpaquePointer?) -> Void], Bool, FetchFlowControl.Decision) in
                let commands = s.commands
                s.commands = []
                let decision = s.flow.decide(
                    buffered: s.buffer.count, userPaused: s.userPaused, now: now, shared: shared)
                return (commands, s.stopRequested || s.fatal != nil, decision)
            }
            commands.forEach { $0(rk) }
            if stop { break }
            if let pause = decision.pause { applyPause(pause, rk) }
            if decision.probe { probeIdle(rk) }

            // 2. Poll: records, errors, or callbacks (rebalance, commits, logs). After the
            //    first record, drain what is already queued (up to a batch) without waiting,
            //    then append it all under one lock. With a full buffer, wait instead
            //    (unless stall-paused, when polling returns only events).
            switch decision.fetch {
            case .wait: _ = room.wait(timeout: .now() + .milliseconds(50))
            case .poll: pollAndBuffer(rk, sliceMs: idleSlice(until: decision.idleUntil))
            }

            // 3. Hand a batch to a waiting caller if it is full or its time is up.
            serveWaiter()

            // 4. Lag gauges.
            if ContinuousClock.now >= nextLag {
                refreshLag(rk)
                nextLag = .now + configuration.lagInterval
            }
        }
        finish(rk)
    }

    /// Topic names by librdkafka topic handle, so a record does not build its topic's name again (poll thread only).
    private var topicNames: [OpaquePointer: String] = [:]

    private func topicName(_ rkt: OpaquePointer) -> String {
        if let name = topicNames[rkt] { return name }
        let name = String(cString: rd_kafka_topic_name(rkt))
        topicNames[rkt] = name
        return name
    }

    /// Bumped by every rebalance callback; read and written on the poll thread only.
    private var rebalanceGeneration: UInt64 = 0

    /// The poll slice: the usual one, or while idle and paused up to the next probe or the waiting caller's
    /// deadline, whichever comes first (at most 1 s). A wake, a command or a stop request ends the poll at once
    /// (`yieldPoll`); rebalances and errors arrive through the polled queue.
    private func idleSlice(until next: ContinuousClock.Instant?) -> Int32 {
        guard var next else { return pollSliceMs }
        if let deadline = state.withLock({ $0.waiter?.deadline }), deadline < next { next = deadline }
        let left = (next - .now).milliseconds
        return Int32(clamping: min(1000, max(Int64(pollSliceMs), left)))
    }

    private func pollAndBuffer(_ rk: OpaquePointer, sliceMs: Int32) {
        guard let first = rd_kafka_consumer_poll(rk, sliceMs) else { return }
        // (When stall-paused the buffer may be full; a record still arriving is kept anyway.)
        let limit = state.withLock { min(max(1, capacity - $0.buffer.count), configuration.batchSize) }
        var generation = rebalanceGeneration
        // (A rebalance served inside the first poll has already happened: what that poll returned is current.)
        revokedDuringPoll = []
        // The messages of this poll, taken first and buffered together (under one lock, so the caller sees all of
        // them or none, as a full batch): each is copied out of librdkafka once, straight into the buffer.
        var messages: [UnsafeMutablePointer<rd_kafka_message_t>] = []
        var records = 0
        var next: UnsafeMutablePointer<rd_kafka_message_t>? = first
        while let message = next {
            if let count = recordCount(message) {
                messages.append(message)
                records += count
            } else {
                rd_kafka_message_destroy(message)
            }
            if records >= limit { break }
            next = rd_kafka_consumer_poll(rk, 0)
            if rebalanceGeneration != generation {
                // Records taken from partitions revoked meanwhile will be fetched again from the committed offsets
                // (by whichever member owns them now); those of partitions still ours are kept (a cooperative
                // rebalance leaves them, and librdkafka will not hand them out again). `next` came after it.
                dropRevoked(&messages)
                generation = rebalanceGeneration
                revokedDuringPoll = []
            }
        }
        defer { messages.forEach { rd_kafka_message_destroy($0) } }
        guard !messages.isEmpty else { return }
        let now = ContinuousClock.now
        configuration.activity?.noteRecords(now: now)
        let runLimit = configuration.batchSize
        state.withLock { s in
            s.flow.noteRecords(now: now)
            for message in messages {
                let m = message.pointee
                let topic = m.rkt.map(topicName) ?? ""
                let tp = TopicPartition(topic: topic, partition: m.partition)
                guard let epoch = s.epochs[tp] else { continue }  // no longer ours
                let added = s.buffer.append(
                    copying: message, topic: topic, epoch: epoch, runLimit: runLimit, unpack: unpacks(topic))
                if s.trackers[tp]?.epoch != epoch { s.trackers[tp] = Tracked(epoch: epoch) }
                s.trackers[tp]?.tracker.delivered(m.offset, parts: added)
            }
        }
    }

    private func dropRevoked(_ messages: inout [UnsafeMutablePointer<rd_kafka_message_t>]) {
        guard !revokedDuringPoll.isEmpty else { return }
        messages.removeAll { message in
            let m = message.pointee
            let tp = TopicPartition(topic: m.rkt.map(topicName) ?? "", partition: m.partition)
            guard revokedDuringPoll.contains(tp) else { return false }
            rd_kafka_message_destroy(message)
            return true
        }
    }

    /// How many records a consumed message holds (a pack's part count, as its header gives it); nil for an error
    /// (logged, counted; a fatal error is kept to be thrown).
    private func recordCount(_ message: UnsafeMutablePointer<rd_kafka_message_t>) -> Int? {
        let m = message.pointee
        guard m.err == RD_KAFKA_RESP_ERR_NO_ERROR else {
            if m.err == RD_KAFKA_RESP_ERR__PARTITION_EOF { return nil }
            errorCounter.increment()
            if m.err == RD_KAFKA_RESP_ERR__FATAL {
                var errbuf = [CChar](repeating: 0, count: 512)
                let code = rd_kafka_fatal_error(handle.pointer, &errbuf, errbuf.count)
                let error = KafkaError.rdkafka(.fatal, code, "fatal consumer error: \(cStringBuffer(errbuf))")
                logger.error("kafka consumer fatal error", metadata: ["error": .string(error.description)])
                state.withLock { $0.fatal = error }
                return nil
            }
            let detail =
                m.payload.map { String(decoding: UnsafeRawBufferPointer(start: $0, count: m.len), as: UTF8.self) } ?? ""
            logger.warning(
                "kafka consumer error",
                metadata: [
                    "code": .string(String(cString: rd_kafka_err2name(m.err))),
                    "topic": .string(m.rkt.map(topicName) ?? ""),
                    "partition": .stringConvertible(m.partition), "detail": .string(detail),
                ])
            return nil
        }
        guard unpacks(m.rkt.map(topicName) ?? "") else { return 1 }
        return m.payload.map { RecordPack.declaredCount(UnsafeRawBufferPointer(start: $0, count: m.len)) } ?? 1
    }

    /// Whether `topic`'s records may be packs (`packedTopics`).
    private func unpacks(_ topic: String) -> Bool { configuration.packedTopics?.contains(topic) ?? true }

    private func serveWaiter() {
        let n = configuration.batchSize
        let ready: (CheckedContinuation<BatchResult, Never>, BatchResult)? = state.withLock { s in
            guard let waiter = s.waiter else { return nil }
            if let fatal = s.fatal {
                s.waiter = nil
                return (waiter.continuation, .failure(fatal))
            }
            guard !s.buffer.isEmpty || ContinuousClock.now >= waiter.deadline else { return nil }
            s.waiter = nil
            return (waiter.continuation, .success(self.takeAndSignal(&s, n)))
        }
        if let (continuation, result) = ready { continuation.resume(returning: result) }
    }

    private func applyPause(_ pause: Bool, _ rk: OpaquePointer) {
        var current: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?
        guard rd_kafka_assignment(rk, &current) == RD_KAFKA_RESP_ERR_NO_ERROR, let current else { return }
        defer { rd_kafka_topic_partition_list_destroy(current) }
        guard current.pointee.cnt > 0 else { return }
        let err = pause ? rd_kafka_pause_partitions(rk, current) : rd_kafka_resume_partitions(rk, current)
        if err != RD_KAFKA_RESP_ERR_NO_ERROR {
            logger.warning("pause/resume failed", metadata: ["error": .string(String(cString: rd_kafka_err2name(err)))])
        }
        if !pause {
            restartFetching(rk, current)
            nudgeBrokers(rk, current)
        }
    }

    /// A resume (and the seek after it) is handled on librdkafka's main thread; the broker thread that fetches acts
    /// on it only when it next wakes, which with nothing else to do is up to a second later (it blocks for at most
    /// 1 s; measured with 2.8 against Tansu: 0.4-1 s at every idle stage). A request to each partition's leader wakes
    /// its broker thread, which then decides on its fetches at once: the end offsets of the resumed partitions (one
    /// ListOffsets request per leader; the answer is not needed).
    private func nudgeBrokers(
        _ rk: OpaquePointer, _ partitions: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>
    ) {
        let ends = makePartitionList(readPartitionList(partitions).map { ($0.0, Int64(RD_KAFKA_OFFSET_END)) })
        defer { rd_kafka_topic_partition_list_destroy(ends) }
        // As generous as the idle probe's timeout, for the same reason (`probeIdle`).
        _ = rd_kafka_offsets_for_times(rk, ends, 10_000)
    }

    /// After a resume librdkafka fetches again only about a second later (measured with 2.8 against Tansu);
    /// seeking each partition to its current position (the next offset to hand out) starts the fetch at once.
    /// Partitions without a position yet (nothing handed out since the assignment) are left as they are: their
    /// start is the committed offset, which a seek here could skip past.
    private func restartFetching(
        _ rk: OpaquePointer, _ partitions: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>
    ) {
        guard rd_kafka_position(rk, partitions) == RD_KAFKA_RESP_ERR_NO_ERROR else { return }
        let known = readPartitionList(partitions).filter { $0.1 >= 0 }
        guard !known.isEmpty else { return }
        let list = makePartitionList(known.map { ($0.0, $0.1) })
        defer { rd_kafka_topic_partition_list_destroy(list) }
        if let error = rd_kafka_seek_partitions(rk, list, 0) {
            logger.debug(
                "seek after resume failed", metadata: ["error": .string(String(cString: rd_kafka_error_string(error)))])
            rd_kafka_error_destroy(error)
        }
    }

    /// Start offsets of partitions nothing was polled from since their assignment (where fetching starts: the
    /// committed offset, or with none where `auto.offset.reset` points), asked of the broker once per assignment for
    /// an idle consumer's probes (poll thread only; `rebalance` forgets them).
    private var startOffsetCache: [TopicPartition: Int64] = [:]

    private func startOffsets(_ partitions: [TopicPartition], _ rk: OpaquePointer) -> [(TopicPartition, Int64)] {
        let missing = partitions.filter { startOffsetCache[$0] == nil }
        if !missing.isEmpty {
            let list = makePartitionList(missing.map { ($0, nil) })
            defer { rd_kafka_topic_partition_list_destroy(list) }
            if rd_kafka_committed(rk, list, 2000) == RD_KAFKA_RESP_ERR_NO_ERROR {
                for (tp, committed, _) in readPartitionList(list) {
                    if committed >= 0 {
                        startOffsetCache[tp] = committed
                        continue
                    }
                    guard configuration.autoOffsetReset != .error else { continue }
                    var low: Int64 = -1
                    var high: Int64 = -1
                    let err = rd_kafka_query_watermark_offsets(rk, tp.topic, tp.partition, &low, &high, 2000)
                    guard err == RD_KAFKA_RESP_ERR_NO_ERROR else { continue }
                    startOffsetCache[tp] = configuration.autoOffsetReset == .earliest ? low : high
                }
            }
        }
        return partitions.compactMap { tp in startOffsetCache[tp].map { (tp, $0) } }
    }

    /// Called by librdkafka on the poll thread (inside `rd_kafka_consumer_poll` or
    /// `rd_kafka_consumer_close`). Under the cooperative protocol `partitions` is what changes hands (added or
    /// taken away); under the eager one it is the whole assignment.
    fileprivate func rebalance(
        _ rk: OpaquePointer, _ err: rd_kafka_resp_err_t,
        _ partitions: UnsafeMutablePointer<rd_kafka_topic_partition_list_t>?
    ) {
        let tps = readPartitionList(partitions).map(\.0)
        let cooperative = String(cString: rd_kafka_rebalance_protocol(rk)) == "COOPERATIVE"
        rebalanceGeneration &+= 1
        startOffsetCache = [:]
        switch err {
        case RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS:
            let paused = state.withLock { s -> Bool in
                let epoch = s.nextEpoch
                s.nextEpoch += 1
                s.joined = true
                s.flow.wake(now: .now)
                for tp in tps {
                    s.epochs[tp] = epoch
                    s.trackers[tp] = nil
                }
                return s.flow.isPaused
            }
            assignedCounter.increment(by: tps.count)
            logger.info(
                "partitions assigned",
                metadata: [
                    "partitions": .string(tps.map(\.description).joined(separator: ",")),
                    "protocol": .string(cooperative ? "cooperative" : "eager"),
                ])
            if cooperative {
                checkRebalanceCall("incremental assign", rd_kafka_incremental_assign(rk, partitions))
            } else {
                let assignErr = rd_kafka_assign(rk, partitions)
                if assignErr != RD_KAFKA_RESP_ERR_NO_ERROR {
                    logger.error(
                        "assign failed", metadata: ["error": .string(String(cString: rd_kafka_err2name(assignErr)))])
                }
            }
            if paused, let partitions, !tps.isEmpty { rd_kafka_pause_partitions(rk, partitions) }
        case RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS:
            let lost = rd_kafka_assignment_lost(rk) != 0
            revokedDuringPoll.formUnion(tps)
            // Records not handed out yet go back at once; those the caller holds may still complete (and be
            // committed) for a short while, unless the partitions are already someone else's (lost).
            let cut = state.withLock { s -> [TopicPartition: Int64] in
                let revoked = Set(tps)
                var cut: [TopicPartition: Int64] = [:]
                s.buffer.removeAll { record in
                    let tp = record.topicPartition
                    guard revoked.contains(tp) else { return false }
                    cut[tp] = min(cut[tp] ?? record.offset, record.offset)
                    return true
                }
                return cut
            }
            // At shutdown the caller has finished what it will finish (the stage loop waits for its batches first).
            if !lost, !closing { drainRevoked(tps, handedOutBelow: cut) }
            state.withLock { s in
                for tp in tps {
                    s.epochs[tp] = nil
                    s.trackers[tp] = nil
                }
                s.revoked.append(contentsOf: tps)
            }
            revokedCounter.increment(by: tps.count)
            // Commit what is done before giving the partitions away.
            if !lost {
                // NULL: every stored offset of the assignment, the revoked partitions' included.
                let commitErr = rd_kafka_commit(rk, nil, 0)
                if commitErr != RD_KAFKA_RESP_ERR_NO_ERROR && commitErr != RD_KAFKA_RESP_ERR__NO_OFFSET {
                    errorCounter.increment()
                    state.withLock { $0.revokeCommitsFailed += 1 }
                    logger.warning(
                        "commit on revoke failed",
                        metadata: ["error": .string(String(cString: rd_kafka_err2name(commitErr)))])
                }
            }
            logger.info(
                "partitions revoked",
                metadata: [
                    "partitions": .string(tps.map(\.description).joined(separator: ",")),
                    "protocol": .string(cooperative ? "cooperative" : "eager"), "lost": .stringConvertible(lost),
                ])
            if cooperative {
                checkRebalanceCall("incremental unassign", rd_kafka_incremental_unassign(rk, partitions))
            } else {
                rd_kafka_assign(rk, nil)
            }
            forgetLag(tps)
        default:
            logger.error("rebalance error", metadata: ["error": .string(String(cString: rd_kafka_err2name(err)))])
            let all = state.withLock { s -> [TopicPartition] in
                defer {
                    s.epochs = [:]
                    s.trackers = [:]
                    s.buffer.removeAll()
                }
                return Array(s.epochs.keys)
            }
            revokedDuringPoll.formUnion(all)
            rd_kafka_assign(rk, nil)
        }
    }

    /// Set by `finish` before it leaves the group (poll thread only): the revoke that follows does not wait.
    private var closing = false

    /// Partitions revoked since the poll thread's current `pollAndBuffer` began (poll thread only): records it
    /// took from them before the revoke are dropped, the others kept.
    private var revokedDuringPoll: Set<TopicPartition> = []

    /// Waits, up to `revokeDrainTimeout`, until every record handed out from `partitions` (below the first record
    /// given back, per partition) has completed, so the commit that follows covers the work the caller finished.
    private func drainRevoked(_ partitions: [TopicPartition], handedOutBelow cut: [TopicPartition: Int64]) {
        let deadline = ContinuousClock.now + configuration.revokeDrainTimeout
        func pending() -> Int {
            state.withLock { s in
                partitions.reduce(0) { total, tp in
                    guard let oldest = s.trackers[tp]?.tracker.oldestPending else { return total }
                    if let first = cut[tp], oldest >= first { return total }
                    return total + 1
                }
            }
        }
        var waiting = pending()
        guard waiting > 0 else { return }
        let started = ContinuousClock.now
        state.withLock { $0.draining = true }
        defer { state.withLock { $0.draining = false } }
        while waiting > 0, ContinuousClock.now < deadline {
            _ = drained.wait(timeout: .now() + .milliseconds(20))
            waiting = pending()
        }
        logger.info(
            waiting == 0 ? "revoked partitions drained" : "revoked partitions handed over with work in flight",
            metadata: [
                "partitions_in_flight": .stringConvertible(waiting),
                "waited_ms": .stringConvertible((ContinuousClock.now - started).milliseconds),
            ])
    }

    private func checkRebalanceCall(_ what: String, _ error: OpaquePointer?) {
        guard let error else { return }
        errorCounter.increment()
        logger.error("\(what) failed", metadata: ["error": .string(String(cString: rd_kafka_error_string(error)))])
        rd_kafka_error_destroy(error)
    }

    /// An idle consumer's probe: one ListOffsets request per broker for the end offsets of the assigned
    /// partitions. The answers become the lag (current while nothing is fetched); records beyond a position end the
    /// idle state, and the next turn of the loop resumes fetching. A failed query ends it too: better to fetch for
    /// nothing than to miss records.
    private func probeIdle(_ rk: OpaquePointer) {
        let assigned = state.withLock { Array($0.epochs.keys) }
        guard !assigned.isEmpty else { return }
        let list = makePartitionList(assigned.map { ($0, nil) })
        defer { rd_kafka_topic_partition_list_destroy(list) }
        guard rd_kafka_position(rk, list) == RD_KAFKA_RESP_ERR_NO_ERROR else { return wakeFromIdle() }
        let positions = readPartitionList(list)
        let unknown = positions.filter { $0.1 < 0 }.map(\.0)
        var start: [TopicPartition: Int64] = [:]
        for (tp, position, _) in positions where position >= 0 { start[tp] = position }
        if !unknown.isEmpty {
            for (tp, offset) in startOffsets(unknown, rk) { start[tp] = offset }
        }
        let ends = makePartitionList(assigned.map { ($0, Int64(RD_KAFKA_OFFSET_END)) })
        defer { rd_kafka_topic_partition_list_destroy(ends) }
        // A generous timeout: librdkafka drops the broker connection (and every fetch and group request on it) when
        // a request times out, which would cost far more than a slow answer.
        guard rd_kafka_offsets_for_times(rk, ends, 10_000) == RD_KAFKA_RESP_ERR_NO_ERROR else {
            return wakeFromIdle()
        }
        var lag: [TopicPartition: Int64] = [:]
        var waiting = false
        for (tp, end, err) in readPartitionList(ends) {
            guard err == RD_KAFKA_RESP_ERR_NO_ERROR, end >= 0, let from = start[tp] else {
                waiting = true
                continue
            }
            lag[tp] = max(0, end - from)
            if end > from { waiting = true }
        }
        let now = ContinuousClock.now
        state.withLock { s in
            s.lag = lag
            if waiting { s.flow.wake(now: now, expectRecords: true) }
        }
    }

    private func wakeFromIdle() {
        let now = ContinuousClock.now
        state.withLock { $0.flow.wake(now: now) }
    }

    private func refreshLag(_ rk: OpaquePointer) {
        let (assigned, paused, idle) = state.withLock {
            (Array($0.epochs.keys), $0.flow.isPaused, $0.flow.isIdle)
        }
        // An idle consumer's probes measure its lag (`probeIdle`).
        guard !idle else { return }
        // While fetching, the watermarks cached from fetch responses are current; while
        // paused nothing is fetched, so ask the broker (a round trip per partition).
        let queryTimeout = Int32(clamping: min(1000, max(1, configuration.lagInterval.milliseconds / 2)))
        var lag: [TopicPartition: Int64] = [:]
        if !assigned.isEmpty {
            let list = makePartitionList(assigned.map { ($0, nil) })
            defer { rd_kafka_topic_partition_list_destroy(list) }
            if rd_kafka_position(rk, list) == RD_KAFKA_RESP_ERR_NO_ERROR {
                for (tp, position, _) in readPartitionList(list) where position >= 0 {
                    var low: Int64 = -1
                    var high: Int64 = -1
                    let err =
                        paused
                        ? rd_kafka_query_watermark_offsets(rk, tp.topic, tp.partition, &low, &high, queryTimeout)
                        : rd_kafka_get_watermark_offsets(rk, tp.topic, tp.partition, &low, &high)
                    if err == RD_KAFKA_RESP_ERR_NO_ERROR, high >= 0 {
                        lag[tp] = max(0, high - position)
                    }
                }
            }
        }
        state.withLock { $0.lag = lag }
    }

    private func forgetLag(_ tps: [TopicPartition]) {
        state.withLock { s in tps.forEach { s.lag[$0] = nil } }
    }

    /// Final commit, leave the group, destroy the handle; then release every waiter.
    private func finish(_ rk: OpaquePointer) {
        let (waiter, fatal) = state.withLock { s in
            defer { s.waiter = nil }
            return (s.waiter, s.fatal)
        }
        waiter?.continuation.resume(returning: fatal.map { .failure($0) } ?? .success(nil))
        if fatal == nil {
            let err = rd_kafka_commit(rk, nil, 0)
            if err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR__NO_OFFSET {
                logger.warning(
                    "final commit failed", metadata: ["error": .string(String(cString: rd_kafka_err2name(err)))])
            }
        }
        // Leaves the group; runs the revoke callback (which commits once more).
        closing = true
        let closeErr = rd_kafka_consumer_close(rk)
        if closeErr != RD_KAFKA_RESP_ERR_NO_ERROR {
            logger.warning(
                "consumer close failed", metadata: ["error": .string(String(cString: rd_kafka_err2name(closeErr)))])
        }
        let (commands, stopWaiters) = state.withLock { s in
            s.closed = true
            defer { s.commands = []; s.stopWaiters = [] }
            return (s.commands, s.stopWaiters)
        }
        state.withLock { s in
            s.exited = true
            if let queue = consumerQueue { rd_kafka_queue_destroy(queue) }
            consumerQueue = nil
        }
        handle.destroy()
        commands.forEach { $0(nil) }
        logger.info("kafka consumer closed", metadata: ["group": .string(configuration.groupID)])
        stopWaiters.forEach { $0.resume() }
    }
}
