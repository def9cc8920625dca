import CRdKafka

/// A record header. Kafka allows a header without a value (`value == nil`).
public struct KafkaHeader: Sendable, Hashable {
    public var key: String
    public var value: [UInt8]?
    public init(key: String, value: [UInt8]?) {
        self.key = key
        self.value = value
    }
    public init(key: String, string: String) {
        self.key = key
        self.value = Array(string.utf8)
    }
}

/// A topic and partition.
public struct TopicPartition: Sendable, Hashable, CustomStringConvertible {
    public var topic: String
    public var partition: Int32
    public init(topic: String, partition: Int32) {
        self.topic = topic
        self.partition = partition
    }
    public var description: String { "\(topic)[\(partition)]" }
}

/// A record to send.
public struct ProducerRecord: Sendable, Hashable {
    public var topic: String
    /// Records with the same key go to the same partition (librdkafka's default
    /// `consistent_random` partitioner), which is how Herald keeps per-key order.
    public var key: [UInt8]? {
        get {
            switch keyStorage {
            case .absent: nil
            case .bytes(let bytes): bytes
            case .text(let text): Array(text.utf8)
            }
        }
        set { keyStorage = newValue.map(Key.bytes) ?? .absent }
    }
    /// `nil` sends a tombstone.
    public var value: [UInt8]?
    public var headers: [KafkaHeader]
    /// An explicit partition, or `nil` to let the partitioner choose.
    public var partition: Int32?
    /// A key given as text stays text: the stages key their outputs by strings (a user id, a device token), and
    /// a byte array made of each would be an allocation per record. The producer reads it in place.
    private var keyStorage: Key

    enum Key: Sendable {
        case absent
        case bytes([UInt8])
        case text(String)
    }

    public init(
        topic: String, key: [UInt8]? = nil, value: [UInt8]?, headers: [KafkaHeader] = [], partition: Int32? = nil
    ) {
        self.init(
            topic: topic, keyStorage: key.map(Key.bytes) ?? .absent, value: value, headers: headers,
            partition: partition)
    }

    /// Convenience for UTF-8 keys.
    public init(topic: String, key: String?, value: [UInt8]?, headers: [KafkaHeader] = [], partition: Int32? = nil) {
        self.init(
            topic: topic, keyStorage: key.map(Key.text) ?? .absent, value: value, headers: headers, partition: partition
        )
    }

    /// A record with another record's key, as it was given (packs take their first member's).
    init(topic: String, keyOf other: ProducerRecord, value: [UInt8]?, partition: Int32?) {
        self.init(topic: topic, keyStorage: other.keyStorage, value: value, headers: [], partition: partition)
    }

    private init(topic: String, keyStorage: Key, value: [UInt8]?, headers: [KafkaHeader], partition: Int32?) {
        self.topic = topic
        self.keyStorage = keyStorage
        self.value = value
        self.headers = headers
        self.partition = partition
    }

    /// The key's bytes in place (nil for no key), valid only inside `body`.
    func withKeyBytes<R>(_ body: (UnsafeRawBufferPointer?) -> R) -> R {
        switch keyStorage {
        case .absent: return body(nil)
        case .bytes(let bytes): return bytes.withUnsafeBytes { body($0) }
        case .text(var text): return text.withUTF8 { body(UnsafeRawBufferPointer($0)) }
        }
    }

    /// The key's length in bytes; nil for no key.
    var keyCount: Int? {
        switch keyStorage {
        case .absent: nil
        case .bytes(let bytes): bytes.count
        case .text(let text): text.utf8.count
        }
    }

    public static func == (a: ProducerRecord, b: ProducerRecord) -> Bool {
        a.topic == b.topic && a.partition == b.partition && a.value == b.value && a.headers == b.headers
            && a.withKeyBytes { ka in b.withKeyBytes { kb in ka.map(Array.init) == kb.map(Array.init) } }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(topic)
        withKeyBytes { hasher.combine($0.map(Array.init)) }
        hasher.combine(value)
        hasher.combine(headers)
        hasher.combine(partition)
    }
}

/// The broker's answer for one produced record.
public struct DeliveryReport: Sendable, Hashable {
    public let topic: String
    /// The partition the record went to (or was meant for, on failure; -1 if unknown).
    public let partition: Int32
    /// The offset the broker assigned, or `nil` when failed or unknown
    /// (librdkafka can report no offset for records retried by the idempotent producer).
    public let offset: Int64?
    /// `nil` when the broker acknowledged the record.
    public let error: KafkaError?

    public init(topic: String, partition: Int32, offset: Int64?, error: KafkaError?) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.error = error
    }

    public var isDelivered: Bool { error == nil }

    /// Throws the delivery error, if any.
    public func get() throws(KafkaError) {
        if let error { throw error }
    }
}

/// The record's timestamp as the broker or producer stamped it.
public struct KafkaTimestamp: Sendable, Hashable {
    public enum Kind: Sendable, Hashable { case createTime, logAppendTime }
    /// Milliseconds since the Unix epoch (UTC).
    public let millisecondsSinceEpoch: Int64
    public let kind: Kind
    public init(millisecondsSinceEpoch: Int64, kind: Kind) {
        self.millisecondsSinceEpoch = millisecondsSinceEpoch
        self.kind = kind
    }
}

/// A consumed record. Keys and values are raw bytes: the adapter never decodes them,
/// so tombstones (`value == nil`), empty and non-UTF-8 records reach the caller intact.
public struct ConsumerRecord: Sendable, Hashable {
    public let topic: String
    public let partition: Int32
    public let offset: Int64
    public let key: [UInt8]?
    /// `nil` for a tombstone.
    public let value: [UInt8]?
    public let headers: [KafkaHeader]
    public let timestamp: KafkaTimestamp?
    /// Which assignment of the partition this record was delivered under; completions
    /// of records from an assignment that has since been revoked are ignored.
    let epoch: UInt64
    /// For a part of a packed record (`RecordPack`): its index and the pack's part count. Every part has the pack's
    /// topic, partition and offset; the offset is committed past once all of them completed. 0 and 1 otherwise.
    public let part: Int
    public let parts: Int

    public init(
        topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8]?,
        headers: [KafkaHeader] = [], timestamp: KafkaTimestamp? = nil
    ) {
        self.init(
            topic: topic, partition: partition, offset: offset, key: key, value: value,
            headers: headers, timestamp: timestamp, epoch: 0)
    }

    init(
        topic: String, partition: Int32, offset: Int64, key: [UInt8]?, value: [UInt8]?,
        headers: [KafkaHeader], timestamp: KafkaTimestamp?, epoch: UInt64, part: Int = 0, parts: Int = 1
    ) {
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp = timestamp
        self.epoch = epoch
        self.part = part
        self.parts = parts
    }

    public var topicPartition: TopicPartition { TopicPartition(topic: topic, partition: partition) }
    /// Which assignment of its partition the record came with: it changes each time this member is given the
    /// partition (again), so a caller can tell a fresh assignment from the one it had (the crash-loop breaker reads
    /// its notes then).
    public var assignment: UInt64 { epoch }
    public var isTombstone: Bool { value == nil }

    /// The first header with this key, if any.
    public func header(_ key: String) -> [UInt8]?? {
        headers.first { $0.key == key }.map(\.value)
    }

    /// Copies a consumed `rd_kafka_message_t` (with `err == 0`) into Swift memory.
    init(copying message: UnsafePointer<rd_kafka_message_t>, topic: String, epoch: UInt64) {
        let m = message.pointee
        let value: [UInt8]? = m.payload.map { p in
            Array(UnsafeRawBufferPointer(start: p, count: m.len))
        }
        let key: [UInt8]? = m.key.map { p in
            Array(UnsafeRawBufferPointer(start: p, count: m.key_len))
        }
        var headers: [KafkaHeader] = []
        var hdrs: OpaquePointer?
        if rd_kafka_message_headers(message, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR, let hdrs {
            var index = 0
            var name: UnsafePointer<CChar>?
            var valuePointer: UnsafeRawPointer?
            var size = 0
            while rd_kafka_header_get_all(hdrs, index, &name, &valuePointer, &size) == RD_KAFKA_RESP_ERR_NO_ERROR {
                let headerName = name.map { String(cString: $0) } ?? ""
                let headerValue = valuePointer.map { Array(UnsafeRawBufferPointer(start: $0, count: size)) }
                headers.append(KafkaHeader(key: headerName, value: headerValue))
                index += 1
            }
        }
        self.init(
            topic: topic, partition: m.partition, offset: m.offset, key: key, value: value,
            headers: headers, timestamp: Self.timestamp(of: message), epoch: epoch)
    }

    /// Appends a consumed message (with `err == 0`): a pack's parts (`RecordPack`), each with the pack's topic,
    /// partition, offset and timestamp and its own headers (`PackHeaders`), read straight from librdkafka's buffer;
    /// any other message, or any message when `unpack` is false (a topic Herald does not pack), as one record.
    static func append(
        copying message: UnsafePointer<rd_kafka_message_t>, topic: String, epoch: UInt64, unpack: Bool = true,
        to records: inout [ConsumerRecord]
    ) {
        let m = message.pointee
        let timestamp = timestamp(of: message)
        // Each part straight into its record (no array of parts in between).
        var partHeaders: [Int: [KafkaHeader]]?
        let packed =
            !unpack
            ? false
            : m.payload.map { payload in
                RecordPack.forEachPart(UnsafeRawBufferPointer(start: payload, count: m.len)) {
                    index, count, key, value in
                    if index == 0 {
                        // Grown geometrically: reserving each pack's exact count would copy the whole array per pack.
                        if records.capacity < records.count + count {
                            records.reserveCapacity(max(records.count + count, 2 * records.capacity))
                        }
                        partHeaders = PackHeaders.read(from: message, parts: count)
                    }
                    records.append(
                        ConsumerRecord(
                            topic: topic, partition: m.partition, offset: m.offset, key: key, value: value,
                            headers: partHeaders?[index] ?? [], timestamp: timestamp, epoch: epoch, part: index,
                            parts: count))
                }
            } ?? false
        if !packed { records.append(ConsumerRecord(copying: message, topic: topic, epoch: epoch)) }
    }

    private static func timestamp(of message: UnsafePointer<rd_kafka_message_t>) -> KafkaTimestamp? {
        var type = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE
        let ts = rd_kafka_message_timestamp(message, &type)
        switch type {
        case RD_KAFKA_TIMESTAMP_CREATE_TIME: return KafkaTimestamp(millisecondsSinceEpoch: ts, kind: .createTime)
        case RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME: return KafkaTimestamp(millisecondsSinceEpoch: ts, kind: .logAppendTime)
        default: return nil
        }
    }
}
