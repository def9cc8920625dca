// Suppress's read of a `herald.resolved` record: the fields the rules of docs/behaviour.md §6 look at, and the
// byte ranges of everything else, which go on into the `herald.deliverable` record as they came.
//
// Suppress decides on an event's kind, sender, conversation, mentions and call action and on the recipient's
// devices, presence and push settings; it never looks at the message's text, the names, the translations, the
// APNs extension's strings, the template or the unread counts. A full decode built a string for each of those in
// every record (and a dictionary for the unread counts), only for suppress to write them out again: that decode
// cost suppress about as much as the rest of its work together. Here those fields are stepped over, and the
// deliverable record is put together from the input's own bytes (`DeliverableRecord.wireBytes(forwarding:)`),
// the same bytes the full decode and encode give.
//
// Only a record in the current format is read this way (its bytes are then the output's); an older version or a
// JSON record is decoded whole, by the full decoder. A field stepped over is still bounds-checked, so a truncated
// record is refused here; a value that is well framed but wrong (an unknown template name) is refused by render,
// which decodes the whole record.

/// The parts of a `herald.resolved` record that a deliverable record carries on unchanged, as ranges of its bytes.
public struct ForwardedParts: Sendable {
    /// The input record's bytes (shared, not copied).
    public let bytes: [UInt8]
    let event: Range<Int>
    let recipient: Range<Int>
    /// From the push settings' trigger to the end of the state (settings, unread counts, the unset mask): what
    /// follows the devices and presence, which a deliverable record leaves empty.
    let settings: Range<Int>
    let senderDisplayName: Range<Int>
}

/// A resolved record as suppress reads it: `record` holds what the rules and the explain trail need (the event's
/// other strings are empty, the state has no template, languages or unread counts), `forwarded` the bytes of the
/// rest. `forwarded` is nil when the record was decoded whole (JSON, or an older format version); then `record` is
/// complete and is encoded again.
public struct RulesRecord: Sendable {
    public let record: ResolvedRecord
    public let forwarded: ForwardedParts?
}

extension ResolvedRecord {
    /// Reads `bytes` for suppress (see `RulesRecord`). The event is taken from `reuse` when an earlier record of the
    /// batch had the same event bytes (entries read this way are kept apart from whole ones).
    public static func readForRules(
        _ bytes: [UInt8], reusing reuse: inout EventReuse
    ) throws(StageRecordError) -> RulesRecord {
        guard bytes.count > 3, BinaryRecordFormat.isBinary(bytes), bytes[2] == BinaryRecordFormat.version else {
            let record =
                BinaryRecordFormat.isBinary(bytes)
                ? try decodeBinary(bytes, reusing: &reuse) : try StageCodec.decode(ResolvedRecord.self, from: bytes)
            return RulesRecord(record: record, forwarded: nil)
        }
        return try BinaryRecordFormat.read(ResolvedRecord.self, from: bytes) {
            (r, raw) throws(StageRecordError) -> RulesRecord in
            let eventStart = r.offset
            let event = try reuse.event(raw, reader: &r, partial: true) {
                (r) throws(StageRecordError) -> ChatEvent in try ChatEvent(rulesBinary: &r)
            }
            let recipientStart = r.offset
            let recipient = try r.string()
            let recipientEnd = r.offset
            let devices = try Device.readList(&r)
            let online = try r.strings()
            let settingsStart = r.offset
            let preferences = try Preferences(rulesBinary: &r, conversation: event.conversation.id)
            let settingsEnd = r.offset
            try r.skipOptionalString()
            return RulesRecord(
                record: ResolvedRecord(
                    event: event, recipient: recipient,
                    state: UserState(devices: devices, online: online, preferences: preferences)),
                forwarded: ForwardedParts(
                    bytes: bytes, event: eventStart..<recipientStart, recipient: recipientStart..<recipientEnd,
                    settings: settingsStart..<settingsEnd, senderDisplayName: settingsEnd..<r.offset))
        }
    }
}

extension DeliverableRecord {
    /// The deliverable record of a resolved record read by `ResolvedRecord.readForRules`, for `targets` (devices of
    /// its state) at burst position `burst`: byte for byte what `DeliverableRecord(...).wireBytes()` gives for the
    /// whole record with its devices and presence emptied, as suppress writes it.
    ///
    /// `event`: the event's wire bytes (`ChatEvent.wireBytes`) to write in place of the input's, when suppress
    /// changed the event (a translation added, docs/behaviour.md §7a); nil writes the input's.
    public static func wireBytes(
        forwarding parts: ForwardedParts, event: [UInt8]? = nil, targets: [Device], burst: Int?
    ) -> [UInt8] {
        var w = BinaryWriter(capacity: parts.bytes.count + (event?.count ?? 0) + 16)
        w.byte(BinaryRecordFormat.magic.0); w.byte(BinaryRecordFormat.magic.1)
        w.byte(BinaryRecordFormat.version); w.byte(binaryType)
        parts.bytes.withUnsafeBytes { raw in
            if let event { w.raw(event) } else { w.raw(raw, parts.event) }
            w.raw(raw, parts.recipient)
            w.varint(0)  // no devices: `targets` names them
            w.varint(0)  // no presence
            w.raw(raw, parts.settings)
            Device.write(targets, into: &w)
            w.raw(raw, parts.senderDisplayName)
        }
        w.optional(burst.map(Int64.init))
        return w.bytes
    }
}

extension ForwardedParts {
    // What the rules stepped over that a translation needs (docs/behaviour.md §7a), each read on its own: the
    // recipient's languages first (a few bytes), the whole event only for a recipient who has languages.

    /// The recipient's preferred languages, read from the push settings as `UserState.write(into:)` wrote them.
    public func preferredLanguages() throws(StageRecordError) -> [String] {
        try reading { (raw) throws(StageRecordError) -> [String] in
            var s = BinaryReader(raw, offset: settings.lowerBound, record: ResolvedRecord.self)
            _ = try s.enumValue(PushTrigger.self)
            for _ in 0..<(try s.count("items")) {
                try s.skipString(); try s.skipString()
                _ = try s.bool()
            }
            var quiet = Preferences()
            try quiet.readQuietTimes(&s)
            try s.skipString(); try s.skipString(); try s.skipOptionalString()  // template, display style, name
            return try s.strings()
        }
    }

    /// The whole event, taken from `reuse` when an earlier record of the batch had the same event bytes.
    public func wholeEvent(reusing reuse: inout EventReuse) throws(StageRecordError) -> ChatEvent {
        try reading { (raw) throws(StageRecordError) -> ChatEvent in
            var r = BinaryReader(raw, offset: event.lowerBound, record: ResolvedRecord.self)
            let whole = try reuse.event(raw, reader: &r, partial: false) {
                (r) throws(StageRecordError) -> ChatEvent in try ChatEvent(binary: &r)
            }
            guard r.offset == event.upperBound else { throw r.fail("event read to a different end") }
            return whole
        }
    }

    /// `body` over the record's bytes (`withUnsafeBytes` rethrows untyped: its error is typed again here).
    private func reading<T>(
        _ body: (UnsafeRawBufferPointer) throws(StageRecordError) -> T
    ) throws(StageRecordError) -> T {
        do {
            return try bytes.withUnsafeBytes { (raw) throws(StageRecordError) -> T in try body(raw) }
        } catch let error as StageRecordError {
            throw error
        } catch {
            throw StageRecordError(record: "ResolvedRecord", detail: "\(error)")
        }
    }
}

extension ChatEvent {
    /// The event as records between the stages carry it (the bytes a deliverable record starts with).
    public var wireBytes: [UInt8] {
        var w = BinaryWriter(capacity: 512)
        write(into: &w)
        return w.bytes
    }
}

extension DeliverableRecord {
    /// Where the event's bytes sit in the wire bytes of a binary deliverable record of this format version: after
    /// the 4 header bytes, up to the recipient. A message held in a burst keeps them once, shared by every burst that
    /// holds it (docs/redis-keys.md, "Bursts"); nil for anything else (another record, another version, bytes that
    /// do not read as an event).
    public static func eventRange(inWireBytes bytes: [UInt8]) -> Range<Int>? {
        guard bytes.count > 4, BinaryRecordFormat.isBinary(bytes), bytes[2] == BinaryRecordFormat.version,
            bytes[3] == binaryType
        else { return nil }
        return bytes.withUnsafeBytes { raw -> Range<Int>? in
            var r = BinaryReader(raw, offset: 4, record: DeliverableRecord.self)
            do { _ = try ChatEvent(rulesBinary: &r) } catch { return nil }
            return r.offset > 4 && r.offset < bytes.count ? 4..<r.offset : nil
        }
    }
}

extension BinaryReader {
    /// Steps over a string.
    mutating func skipString() throws(StageRecordError) { skip(try count("string")) }

    mutating func skipOptionalString() throws(StageRecordError) { if try bool() { try skipString() } }

    mutating func skipStrings() throws(StageRecordError) {
        let n = try count("items")
        for _ in 0..<n { try skipString() }
    }
}

extension ChatEvent {
    /// The event as `write(into:)` wrote it, with the strings the rules never read stepped over and left empty
    /// (names, profile URL, the explicit recipients, the message's id, text, custom type, data, file, language and
    /// translations, the call's session id, the reaction, the group action's actor, the APNs extension's strings).
    /// Every enum, flag and count is read as the full decode reads it.
    init(rulesBinary r: inout BinaryReader) throws(StageRecordError) {
        let eventID = try r.string(), appID = try r.string(), kind = try r.enumValue(Kind.self)
        let createdAt = try r.optionalInt()
        let senderID = try r.string()
        try r.skipOptionalString(); try r.skipOptionalString()
        let conversation = Conversation(id: try r.string(), type: try r.enumValue(ConversationType.self))
        try r.skipOptionalString(); try r.skipOptionalString()
        if try r.bool() { try r.skipStrings() }
        var message: Message?
        if try r.bool() {
            try r.skipString()
            let type = try r.enumValue(MessageType.self)
            try r.skipString(); try r.skipString(); try r.skipString()
            var file: File?
            if try r.bool() {
                try r.skipOptionalString(); try r.skipOptionalString(); try r.skipOptionalString()
                file = File()
            }
            let mentions = try r.strings(), mentionType = try r.enumValue(MentionType.self)
            try r.skipOptionalString()
            let n = try r.count("items")
            for _ in 0..<n { try r.skipString(); try r.skipString() }
            message = Message(
                id: "", type: type, text: "", customType: "", data: "", file: file, mentions: mentions,
                mentionType: mentionType, language: nil, translations: [])
        }
        var call: Call?
        if try r.bool() {
            let action = try r.enumValue(CallAction.self)
            try r.skipString()
            call = Call(action: action, sessionID: "", type: try r.enumValue(CallType.self))
        }
        var reaction: Reaction?
        if try r.bool() {
            try r.skipString(); try r.skipOptionalString()
            reaction = Reaction(emoji: "")
        }
        var groupAction: GroupAction?
        if try r.bool() {
            let action = try r.enumValue(GroupActionKind.self)
            try r.skipString()
            groupAction = GroupAction(action: action, actorName: "")
        }
        let ignore = try r.bool(), force = try r.bool()
        var a = APNsExtension()
        try r.skipOptionalString(); try r.skipOptionalString(); try r.skipOptionalString()
        a.mutableContent = try r.bool()
        try r.skipOptionalString()
        if try r.bool() { try r.skipStrings() }
        try r.skipOptionalString()
        if try r.bool() { try r.skipStrings() }
        try r.skipOptionalString()
        _ = try r.bool()  // sound silenced
        try r.skipOptionalString(); try r.skipOptionalString(); try r.skipStrings()  // channel type, avatar, hidden by
        try r.skipOptionalString()  // metadata
        for _ in 0..<(try r.count("items")) {
            try r.skipOptionalString(); try r.skipOptionalString(); try r.skipOptionalString()
        }
        let digest = try DigestSummary.read(&r)  // a digest's counts, read whole (small, and rare)
        self.init(
            eventID: eventID, appID: appID, kind: kind, createdAt: createdAt, sender: Sender(id: senderID),
            conversation: conversation, recipients: nil, message: message, call: call, reaction: reaction,
            groupAction: groupAction, ext: Extension(ignoreNotification: ignore, forceNotification: force, apns: a))
        self.digest = digest
    }
}

extension Preferences {
    /// The push settings as `UserState.write(into:)` wrote them, for the rules: the trigger, the setting of
    /// `conversation` alone (the rules read no other), do not disturb, snooze and the unset mask. The template,
    /// display style and name, languages, badge and the unread counts between them are stepped over.
    init(rulesBinary r: inout BinaryReader, conversation: String) throws(StageRecordError) {
        self.init()
        trigger = try r.enumValue(PushTrigger.self)
        let nc = try r.count("items")
        for _ in 0..<nc {
            let id = try r.string()
            let setting = ConversationPreference(
                trigger: try r.enumValue(ConversationTrigger.self), muted: try r.bool())
            if id == conversation { conversations[id] = setting }
        }
        try readQuietTimes(&r)
        try r.skipString(); try r.skipString(); try r.skipOptionalString()  // template, display style, name
        try r.skipStrings()  // languages
        _ = try r.bool()  // badge
        _ = try r.int()  // unread total
        for _ in 0..<(try r.count("items")) {
            try r.skipString()
            _ = try r.int()
        }
        _ = try r.int()  // mention total
        for _ in 0..<(try r.count("items")) {
            try r.skipString()
            _ = try r.int()
        }
        unset = Defaultable(rawValue: try r.byte()).intersection(.all)
        _ = try r.bool()  // unread total known
        try r.skipOptionalString()  // nickname
        _ = try r.optionalInt()  // conversations with an unread mention
    }
}
