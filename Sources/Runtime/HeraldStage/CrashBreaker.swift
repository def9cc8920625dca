import Foundation
import HeraldKafka
import HeraldRedis
import Logging
import Synchronization

/// The crash-loop breaker (docs/pipeline.md, "Crash-loop breaker"): the generic defence against a record that makes
/// a stage trap. A trap cannot be caught, the record's offset is never committed, and without the breaker every
/// process the partition moves to dies on it again.
///
/// - Before a batch is processed, the loop notes, per partition, the offset range of the batch's records
///   (`CrashNoteStore.note`: one pipelined write per batch); once the batch completed, the note is cleared.
/// - When this member gets a partition (at start, or from a rebalance), it takes the partition's notes. A batch
///   still noted was in flight at a crash: its records are processed again one at a time, each noted alone before
///   it is processed.
/// - A record noted alone at a crash was in flight at two crashes in a row: it is dead-lettered `crashed` (with its
///   topic, partition and offset) and completed, and the partition moves on.
///
/// Redis unreachable: the batch is processed without its note (logged when the notes start and stop failing); the
/// breaker never holds the stage up.
public final class CrashBreaker: Sendable {
    /// The DLQ reason of a record that was in flight at two crashes in a row.
    public static let reason = "crashed"

    private let store: any CrashNoteStore
    private let metrics: StageMetrics
    private let logger: Logger
    /// Makes the notes of this process's batches distinct from those of earlier processes.
    private let token: String
    private let state = Mutex(State())

    struct State {
        /// The assignment each partition's notes were taken under (taken again when it changes).
        var taken: [TopicPartition: UInt64] = [:]
        /// Per partition, the offsets of batches that were in flight at a crash: processed one record at a time.
        var suspect: [TopicPartition: ClosedRange<Int64>] = [:]
        /// Records that were in flight, alone, at a crash: dead-lettered when they come.
        var condemned: Set<RecordID> = []
        var sequence: UInt64 = 0
        var failing = false
    }

    /// A record of a partition: its offset, and its part within a packed record.
    public struct RecordID: Hashable, Sendable, CustomStringConvertible {
        public var partition: TopicPartition
        public var offset: Int64
        public var part: Int

        public init(partition: TopicPartition, offset: Int64, part: Int) {
            self.partition = partition
            self.offset = offset
            self.part = part
        }

        init(_ record: ConsumerRecord) {
            self.init(partition: record.topicPartition, offset: record.offset, part: record.part)
        }

        public var description: String { "\(partition)@\(offset)/\(part)" }
    }

    /// How the loop handles one record of a batch.
    public enum Disposition: Sendable, Equatable {
        /// With the rest of the batch.
        case batch
        /// On its own, noted alone first: it was in flight at a crash.
        case alone
        /// Dead-lettered `crashed`: it was in flight at two crashes in a row.
        case crashed
    }

    /// What the breaker noted for a batch, and how each of its records is handled.
    public struct Plan: Sendable {
        /// The batch's note, per partition (cleared by `end`).
        var noted: [TopicPartition] = []
        var id: String = ""
        public var dispositions: [Disposition] = []
        /// Whether every record goes with the batch (the usual case).
        public var isPlain: Bool { !dispositions.contains { $0 != .batch } }
    }

    public init(store: any CrashNoteStore, metrics: StageMetrics, logger: Logger) {
        self.store = store
        self.metrics = metrics
        self.logger = logger
        token = String(UInt32.random(in: 0...UInt32.max), radix: 36)
        metrics.crashBreaker(action: "rerun_batch", count: 0)
        metrics.crashBreaker(action: "dead_letter", count: 0)
    }

    /// Before `batch` is processed: takes the notes of partitions newly assigned, decides how each record is
    /// handled, and notes the batch's offset ranges (one pipelined write; a second round trip only when a
    /// partition was newly assigned).
    public func begin(_ batch: [ConsumerRecord]) async -> Plan {
        // Records come in runs of one partition: the dictionaries are touched once per run, not per record.
        var ranges: [TopicPartition: ClosedRange<Int64>] = [:]
        var fresh: [TopicPartition: UInt64] = [:]
        let taken = state.withLock { $0.taken }
        var start = 0
        while start < batch.count {
            let topic = batch[start].topic
            let partition = batch[start].partition
            var low = batch[start].offset
            var high = low
            var end = start + 1
            while end < batch.count, batch[end].partition == partition, batch[end].topic == topic {
                low = min(low, batch[end].offset)
                high = max(high, batch[end].offset)
                end += 1
            }
            let tp = TopicPartition(topic: topic, partition: partition)
            if let range = ranges[tp] {
                ranges[tp] = min(range.lowerBound, low)...max(range.upperBound, high)
            } else {
                ranges[tp] = low...high
                if taken[tp] != batch[start].assignment { fresh[tp] = batch[start].assignment }
            }
            start = end
        }
        if !fresh.isEmpty { await take(fresh) }

        var plan = Plan()
        let token = self.token
        let (id, dispositions, condemnedHere) = state.withLock { s -> (String, [Disposition], [RecordID]) in
            s.sequence &+= 1
            var dispositions: [Disposition] = []
            dispositions.reserveCapacity(batch.count)
            var condemnedHere: [RecordID] = []
            if s.condemned.isEmpty && s.suspect.isEmpty {
                dispositions = Array(repeating: .batch, count: batch.count)
            } else {
                for record in batch {
                    let tp = record.topicPartition
                    if !s.condemned.isEmpty, s.condemned.remove(RecordID(record)) != nil {
                        dispositions.append(.crashed)
                        condemnedHere.append(RecordID(record))
                    } else if let suspect = s.suspect[tp], suspect.contains(record.offset) {
                        dispositions.append(.alone)
                    } else {
                        dispositions.append(.batch)
                    }
                }
                // A suspect range the batch reached the end of is done.
                for (tp, range) in ranges {
                    if let suspect = s.suspect[tp], range.upperBound >= suspect.upperBound { s.suspect[tp] = nil }
                }
            }
            return ("\(token).\(s.sequence)", dispositions, condemnedHere)
        }
        plan.dispositions = dispositions
        for rid in condemnedHere {
            metrics.crashBreaker(action: "dead_letter")
            logger.error(
                "a record was in flight at two crashes in a row; dead-lettering it",
                metadata: [
                    "topic": "\(rid.partition.topic)", "partition": "\(rid.partition.partition)",
                    "offset": "\(rid.offset)", "part": "\(rid.part)",
                ])
        }
        plan.id = id
        plan.noted = Array(ranges.keys)
        await write(ranges.map { .batch($0.key, id: id, offsets: $0.value) })
        return plan
    }

    /// Before `record` is processed on its own: notes it alone, and clears the alone note of `previous` (the
    /// record processed alone before it, if on another partition).
    public func noteAlone(_ record: ConsumerRecord, previous: TopicPartition?) async {
        var writes: [CrashNoteWrite] = []
        if let previous, previous != record.topicPartition { writes.append(.clearAlone(previous)) }
        writes.append(.alone(RecordID(record)))
        await write(writes)
    }

    /// Before records go as a batch again after one processed alone on `partition`: clears its alone note.
    public func clearAlone(_ partition: TopicPartition) async {
        await write([.clearAlone(partition)])
    }

    /// Once the batch completed (or was handed back at shutdown): clears its notes.
    public func end(_ plan: Plan, alone: TopicPartition?) async {
        var writes = plan.noted.map { CrashNoteWrite.clearBatch($0, id: plan.id) }
        if let alone { writes.append(.clearAlone(alone)) }
        await write(writes)
    }

    private func take(_ partitions: [TopicPartition: UInt64]) async {
        let notes: [TopicPartition: CrashNote]
        do {
            notes = try await store.take(Array(partitions.keys))
        } catch {
            failed(error)
            return  // taken again with the next batch of these partitions
        }
        recovered()
        state.withLock { s in
            for (tp, assignment) in partitions {
                // What an earlier assignment left is forgotten. Two batches of a stage running batches at once
                // can both take a new partition's notes: the second finds them gone, and must not undo the first,
                // in whichever order they come back; so what is found is added.
                if s.taken[tp] != assignment {
                    s.taken[tp] = assignment
                    s.suspect[tp] = nil
                    s.condemned = s.condemned.filter { $0.partition != tp }
                }
                guard let note = notes[tp] else { continue }
                if let alone = note.alone { s.condemned.insert(alone) }
                if var first = note.batches.map(\.lowerBound).min(), var last = note.batches.map(\.upperBound).max() {
                    if let known = s.suspect[tp] {
                        first = min(first, known.lowerBound)
                        last = max(last, known.upperBound)
                    }
                    s.suspect[tp] = first...last
                }
            }
        }
        for (tp, note) in notes.sorted(by: { $0.key.description < $1.key.description }) {
            if !note.batches.isEmpty {
                metrics.crashBreaker(action: "rerun_batch", count: note.batches.count)
                logger.error(
                    "batches were in flight at a crash; processing their records one at a time",
                    metadata: [
                        "topic": "\(tp.topic)", "partition": "\(tp.partition)", "batches": "\(note.batches.count)",
                        "offsets": "\(note.batches.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ","))",
                    ])
            }
            if let alone = note.alone {
                logger.error(
                    "a record was in flight alone at a crash",
                    metadata: [
                        "topic": "\(tp.topic)", "partition": "\(tp.partition)", "offset": "\(alone.offset)",
                        "part": "\(alone.part)",
                    ])
            }
        }
    }

    private func write(_ writes: [CrashNoteWrite]) async {
        if writes.isEmpty { return }
        do {
            try await store.apply(writes)
            recovered()
        } catch {
            failed(error)
        }
    }

    private func failed(_ error: any Error) {
        let first = state.withLock { s -> Bool in
            defer { s.failing = true }
            return !s.failing
        }
        if first {
            logger.warning(
                "crash-loop breaker: notes cannot be written; batches are processed without them",
                metadata: [LogKey.error: "\(error)"])
        }
    }

    private func recovered() {
        let was = state.withLock { s -> Bool in
            defer { s.failing = false }
            return s.failing
        }
        if was { logger.notice("crash-loop breaker: notes are written again") }
    }
}

/// The notes of one partition that a crash left behind.
public struct CrashNote: Sendable, Equatable {
    /// Offset ranges of batches that were in flight.
    public var batches: [ClosedRange<Int64>] = []
    /// The record that was in flight on its own.
    public var alone: CrashBreaker.RecordID?

    public init(batches: [ClosedRange<Int64>] = [], alone: CrashBreaker.RecordID? = nil) {
        self.batches = batches
        self.alone = alone
    }
}

/// One change to the breaker's notes.
public enum CrashNoteWrite: Sendable, Equatable {
    case batch(TopicPartition, id: String, offsets: ClosedRange<Int64>)
    case clearBatch(TopicPartition, id: String)
    case alone(CrashBreaker.RecordID)
    case clearAlone(TopicPartition)
}

/// Where the breaker keeps its notes; they must survive the process.
public protocol CrashNoteStore: Sendable {
    /// Returns the notes of `partitions` (only those that have some) and deletes them, in one round trip.
    func take(_ partitions: [TopicPartition]) async throws -> [TopicPartition: CrashNote]
    /// Applies `writes` in one round trip.
    func apply(_ writes: [CrashNoteWrite]) async throws
}

/// The notes in Redis (docs/redis-keys.md): a hash per consumer group, topic and partition,
/// `herald:breaker:{<group>}:<topic>:<partition>`, with a field `b:<process>.<batch>` -> `<first>-<last>` per batch in
/// flight and `r` -> `<offset>:<part>` for the record in flight alone. Every write renews the key's TTL. The group is
/// the hash tag: a batch's notes, whatever its partitions, go to one Redis Cluster node in one round trip.
public struct RedisCrashNotes: CrashNoteStore {
    public let connection: RedisConnection
    public let group: String
    /// How long notes outlive the last write: a stage restarted later treats its crash as the first one.
    public var ttlMilliseconds: Int64 = 86_400_000

    public init(connection: RedisConnection, group: String) {
        self.connection = connection
        self.group = group
    }

    public static func key(group: String, partition: TopicPartition) -> String {
        "\(RedisKeys.prefix):breaker:{\(group)}:\(partition.topic):\(partition.partition)"
    }

    func key(_ partition: TopicPartition) -> String { Self.key(group: group, partition: partition) }

    public func take(_ partitions: [TopicPartition]) async throws -> [TopicPartition: CrashNote] {
        var commands: [RedisCommand] = []
        for tp in partitions {
            commands.append(RedisCommand("HGETALL", key(tp)))
            commands.append(RedisCommand("DEL", key(tp)))
        }
        let replies = try await connection.pipeline(commands)
        var notes: [TopicPartition: CrashNote] = [:]
        for (index, tp) in partitions.enumerated() where 2 * index < replies.count {
            let items = try replies[2 * index].orThrow("HGETALL").array ?? []
            var note = CrashNote()
            var position = 0
            while position + 1 < items.count {
                defer { position += 2 }
                guard let field = items[position].text, let value = items[position + 1].text else { continue }
                if field == "r" {
                    let parts = value.split(separator: ":")
                    if parts.count == 2, let offset = Int64(parts[0]), let part = Int(parts[1]) {
                        note.alone = CrashBreaker.RecordID(partition: tp, offset: offset, part: part)
                    }
                } else if field.hasPrefix("b:") {
                    let bounds = value.split(separator: "-")
                    if bounds.count == 2, let first = Int64(bounds[0]), let last = Int64(bounds[1]), first <= last {
                        note.batches.append(first...last)
                    }
                }
            }
            if !note.batches.isEmpty || note.alone != nil { notes[tp] = note }
        }
        return notes
    }

    public func apply(_ writes: [CrashNoteWrite]) async throws {
        var commands: [RedisCommand] = []
        for write in writes {
            switch write {
            case .batch(let tp, let id, let offsets):
                commands.append(
                    RedisCommand("HSET", key(tp), "b:" + id, "\(offsets.lowerBound)-\(offsets.upperBound)"))
                commands.append(RedisCommand("PEXPIRE", key(tp), ttlMilliseconds))
            case .clearBatch(let tp, let id):
                commands.append(RedisCommand("HDEL", key(tp), "b:" + id))
            case .alone(let rid):
                commands.append(RedisCommand("HSET", key(rid.partition), "r", "\(rid.offset):\(rid.part)"))
                commands.append(RedisCommand("PEXPIRE", key(rid.partition), ttlMilliseconds))
            case .clearAlone(let tp):
                commands.append(RedisCommand("HDEL", key(tp), "r"))
            }
        }
        for reply in try await connection.pipeline(commands) { _ = try reply.orThrow("crash note") }
    }
}

/// A crash only a debug build can be made to have, for the breaker's tests: with `ConfigKey.testCrashMarker` set,
/// the stage loop traps on a record whose value contains the marker. Release builds ignore the key.
enum CrashTrigger {
    static let key = ConfigKey.testCrashMarker.name

    #if DEBUG
    static let marker: [UInt8]? = ProcessInfo.processInfo.environment[key].flatMap { $0.isEmpty ? nil : Array($0.utf8) }
    #else
    static let marker: [UInt8]? = nil
    #endif

    /// Traps when one of `values` carries the marker (debug builds with the key set only).
    static func trapIfMarked(_ values: some Sequence<[UInt8]?>) {
        #if DEBUG
        guard let marker else { return }
        for value in values {
            guard let value, value.count >= marker.count else { continue }
            if value.indices.dropLast(marker.count - 1).contains(where: {
                value[$0..<$0 + marker.count].elementsEqual(marker)
            }) {
                fatalError("test crash: a record carries \(key)")
            }
        }
        #endif
    }
}
