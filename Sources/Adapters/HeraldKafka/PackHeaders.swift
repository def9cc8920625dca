import CRdKafka

/// The headers of a pack's parts, carried in one header of the pack (docs/kafka.md, "Headers in packed records").
///
/// A pack is one Kafka record, so its parts cannot have Kafka headers of their own. Records whose headers are all
/// in the producer's `packableHeaders` (the trace context, `traceparent` and `tracestate`) are packed anyway, and
/// their headers travel in the pack's header `herald-part-headers`; the consumer gives each part its headers back.
/// A pack none of whose parts has headers has no such header, so records without headers cost nothing.
///
/// Value layout: `01` (format version), the number of entries as a varint, then per entry (one per part that has
/// headers, parts in increasing order) the part's index and its header count as varints, then per header the key's
/// length and bytes, and the value's length + 1 (0 for a header without a value) and bytes. A value that does not
/// parse to its last byte, or names a part the pack does not have, is ignored whole: the parts are handed out
/// without headers, as if none had been sent.
public enum PackHeaders {
    /// The pack's header that carries its parts' headers.
    public static let headerKey = "herald-part-headers"
    static let version: UInt8 = 1

    /// The bytes a part's headers add to the pack's header (its index and lengths included).
    static func size(part: Int, headers: [KafkaHeader]) -> Int {
        var total = RecordPack.varintSize(UInt64(part)) + RecordPack.varintSize(UInt64(headers.count))
        for header in headers {
            let key = header.key.utf8.count
            total += RecordPack.varintSize(UInt64(key)) + key
            total += RecordPack.varintSize(UInt64((header.value?.count ?? -1) + 1)) + (header.value?.count ?? 0)
        }
        return total
    }

    /// Encodes the headers of the parts that have any: `(part index, headers)` in increasing part order, at least one.
    public static func encode(_ entries: [(part: Int, headers: [KafkaHeader])]) -> [UInt8] {
        var bytes: [UInt8] = [version]
        bytes.reserveCapacity(1 + 5 + entries.reduce(0) { $0 + size(part: $1.part, headers: $1.headers) })
        RecordPack.appendVarint(UInt64(entries.count), to: &bytes)
        for entry in entries {
            RecordPack.appendVarint(UInt64(entry.part), to: &bytes)
            RecordPack.appendVarint(UInt64(entry.headers.count), to: &bytes)
            for header in entry.headers {
                RecordPack.appendVarint(UInt64(header.key.utf8.count), to: &bytes)
                bytes += header.key.utf8
                if let value = header.value {
                    RecordPack.appendVarint(UInt64(value.count) + 1, to: &bytes)
                    bytes += value
                } else {
                    bytes.append(0)
                }
            }
        }
        return bytes
    }

    /// The headers of each part that has any, by part index, from a pack of `parts` parts; nil when `bytes` is not
    /// a valid value (it is then ignored).
    public static func decode(_ bytes: UnsafeRawBufferPointer, parts: Int) -> [Int: [KafkaHeader]]? {
        guard bytes.count >= 2, bytes[0] == version else { return nil }
        var index = 1
        guard let count = RecordPack.readVarint(bytes, &index), count > 0, count <= UInt64(parts) else { return nil }
        var result: [Int: [KafkaHeader]] = [:]
        var previous = -1
        for _ in 0..<count {
            guard let part = RecordPack.readVarint(bytes, &index), part < UInt64(parts), Int(part) > previous,
                let headerCount = RecordPack.readVarint(bytes, &index), headerCount > 0,
                headerCount <= UInt64(bytes.count - index)
            else { return nil }
            previous = Int(part)
            var headers: [KafkaHeader] = []
            headers.reserveCapacity(Int(headerCount))
            for _ in 0..<headerCount {
                guard let keyLength = RecordPack.readVarint(bytes, &index), keyLength <= UInt64(bytes.count - index)
                else { return nil }
                let key = String(decoding: bytes[index..<index + Int(keyLength)], as: UTF8.self)
                index += Int(keyLength)
                guard let prefixed = RecordPack.readVarint(bytes, &index) else { return nil }
                var value: [UInt8]?
                if prefixed > 0 {
                    guard prefixed - 1 <= UInt64(bytes.count - index) else { return nil }
                    value = Array(bytes[index..<index + Int(prefixed - 1)])
                    index += Int(prefixed - 1)
                }
                headers.append(KafkaHeader(key: key, value: value))
            }
            result[Int(part)] = headers
        }
        return index == bytes.count ? result : nil
    }

    public static func decode(_ bytes: [UInt8], parts: Int) -> [Int: [KafkaHeader]]? {
        bytes.withUnsafeBytes { decode($0, parts: parts) }
    }

    /// The parts' headers a consumed pack carries, or nil when it has no `herald-part-headers` header (or one
    /// that is not valid). One header lookup per pack; nothing is allocated for a pack without it.
    static func read(from message: UnsafePointer<rd_kafka_message_t>, parts: Int) -> [Int: [KafkaHeader]]? {
        var headers: OpaquePointer?
        guard rd_kafka_message_headers(message, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR, let headers else {
            return nil
        }
        var value: UnsafeRawPointer?
        var size = 0
        guard rd_kafka_header_get_last(headers, headerKey, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR, let value
        else { return nil }
        return decode(UnsafeRawBufferPointer(start: value, count: size), parts: parts)
    }
}
