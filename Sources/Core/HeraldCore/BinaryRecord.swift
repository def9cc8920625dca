// The binary form of the records stages put on Kafka between them (herald.ingested, herald.resolved,
// herald.deliverable, herald.outbound, herald.retry). Every notification crosses three or four of these hops,
// so the format is chosen for the CPU it costs, not for reading: a four-byte header, then fields in a fixed
// order as varints and length-prefixed UTF-8. Encoding and decoding a delivery record costs about a tenth of
// the JSON form (`herald-bench codec` prints both).
//
// - Header: 0x00 'H' <version> <record type>. A JSON record starts with '{' (or whitespace), so a reader tells
//   the two apart from the first byte and still accepts JSON (records replayed from the DLQ, written by hand
//   or by an older Herald): see `StageCodec.decode`.
// - A record written by a newer Herald with a higher version is refused with a clear error (dead-lettered),
//   never misread. Version 2 added the provider and provider id of devices and requests (FCM, webhooks);
//   version 3 the mention counts after a state's unread counts; version 4 a byte after them naming the
//   preferences the user never set (`Preferences.unset`); version 5 a deliverable record's burst position at its
//   end; version 6 an outbound record's event `created_at` at its end; version 7 a byte at the end of an event
//   (its sound silenced by `em_push_sound: null`), one at the end of a state (whether its unread total is
//   known), an empty device environment for one the registration did not name, and a byte at the end of a
//   request (what render guessed: `PushRequest.Guesses`); version 8 at the end of an event the conversation's
//   channel type, avatar and hiding members and the message's metadata and attachments, and at the end of a state
//   the user's nickname and the number of conversations with an unread mention, and last in an event a digest's
//   counts (docs/behaviour.md §6d; version 8 was extended by them before any release wrote it). Version 2 to 7 records are still read (an upgrade with records in flight), with mention counts of
//   zero, every preference counted as set, no burst, no event time, the event's sound not silenced and the unread
//   total known where their version lacks them.
// - Reading is bounds-checked everywhere: bad bytes give a `StageRecordError`, never a crash.

import Foundation
import Synchronization

/// Appends binary record fields.
public struct BinaryWriter: Sendable {
    public private(set) var bytes: [UInt8]

    public init(capacity: Int = 512) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    @inline(__always) public mutating func byte(_ b: UInt8) { bytes.append(b) }

    @inline(__always) public mutating func varint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }

    /// A signed integer, zigzag encoded.
    @inline(__always) public mutating func int(_ value: Int64) {
        varint(UInt64(bitPattern: (value << 1) ^ (value >> 63)))
    }

    @inline(__always) public mutating func int(_ value: Int) { int(Int64(value)) }

    @inline(__always) public mutating func bool(_ value: Bool) { bytes.append(value ? 1 : 0) }

    public mutating func string(_ value: String) {
        var s = value
        s.withUTF8 { utf8 in
            varint(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    public mutating func bytes(_ value: [UInt8]) {
        varint(UInt64(value.count))
        bytes.append(contentsOf: value)
    }

    /// 0 for nil, else 1 and the string.
    public mutating func optional(_ value: String?) {
        if let value {
            bytes.append(1)
            string(value)
        } else {
            bytes.append(0)
        }
    }

    public mutating func optional(_ value: Int64?) {
        if let value {
            bytes.append(1)
            int(value)
        } else {
            bytes.append(0)
        }
    }

    public mutating func strings(_ values: [String]) {
        varint(UInt64(values.count))
        for v in values { string(v) }
    }
}

/// Reads binary record fields; every read checks its bounds.
public struct BinaryReader {
    private let base: UnsafeRawBufferPointer
    public private(set) var offset: Int
    /// The type being read; its name goes into errors only (building it for every record cost more than some
    /// records' fields).
    let recordType: Any.Type
    /// The format version of the record being read (fields added later are read only from newer versions).
    public internal(set) var version: UInt8 = BinaryRecordFormat.version

    init(_ base: UnsafeRawBufferPointer, offset: Int, record: Any.Type) {
        self.base = base
        self.offset = offset
        self.recordType = record
    }

    var record: String { "\(recordType)" }

    public var isAtEnd: Bool { offset >= base.count }

    func fail(_ what: String) -> StageRecordError {
        StageRecordError(record: record, detail: "(binary) \(what) at byte \(offset)")
    }

    func error(_ detail: String) -> StageRecordError { StageRecordError(record: record, detail: detail) }

    /// Moves past `count` bytes already known (at most to the end).
    mutating func skip(_ count: Int) { offset = min(base.count, offset + max(0, count)) }

    @inline(__always) public mutating func byte() throws(StageRecordError) -> UInt8 {
        guard offset < base.count else { throw fail("truncated") }
        defer { offset += 1 }
        return base[offset]
    }

    public mutating func varint() throws(StageRecordError) -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let b = try byte()
            if shift == 63 && b > 1 { throw fail("varint overflow") }
            result |= UInt64(b & 0x7f) << shift
            if b < 0x80 { return result }
            shift += 7
            if shift > 63 { throw fail("varint overflow") }
        }
    }

    public mutating func int() throws(StageRecordError) -> Int64 {
        let v = try varint()
        return Int64(bitPattern: (v >> 1) ^ (0 &- (v & 1)))
    }

    /// A length or item count; each byte or item takes at least one byte, so it is at most what is left.
    public mutating func count(_ what: String) throws(StageRecordError) -> Int {
        let n = try varint()
        guard n <= UInt64(base.count - offset) else { throw fail("\(what) length \(n) out of range") }
        return Int(n)
    }

    public mutating func bool() throws(StageRecordError) -> Bool {
        switch try byte() {
        case 0: return false
        case 1: return true
        default: throw fail("expected a boolean")
        }
    }

    public mutating func string() throws(StageRecordError) -> String {
        let n = try count("string")
        let start = offset
        offset += n
        return String(decoding: UnsafeRawBufferPointer(rebasing: base[start..<start + n]), as: UTF8.self)
    }

    public mutating func bytes() throws(StageRecordError) -> [UInt8] {
        let n = try count("bytes")
        let start = offset
        offset += n
        return Array(base[start..<start + n])
    }

    public mutating func optionalString() throws(StageRecordError) -> String? {
        try bool() ? try string() : nil
    }

    public mutating func optionalInt() throws(StageRecordError) -> Int64? {
        try bool() ? try int() : nil
    }

    public mutating func strings() throws(StageRecordError) -> [String] {
        let n = try count("items")
        var out: [String] = []
        out.reserveCapacity(n)
        for _ in 0..<n { out.append(try string()) }
        return out
    }

    public mutating func enumValue<E: RawRepresentable>(_ type: E.Type) throws(StageRecordError) -> E
    where E.RawValue == String {
        let raw = try string()
        guard let v = E(rawValue: raw) else { throw fail("unknown \(E.self) \"\(raw)\"") }
        return v
    }

    /// `enumValue`, with an empty name read as nil.
    public mutating func enumValueOrEmpty<E: BinaryTextEnum>(_ type: E.Type) throws(StageRecordError) -> E? {
        let start = offset
        if try count("string") == 0 { return nil }
        offset = start
        return try enumValue(type)
    }

    /// The same read for Herald's own enumerations, matched on the bytes of their names (no string is made).
    public mutating func enumValue<E: BinaryTextEnum>(_ type: E.Type) throws(StageRecordError) -> E {
        let n = try count("string")
        let start = offset
        offset += n
        let bytes = UnsafeRawBufferPointer(rebasing: base[start..<start + n])
        guard let v = E.binaryNames.value(bytes) else {
            throw fail("unknown \(E.self) \"\(String(decoding: bytes, as: UTF8.self))\"")
        }
        return v
    }
}

/// An enumeration written in records as its raw value's text and read back by matching those bytes against its
/// names (`BinaryReader.enumValue`): every record holds several, and a string made of each cost more than the
/// comparison.
public protocol BinaryTextEnum: RawRepresentable, CaseIterable, Sendable where RawValue == String {
    static var binaryNames: BinaryEnumNames<Self> { get }
}

/// The names of an enumeration's cases, by length and first eight bytes.
public struct BinaryEnumNames<E: BinaryTextEnum>: Sendable {
    private struct Name: Sendable {
        let count: Int
        let head: UInt64
        let start: Int
        let value: E
    }
    private let names: [Name]
    /// Every name's bytes, one after another.
    private let text: [UInt8]

    public init() {
        var text: [UInt8] = []
        var names: [Name] = []
        for value in E.allCases {
            let bytes = Array(value.rawValue.utf8)
            let head = bytes.withUnsafeBytes { Self.head($0) }
            names.append(Name(count: bytes.count, head: head, start: text.count, value: value))
            text += bytes
        }
        self.names = names
        self.text = text
    }

    /// Up to the first eight bytes, as one integer.
    @inline(__always)
    static func head(_ bytes: UnsafeRawBufferPointer) -> UInt64 {
        var head: UInt64 = 0
        for index in 0..<min(8, bytes.count) { head |= UInt64(bytes[index]) << UInt64(8 * index) }
        return head
    }

    /// The case named `bytes`, if any.
    func value(_ bytes: UnsafeRawBufferPointer) -> E? {
        let head = Self.head(bytes)
        return names.withUnsafeBufferPointer { names -> E? in
            for name in names where name.count == bytes.count && name.head == head {
                if name.count <= 8 { return name.value }
                let same = text.withUnsafeBytes { text in
                    memcmp(text.baseAddress! + name.start, bytes.baseAddress!, name.count) == 0
                }
                if same { return name.value }
            }
            return nil
        }
    }
}

extension ConversationType: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension MessageType: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension MentionType: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension ChatEvent.Kind: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension ChatEvent.CallType: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension ChatEvent.CallAction: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension ChatEvent.GroupActionKind: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension APNsEnvironment: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension Device.Kind: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension PushTrigger: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension ConversationTrigger: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension TemplateChoice: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension DisplayStyle: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
extension PushProvider: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }

/// A record with a binary form.
public protocol BinaryRecord {
    /// The record type byte of the header.
    static var binaryType: UInt8 { get }
    func write(into w: inout BinaryWriter)
    init(binary r: inout BinaryReader) throws(StageRecordError)
}

public enum BinaryRecordFormat {
    public static let magic: (UInt8, UInt8) = (0x00, 0x48)
    public static let version: UInt8 = 8
    /// The oldest version still read.
    public static let oldestReadable: UInt8 = 2

    /// True when `bytes` start with the binary header (whatever its version).
    /// Whether the bytes start with the binary format's magic (inlinable, so a caller's own type is read in place:
    /// unspecialised, the iterator of an unknown collection is a heap box per call).
    @inlinable
    public static func isBinary(_ bytes: some Collection<UInt8>) -> Bool {
        var i = bytes.makeIterator()
        return i.next() == magic.0 && i.next() == magic.1
    }

    public static func encode<T: BinaryRecord>(_ record: T, capacity: Int = 1024) -> [UInt8] {
        var w = BinaryWriter(capacity: capacity)
        w.byte(magic.0); w.byte(magic.1); w.byte(version); w.byte(T.binaryType)
        record.write(into: &w)
        return w.bytes
    }

    public static func decode<T: BinaryRecord>(_ type: T.Type, from bytes: [UInt8]) throws(StageRecordError) -> T {
        try read(T.self, from: bytes) { r, _ throws(StageRecordError) in try T(binary: &r) }
    }

    /// `decode`, for a record that starts with its event: when the event's bytes are those of an event `reuse`
    /// already holds (an earlier record of the batch about the same event), that event is taken instead of decoded
    /// again. The same bytes decode to the same event, ending at the same byte, so the result is what `decode` gives.
    public static func decode<T: EventFirstRecord>(
        _ type: T.Type, from bytes: [UInt8], reusing reuse: inout EventReuse
    ) throws(StageRecordError) -> T {
        try read(T.self, from: bytes) { r, raw throws(StageRecordError) in
            let event = try reuse.event(raw, reader: &r, partial: false) {
                (r) throws(StageRecordError) -> ChatEvent in try ChatEvent(binary: &r)
            }
            return try T(event: event, rest: &r)
        }
    }

    /// Reads the header of a `T`, then what `body` reads of the record, and refuses trailing bytes.
    static func read<T: BinaryRecord, Value>(
        _ type: T.Type, from bytes: [UInt8],
        _ body: (inout BinaryReader, UnsafeRawBufferPointer) throws(StageRecordError) -> Value
    ) throws(StageRecordError) -> Value {
        // The record is returned straight out of the closure (a `Result` around it cost a copy and a destroy of
        // every record); `withUnsafeBytes` rethrows untyped, so its error is typed again here.
        do {
            return try bytes.withUnsafeBytes { (raw) throws(StageRecordError) -> Value in
                var r = BinaryReader(raw, offset: 0, record: T.self)
                try readHeader(&r, T.self)
                let record = try body(&r, raw)
                guard r.isAtEnd else { throw r.fail("trailing bytes") }
                return record
            }
        } catch let error as StageRecordError {
            throw error
        } catch {
            throw StageRecordError(record: "\(T.self)", detail: "\(error)")
        }
    }

    private static func readHeader<T: BinaryRecord>(_ r: inout BinaryReader, _ type: T.Type) throws(StageRecordError) {
        guard try r.byte() == magic.0, try r.byte() == magic.1 else { throw r.fail("not a binary record") }
        let v = try r.byte()
        guard v >= oldestReadable, v <= version else {
            throw r.error(
                "(binary) format version \(v) is not supported (this Herald reads \(oldestReadable) to \(version))")
        }
        r.version = v
        let t = try r.byte()
        guard t == T.binaryType else { throw r.error("(binary) record type \(t), expected \(T.binaryType)") }
    }
}

/// A record whose binary form starts with its event (resolved and deliverable records).
public protocol EventFirstRecord: BinaryRecord {
    /// Reads the rest of the record after its event.
    init(event: ChatEvent, rest r: inout BinaryReader) throws(StageRecordError)

    /// `BinaryRecordFormat.decode(_:from:reusing:)` for this type. Each record type implements it here, in
    /// HeraldCore, where the generic decoder is compiled for that type: called through this requirement from
    /// another module, the decoder runs specialized instead of generic (a generic call across modules looks the
    /// record's layout up at run time and copies it through its value witnesses).
    static func decodeBinary(_ bytes: [UInt8], reusing reuse: inout EventReuse) throws(StageRecordError) -> Self
}

/// Keeps a batch's decoded events (`EventReuse`) for the next batch of the same stage: resolve writes an event's
/// recipients to the partitions of their user ids, so a stage often reads some of them in one batch and the rest in
/// the next. A batch takes what is kept (an empty set when another batch running at the same time has it) and keeps
/// its own when done; an entry is used only when all its bytes match, so nothing kept can be wrong for a record.
public final class EventReuseCarry: Sendable {
    private let kept = Mutex<EventReuse?>(nil)

    public init() {}

    /// The events the last batch kept (none the first time, or while another batch holds them).
    public func take() -> EventReuse { kept.withLock { $0.take() } ?? EventReuse() }

    /// Keeps `reuse` for the next batch.
    public func keep(_ reuse: EventReuse) { kept.withLock { $0 = reuse } }
}

/// The events decoded from a batch's records, by their bytes. Resolve writes one event's bytes into the record of
/// each of its recipients, and a batch holds several records of most events (spread over partitions, so not always
/// one after another): each event is decoded once (`BinaryRecordFormat.decode(_:from:reusing:)`).
public struct EventReuse: Sendable {
    struct Entry: Sendable {
        var version: UInt8
        /// Read for the rules alone (`ChatEvent(rulesBinary:)`): served only to such reads.
        var partial: Bool
        var bytes: [UInt8]
        var event: ChatEvent
    }

    /// Events by a hash of their id's bytes (the first field); a hit is used only when all its bytes match.
    var entries: [UInt64: Entry] = [:]
    /// At most this many events are held; then the cache starts over.
    static let capacity = 512
    /// Records whose event was taken from an earlier one instead of decoded.
    public internal(set) var reused = 0

    public init() {}

    /// The event at `r`'s offset in `raw`: a kept one when its bytes match (then `r` moves past them), else what
    /// `decode` reads, kept for the records after it.
    mutating func event(
        _ raw: UnsafeRawBufferPointer, reader r: inout BinaryReader, partial: Bool,
        _ decode: (inout BinaryReader) throws(StageRecordError) -> ChatEvent
    ) throws(StageRecordError) -> ChatEvent {
        let start = r.offset
        let key = Self.key(raw, at: start)
        if let key, let known = entries[key], known.version == r.version, known.partial == partial,
            Self.matches(known.bytes, raw, at: start)
        {
            r.skip(known.bytes.count)
            reused += 1
            return known.event
        }
        let event = try decode(&r)
        let eventBytes = Array(raw[start..<r.offset])
        if let key { remember(key, Entry(version: r.version, partial: partial, bytes: eventBytes, event: event)) }
        return event
    }

    mutating func remember(_ key: UInt64, _ entry: Entry) {
        if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
        entries[key] = entry
    }

    /// Whether `raw` holds `bytes` at `start`.
    static func matches(_ bytes: [UInt8], _ raw: UnsafeRawBufferPointer, at start: Int) -> Bool {
        guard bytes.count <= raw.count - start, let base = raw.baseAddress else { return false }
        return bytes.withUnsafeBytes { known in
            guard let knownBase = known.baseAddress else { return true }
            return memcmp(knownBase, base + start, known.count) == 0
        }
    }

    /// FNV-1a of the event id's length and bytes at `start`; nil when they do not fit in `raw`.
    static func key(_ raw: UnsafeRawBufferPointer, at start: Int) -> UInt64? {
        var offset = start
        var length = 0
        var shift = 0
        while true {
            guard offset < raw.count, shift < 63 else { return nil }
            let byte = raw[offset]
            offset += 1
            length |= Int(byte & 0x7F) << shift
            if byte < 0x80 { break }
            shift += 7
        }
        guard length <= raw.count - offset else { return nil }
        return FNV1a.hash(raw[start..<(offset + length)])
    }
}

// MARK: The event

// `ChatEvent(rulesBinary:)` and `Preferences(rulesBinary:conversation:)` (RulesRead.swift) step through these
// layouts too: a field added here is added there (RulesReadTests compares the two reads on arbitrary records).

extension ChatEvent {
    func write(into w: inout BinaryWriter) {
        w.string(eventID); w.string(appID); w.string(kind.rawValue); w.optional(createdAt)
        w.string(sender.id); w.optional(sender.name); w.optional(sender.profileURL)
        w.string(conversation.id); w.string(conversation.type.rawValue)
        w.optional(conversation.name); w.optional(conversation.customType)
        if let recipients { w.bool(true); w.strings(recipients) } else { w.bool(false) }
        if let m = message {
            w.bool(true)
            w.string(m.id); w.string(m.type.rawValue); w.string(m.text); w.string(m.customType); w.string(m.data)
            if let f = m.file {
                w.bool(true); w.optional(f.name); w.optional(f.mimeType); w.optional(f.url)
            } else {
                w.bool(false)
            }
            w.strings(m.mentions); w.string(m.mentionType.rawValue); w.optional(m.language)
            w.varint(UInt64(m.translations.count))
            for (language, text) in m.translations { w.string(language); w.string(text) }
        } else {
            w.bool(false)
        }
        if let c = call {
            w.bool(true); w.string(c.action.rawValue); w.string(c.sessionID); w.string(c.type.rawValue)
        } else {
            w.bool(false)
        }
        if let r = reaction { w.bool(true); w.string(r.emoji); w.optional(r.messageID) } else { w.bool(false) }
        if let g = groupAction {
            w.bool(true); w.string(g.action.rawValue); w.string(g.actorName)
        } else {
            w.bool(false)
        }
        w.bool(ext.ignoreNotification); w.bool(ext.forceNotification)
        let a = ext.apns
        w.optional(a.pushContent); w.optional(a.category); w.optional(a.sound); w.bool(a.mutableContent)
        w.optional(a.titleLocKey)
        if let v = a.titleLocArgs { w.bool(true); w.strings(v) } else { w.bool(false) }
        w.optional(a.bodyLocKey)
        if let v = a.bodyLocArgs { w.bool(true); w.strings(v) } else { w.bool(false) }
        w.optional(a.extern.map(\.serialized))
        w.bool(a.soundSilenced)
        // Version 8: the conversation's channel type, avatar and hiding members; the message's metadata and
        // attachments.
        w.optional(conversation.channelType); w.optional(conversation.avatarURL); w.strings(conversation.hiddenBy)
        w.optional(message?.metadata.map(\.serialized))
        let attachments = message?.attachments ?? []
        w.varint(UInt64(attachments.count))
        for f in attachments { w.optional(f.name); w.optional(f.mimeType); w.optional(f.url) }
        // Version 8 too: a digest's counts (docs/behaviour.md §6d).
        DigestSummary.write(digest, into: &w)
    }

    init(binary r: inout BinaryReader) throws(StageRecordError) {
        let eventID = try r.string(), appID = try r.string(), kind = try r.enumValue(Kind.self)
        let createdAt = try r.optionalInt()
        let sender = Sender(id: try r.string(), name: try r.optionalString(), profileURL: try r.optionalString())
        var conversation = Conversation(
            id: try r.string(), type: try r.enumValue(ConversationType.self),
            name: try r.optionalString(), customType: try r.optionalString())
        let recipients = try r.bool() ? try r.strings() : nil
        var message: Message?
        if try r.bool() {
            let id = try r.string(), type = try r.enumValue(MessageType.self), text = try r.string()
            let customType = try r.string(), data = try r.string()
            let file =
                try r.bool()
                ? File(
                    name: try r.optionalString(), mimeType: try r.optionalString(),
                    url: try r.optionalString()) : nil
            let mentions = try r.strings(), mentionType = try r.enumValue(MentionType.self)
            let language = try r.optionalString()
            let n = try r.count("items")
            var translations: [(String, String)] = []
            translations.reserveCapacity(n)
            for _ in 0..<n { translations.append((try r.string(), try r.string())) }
            message = Message(
                id: id, type: type, text: text, customType: customType, data: data, file: file,
                mentions: mentions, mentionType: mentionType, language: language, translations: translations)
        }
        let call =
            try r.bool()
            ? Call(
                action: try r.enumValue(CallAction.self), sessionID: try r.string(),
                type: try r.enumValue(CallType.self)) : nil
        let reaction = try r.bool() ? Reaction(emoji: try r.string(), messageID: try r.optionalString()) : nil
        let groupAction =
            try r.bool()
            ? GroupAction(
                action: try r.enumValue(GroupActionKind.self),
                actorName: try r.string()) : nil
        let ignore = try r.bool(), force = try r.bool()
        var digest: DigestSummary?
        var a = APNsExtension()
        a.pushContent = try r.optionalString(); a.category = try r.optionalString(); a.sound = try r.optionalString()
        a.mutableContent = try r.bool()
        a.titleLocKey = try r.optionalString()
        a.titleLocArgs = try r.bool() ? try r.strings() : nil
        a.bodyLocKey = try r.optionalString()
        a.bodyLocArgs = try r.bool() ? try r.strings() : nil
        if let extern = try r.optionalString() {
            do { a.extern = try JSONValue.parse(extern) } catch {
                throw r.fail("ext.em_apns_ext.extern: \(error.description)")
            }
        }
        if r.version >= 7 { a.soundSilenced = try r.bool() }
        if r.version >= 8 {
            conversation.channelType = try r.optionalString()
            conversation.avatarURL = try r.optionalString()
            conversation.hiddenBy = try r.strings()
            if let metadata = try r.optionalString() {
                do { message?.metadata = try JSONValue.parse(metadata) } catch {
                    throw r.fail("message.metadata: \(error.description)")
                }
            }
            let n = try r.count("items")
            var attachments: [File] = []
            attachments.reserveCapacity(n)
            for _ in 0..<n {
                attachments.append(
                    File(name: try r.optionalString(), mimeType: try r.optionalString(), url: try r.optionalString()))
            }
            if !attachments.isEmpty {
                guard message != nil else { throw r.fail("message.attachments without a message") }
                message?.attachments = attachments
            }
            digest = try DigestSummary.read(&r)
        }
        self.init(
            eventID: eventID, appID: appID, kind: kind, createdAt: createdAt, sender: sender,
            conversation: conversation, recipients: recipients, message: message, call: call, reaction: reaction,
            groupAction: groupAction, ext: Extension(ignoreNotification: ignore, forceNotification: force, apns: a))
        self.digest = digest
    }
}

// MARK: State

extension Device {
    func write(into w: inout BinaryWriter) {
        // Version 7: an empty environment is one the registration did not name.
        w.string(token); w.string(kind.rawValue); w.string(registeredEnvironment?.rawValue ?? ""); w.optional(bundleID);
        w.int(registeredAt)
        w.optional(providerID)
    }

    init(binary r: inout BinaryReader) throws(StageRecordError) {
        let token = try r.string(), kind = try r.enumValue(Kind.self)
        let environment =
            r.version >= 7 ? try r.enumValueOrEmpty(APNsEnvironment.self) : try r.enumValue(APNsEnvironment.self)
        self.init(
            token: token, kind: kind, environment: environment,
            bundleID: try r.optionalString(), registeredAt: try r.int(), providerID: try r.optionalString())
    }

    static func write(_ devices: [Device], into w: inout BinaryWriter) {
        w.varint(UInt64(devices.count))
        for d in devices { d.write(into: &w) }
    }

    static func readList(_ r: inout BinaryReader) throws(StageRecordError) -> [Device] {
        let n = try r.count("items")
        var out: [Device] = []
        out.reserveCapacity(n)
        for _ in 0..<n { out.append(try Device(binary: &r)) }
        return out
    }
}

extension UserState {
    func write(into w: inout BinaryWriter) {
        Device.write(devices, into: &w)
        w.strings(online)
        let p = preferences
        w.string(p.trigger.rawValue)
        w.varint(UInt64(p.conversations.count))
        for (id, c) in p.conversations.sorted(by: { $0.key < $1.key }) {
            w.string(id); w.string(c.trigger.rawValue); w.bool(c.muted)
        }
        if let d = p.dnd {
            w.bool(true); w.int(d.start.minutes); w.int(d.end.minutes); w.string(d.timezone)
        } else {
            w.bool(false)
        }
        if let s = p.snooze { w.bool(true); w.int(s.start); w.int(s.end) } else { w.bool(false) }
        w.string(p.template.rawValue); w.string(p.displayStyle.rawValue); w.optional(p.displayName)
        w.strings(p.languages); w.bool(p.badge)
        w.int(unread.total)
        w.varint(UInt64(unread.conversations.count))
        for (id, count) in unread.conversations.sorted(by: { $0.key < $1.key }) { w.string(id); w.int(count) }
        w.int(unread.mentionTotal)
        w.varint(UInt64(unread.mentionConversations.count))
        for (id, count) in unread.mentionConversations.sorted(by: { $0.key < $1.key }) { w.string(id); w.int(count) }
        w.byte(preferences.unset.rawValue)
        w.bool(unread.totalKnown)
        w.optional(preferences.nickname)
        w.optional(unread.storedMentionedConversations.map(Int64.init))
    }

    init(binary r: inout BinaryReader) throws(StageRecordError) {
        self.init(devices: try Device.readList(&r), online: try r.strings())
        var p = Preferences()
        p.trigger = try r.enumValue(PushTrigger.self)
        let nc = try r.count("items")
        for _ in 0..<nc {
            let id = try r.string()
            p.conversations[id] = ConversationPreference(
                trigger: try r.enumValue(ConversationTrigger.self), muted: try r.bool())
        }
        try p.readQuietTimes(&r)
        p.template = try r.enumValue(TemplateChoice.self)
        p.displayStyle = try r.enumValue(DisplayStyle.self)
        p.displayName = try r.optionalString()
        p.languages = try r.strings()
        p.badge = try r.bool()
        preferences = p
        unread.total = Int(clamping: try r.int())
        let nu = try r.count("items")
        for _ in 0..<nu {
            let id = try r.string()
            unread.conversations[id] = Int(clamping: try r.int())
        }
        if r.version >= 3 {
            unread.mentionTotal = Int(clamping: try r.int())
            let nm = try r.count("items")
            for _ in 0..<nm {
                let id = try r.string()
                unread.mentionConversations[id] = Int(clamping: try r.int())
            }
        }
        if r.version >= 4 {
            preferences.unset = Preferences.Defaultable(rawValue: try r.byte()).intersection(.all)
        }
        if r.version >= 7, !(try r.bool()) { unread.storedTotal = nil }
        if r.version >= 8 {
            preferences.nickname = try r.optionalString()
            unread.storedMentionedConversations = try r.optionalInt().map { Int(clamping: $0) }
        }
    }
}

extension Preferences {
    /// Do not disturb and snooze, as `UserState.write(into:)` wrote them.
    mutating func readQuietTimes(_ r: inout BinaryReader) throws(StageRecordError) {
        if try r.bool() {
            let start = try r.int(), end = try r.int()
            guard (0...1440).contains(start), (0...1440).contains(end) else { throw r.fail("dnd minutes out of range") }
            dnd = DoNotDisturb(
                start: ClockTime(hour: 0, minute: Int(start)), end: ClockTime(hour: 0, minute: Int(end)),
                timezone: try r.string())
        }
        if try r.bool() { snooze = Snooze(start: try r.int(), end: try r.int()) }
    }
}

// MARK: Records

extension IngestedRecord: BinaryRecord {
    public static let binaryType: UInt8 = 1

    public func write(into w: inout BinaryWriter) {
        event.write(into: &w)
        w.int(ingestedAt)
    }

    public init(binary r: inout BinaryReader) throws(StageRecordError) {
        self.init(event: try ChatEvent(binary: &r), ingestedAt: try r.int())
    }
}

extension ResolvedRecord: EventFirstRecord {
    public static let binaryType: UInt8 = 2

    public func write(into w: inout BinaryWriter) {
        event.write(into: &w)
        w.string(recipient)
        state.write(into: &w)
        w.optional(senderDisplayName)
    }

    public init(binary r: inout BinaryReader) throws(StageRecordError) {
        try self.init(event: try ChatEvent(binary: &r), rest: &r)
    }

    public init(event: ChatEvent, rest r: inout BinaryReader) throws(StageRecordError) {
        self.init(
            event: event, recipient: try r.string(), state: try UserState(binary: &r),
            senderDisplayName: try r.optionalString())
    }

    public static func decodeBinary(
        _ bytes: [UInt8], reusing reuse: inout EventReuse
    ) throws(StageRecordError)
        -> ResolvedRecord
    {
        try BinaryRecordFormat.decode(ResolvedRecord.self, from: bytes, reusing: &reuse)
    }
}

extension DeliverableRecord: EventFirstRecord {
    public static let binaryType: UInt8 = 3

    public static func decodeBinary(
        _ bytes: [UInt8], reusing reuse: inout EventReuse
    ) throws(StageRecordError)
        -> DeliverableRecord
    {
        try BinaryRecordFormat.decode(DeliverableRecord.self, from: bytes, reusing: &reuse)
    }

    public func write(into w: inout BinaryWriter) {
        event.write(into: &w)
        w.string(recipient)
        state.write(into: &w)
        Device.write(targets, into: &w)
        w.optional(senderDisplayName)
        w.optional(burst.map(Int64.init))
    }

    public init(binary r: inout BinaryReader) throws(StageRecordError) {
        try self.init(event: try ChatEvent(binary: &r), rest: &r)
    }

    public init(event: ChatEvent, rest r: inout BinaryReader) throws(StageRecordError) {
        self.init(
            event: event, recipient: try r.string(), state: try UserState(binary: &r),
            targets: try Device.readList(&r), senderDisplayName: try r.optionalString())
        if r.version >= 5 { burst = try r.optionalInt().map { Int(clamping: $0) } }
    }
}

extension PushRequest {
    func write(into w: inout BinaryWriter) {
        w.string(token); w.string(environment.rawValue); w.string(pushType.rawValue); w.string(topic)
        w.int(priority); w.optional(collapseID); w.int(expiration); w.string(apnsID); w.bytes(payload)
        w.string(provider.rawValue); w.optional(providerID)
        w.byte(guesses.rawValue)
    }

    init(binary r: inout BinaryReader) throws(StageRecordError) {
        self.init(
            token: try r.string(), environment: try r.enumValue(APNsEnvironment.self),
            pushType: try r.enumValue(PushType.self), topic: try r.string(), priority: Int(clamping: try r.int()),
            collapseID: try r.optionalString(), expiration: try r.int(), apnsID: try r.string(), payload: try r.bytes(),
            provider: try r.enumValue(PushProvider.self), providerID: try r.optionalString())
        if r.version >= 7 { guesses = Guesses(rawValue: try r.byte()).intersection(.all) }
    }
}

extension OutboundRecord: BinaryRecord {
    public static let binaryType: UInt8 = 4

    public func write(into w: inout BinaryWriter) {
        w.string(eventID); w.string(appID); w.string(recipient)
        request.write(into: &w)
        w.int(attempt); w.optional(notBefore)
        w.optional(eventCreatedAt)
    }

    public init(binary r: inout BinaryReader) throws(StageRecordError) {
        self.init(
            eventID: try r.string(), appID: try r.string(), recipient: try r.string(),
            request: try PushRequest(binary: &r), attempt: Int(clamping: try r.int()), notBefore: try r.optionalInt())
        if r.version >= 6 { eventCreatedAt = try r.optionalInt() }
    }
}

extension ResolvedRecord {
    /// The wire bytes of one event's records for many recipients, with the event encoded once (resolve's fan-out:
    /// a conversation of thousands would otherwise encode the same event thousands of times).
    public static func wireBytes(
        event: ChatEvent, recipients: [(user: String, state: UserState)],
        senderDisplayName: String?
    ) -> [[UInt8]] {
        var eventWriter = BinaryWriter(capacity: 512)
        event.write(into: &eventWriter)
        let eventBytes = eventWriter.bytes
        return recipients.map { recipient in
            // Room for the whole record up front (a device takes about 100 bytes), so it is never grown and copied.
            var w = BinaryWriter(capacity: eventBytes.count + 256 + 128 * recipient.state.devices.count)
            w.byte(BinaryRecordFormat.magic.0); w.byte(BinaryRecordFormat.magic.1)
            w.byte(BinaryRecordFormat.version); w.byte(binaryType)
            w.raw(eventBytes)
            w.string(recipient.user)
            recipient.state.write(into: &w)
            w.optional(senderDisplayName)
            return w.bytes
        }
    }
}

extension BinaryWriter {
    /// Appends bytes already in the binary form (a field encoded once and reused).
    public mutating func raw(_ encoded: [UInt8]) { bytes.append(contentsOf: encoded) }

    /// Appends `range` of `raw` as it is (a field carried on from an input record).
    mutating func raw(_ raw: UnsafeRawBufferPointer, _ range: Range<Int>) {
        bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: raw[range]))
    }
}
extension APNsPushType: BinaryTextEnum { public static let binaryNames = BinaryEnumNames<Self>() }
