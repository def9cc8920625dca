// Records the pipeline stages put on Kafka between them. Their codecs: RecordCodec.swift (JSON) and
// BinaryRecord.swift (the binary form between stages).
// Field names are snake_case; every record is self-contained so a stage needs
// nothing but its input record (and the app configuration) to do its work.

import Foundation

/// `herald.ingested`: the validated, normalised event. Keyed by conversation id.
public struct IngestedRecord: Sendable, Hashable {
    public var event: ChatEvent
    /// When ingest admitted it, epoch milliseconds.
    public var ingestedAt: Int64

    public init(event: ChatEvent, ingestedAt: Int64) {
        self.event = event
        self.ingestedAt = ingestedAt
    }

    public var key: String { event.conversation.id }
}

/// `herald.resolved`: the event for one recipient with that recipient's state.
/// Keyed by recipient user id.
public struct ResolvedRecord: Sendable, Hashable {
    public var event: ChatEvent
    public var recipient: String
    public var state: UserState
    /// The sender's push display name, when the sender set one (resolve reads it).
    public var senderDisplayName: String?

    public init(event: ChatEvent, recipient: String, state: UserState, senderDisplayName: String? = nil) {
        self.event = event
        self.recipient = recipient
        self.state = state
        self.senderDisplayName = senderDisplayName
    }

    public var key: String { recipient }
}

/// `herald.deliverable`: a recipient the rules let through, with the devices to target.
/// Keyed by recipient user id. `state` carries what rendering reads (preferences, unread counts); suppress
/// leaves its device and presence lists empty, since `targets` names the devices.
public struct DeliverableRecord: Sendable, Hashable {
    public var event: ChatEvent
    public var recipient: String
    public var state: UserState
    public var targets: [Device]
    public var senderDisplayName: String?
    /// The message's place in a coalesced burst (docs/behaviour.md §6a): 1 opens it, n > 1 is an update showing n
    /// messages; -n is a flood guard's summary of n held pushes (§6b); nil when the push is not coalesced.
    public var burst: Int?

    public init(
        event: ChatEvent, recipient: String, state: UserState, targets: [Device],
        senderDisplayName: String? = nil
    ) {
        self.event = event
        self.recipient = recipient
        self.state = state
        self.targets = targets
        self.senderDisplayName = senderDisplayName
    }

    public var key: String { recipient }
}

/// `herald.outbound` and `herald.retry`: one rendered APNs request. Keyed by device token.
public struct OutboundRecord: Sendable, Hashable {
    /// The record's values, behind one reference (`CopyOnWrite`): send copies its records between its steps
    /// (claims, lanes, retries), and a copy is then one retain.
    struct Values: Sendable, Hashable {
        var eventID: String
        var appID: String
        var recipient: String
        var request: PushRequest
        var attempt: Int
        var notBefore: Int64?
        var eventCreatedAt: Int64?
    }

    private var values: CopyOnWrite<Values>

    public var eventID: String {
        get { values.value.eventID }
        set { values.modify { $0.eventID = newValue } }
        _modify { yield &values.value.eventID }
    }
    public var appID: String {
        get { values.value.appID }
        set { values.modify { $0.appID = newValue } }
        _modify { yield &values.value.appID }
    }
    public var recipient: String {
        get { values.value.recipient }
        set { values.modify { $0.recipient = newValue } }
        _modify { yield &values.value.recipient }
    }
    public var request: PushRequest {
        get { values.value.request }
        set { values.modify { $0.request = newValue } }
        _modify { yield &values.value.request }
    }
    /// 1 for the first try; send increments it on every retry.
    public var attempt: Int {
        get { values.value.attempt }
        set { values.modify { $0.attempt = newValue } }
        _modify { yield &values.value.attempt }
    }
    /// Do not send before this time (epoch milliseconds); set on retries.
    public var notBefore: Int64? {
        get { values.value.notBefore }
        set { values.modify { $0.notBefore = newValue } }
        _modify { yield &values.value.notBefore }
    }
    /// The event's `created_at` (epoch milliseconds), when it has one: send files the pair's idempotency record
    /// under the replay window this time falls in (`DeliveryPair.eventTime`).
    public var eventCreatedAt: Int64? {
        get { values.value.eventCreatedAt }
        set { values.modify { $0.eventCreatedAt = newValue } }
        _modify { yield &values.value.eventCreatedAt }
    }

    public init(
        eventID: String, appID: String, recipient: String, request: PushRequest, attempt: Int = 1,
        notBefore: Int64? = nil, eventCreatedAt: Int64? = nil
    ) {
        values = CopyOnWrite(
            Values(
                eventID: eventID, appID: appID, recipient: recipient, request: request, attempt: attempt,
                notBefore: notBefore, eventCreatedAt: eventCreatedAt))
    }

    /// The pair send claims, confirms or releases for this record.
    public var deliveryPair: DeliveryPair {
        DeliveryPair(eventID: eventID, token: request.token, eventTime: eventCreatedAt)
    }

    public var key: String { request.token }
}

/// `herald.dlq`: what a stage could not process, and why.
public struct DLQRecord: Sendable, Hashable {
    /// The input record's bytes (or the output the broker refused), base64; cut to the stage's
    /// `dlqMaxOriginalBytes` when longer (then `truncated` is true and `originalSize` / `originalSHA256`
    /// describe the whole original).
    public var original: String
    /// The topic the original came from, when known.
    public var sourceTopic: String?
    /// The topic the original was meant for when it is an output the broker refused (`produce_rejected`): replay
    /// sends it there. `sourceTopic`, `sourcePartition` and `sourceOffset` then name the input it was made from.
    public var targetTopic: String?
    /// The partition and offset the original was read from, when known (to find it on the topic).
    public var sourcePartition: Int32?
    public var sourceOffset: Int64?
    /// The whole original's size in bytes and its SHA-256 (hex), set when the original was cut.
    public var originalSize: Int?
    public var originalSHA256: String?
    /// True when `original` holds only the first bytes of the original.
    public var truncated: Bool
    /// The stage that gave up: ingest, resolve, suppress, render, send, registry.
    public var stage: String
    /// A stable reason code (`invalid`, `payload_too_large`, `BadTopic`, ...).
    public var reason: String
    /// A human readable detail (never message text or a full token).
    public var detail: String
    /// When, epoch milliseconds.
    public var time: Int64

    public init(
        original: [UInt8], maxOriginalBytes: Int = .max, sourceTopic: String? = nil,
        sourcePartition: Int32? = nil, sourceOffset: Int64? = nil, targetTopic: String? = nil, stage: String,
        reason: String, detail: String, time: Int64
    ) {
        if original.count > maxOriginalBytes {
            self.original = Data(original.prefix(max(0, maxOriginalBytes))).base64EncodedString()
            self.originalSize = original.count
            self.originalSHA256 = SHA256.hex(original)
            self.truncated = true
        } else {
            self.original = Data(original).base64EncodedString()
            self.truncated = false
        }
        self.sourceTopic = sourceTopic
        self.sourcePartition = sourcePartition
        self.sourceOffset = sourceOffset
        self.targetTopic = targetTopic
        self.stage = stage
        self.reason = reason
        self.detail = detail
        self.time = time
    }

    /// A record whose `original` is already base64 (as read back from the DLQ).
    public init(
        encodedOriginal: String, sourceTopic: String?, sourcePartition: Int32? = nil, sourceOffset: Int64? = nil,
        targetTopic: String? = nil, originalSize: Int? = nil, originalSHA256: String? = nil, truncated: Bool = false,
        stage: String, reason: String, detail: String, time: Int64
    ) {
        self.original = encodedOriginal
        self.sourceTopic = sourceTopic
        self.sourcePartition = sourcePartition
        self.sourceOffset = sourceOffset
        self.targetTopic = targetTopic
        self.originalSize = originalSize
        self.originalSHA256 = originalSHA256
        self.truncated = truncated
        self.stage = stage
        self.reason = reason
        self.detail = detail
        self.time = time
    }

    /// Where `heraldctl dlq replay` sends the original: the topic an output was meant for, else the input's topic.
    public var replayTopic: String? { targetTopic ?? sourceTopic }

    /// The original bytes, or nil when `original` is not valid base64.
    public var originalBytes: [UInt8]? { Data(base64Encoded: original).map { Array($0) } }
}

/// A stage record could not be decoded.
public struct StageRecordError: Error, Sendable, Hashable, CustomStringConvertible {
    public var record: String
    public var detail: String
    public var description: String { "\(record): \(detail)" }
}
