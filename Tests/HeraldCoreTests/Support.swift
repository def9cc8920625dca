import Foundation
import HeraldCore
import Testing

/// Parses JSON text in tests; a malformed literal fails the test.
func json(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) -> JSONValue {
    do {
        return try JSONValue.parse(text)
    } catch {
        Issue.record("bad JSON literal in test: \(error)", sourceLocation: sourceLocation)
        return .null
    }
}

/// The same value with every object's keys sorted (order-insensitive comparison).
func canonical(_ v: JSONValue) -> JSONValue {
    switch v {
    case .array(let a): return .array(a.map(canonical))
    case .object(let o): return .object(o.map { ($0.0, canonical($0.1)) }.sorted { $0.0 < $1.0 })
    default: return v
    }
}

func event(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> ChatEvent {
    try ChatEvent.decode(Array(text.utf8))
}

let tokenA = String(repeating: "a1", count: 32)
let tokenB = String(repeating: "b2", count: 32)
let tokenV = String(repeating: "c3", count: 32)
/// 2024-11-19T07:06:40Z (16:06:40 in Seoul).
let t0: Int64 = 1_732_000_000_000
let now0 = Date(timeIntervalSince1970: 1_732_000_000)

func device(
    _ token: String = tokenA, kind: Device.Kind = .apns, bundle: String? = "com.example.chat",
    at: Int64 = 0
) -> Device {
    Device(token: token, kind: kind, environment: .production, bundleID: bundle, registeredAt: at)
}

func user(
    devices: [Device] = [device()], online: [String] = [], prefs: Preferences = Preferences(),
    unread: Int = 0
) -> UserState {
    UserState(devices: devices, online: online, preferences: prefs, unread: Unread(total: unread))
}

/// A message event in JSON, with overridable parts.
func messageJSON(
    id: String = "e1", app: String = "app1", createdAt: Int64? = t0, sender: String = "6001",
    senderName: String = "Cindy", conversation: String = "c1", type: String = "group",
    convName: String = "Hiking", convCustomType: String = "", recipients: [String]? = nil,
    messageID: String = "373360335316321408", messageType: String = "text", text: String = "Bye!",
    file: String? = nil, mentions: [String] = [], mentionType: String = "users",
    language: String? = nil, translations: String? = nil, ext: String = "{}"
) -> String {
    var s = "{\"event_id\":\"\(id)\",\"app_id\":\"\(app)\",\"kind\":\"message\","
    if let createdAt { s += "\"created_at\":\(createdAt)," }
    s += "\"sender\":{\"id\":\"\(sender)\",\"name\":\"\(senderName)\"},"
    s +=
        "\"conversation\":{\"id\":\"\(conversation)\",\"type\":\"\(type)\",\"name\":\"\(convName)\",\"custom_type\":\"\(convCustomType)\"},"
    if let recipients { s += "\"recipients\":[" + recipients.map { "\"\($0)\"" }.joined(separator: ",") + "]," }
    s +=
        "\"message\":{\"id\":\"\(messageID)\",\"type\":\"\(messageType)\",\"text\":\(JSONValue.string(text).serialized),"
    if let file { s += "\"file\":\(file)," }
    if let language { s += "\"language\":\"\(language)\"," }
    if let translations { s += "\"translations\":\(translations)," }
    s +=
        "\"mentions\":[" + mentions.map { "\"\($0)\"" }.joined(separator: ",")
        + "],\"mention_type\":\"\(mentionType)\"},"
    s += "\"ext\":\(ext)}"
    return s
}

/// Decides and renders for one recipient; returns the decision and the payloads as JSON.
func run(
    _ event: ChatEvent, to recipient: String, state: UserState, app: AppConfig,
    senderDisplayName: String? = nil, at: Int64? = nil
) throws -> (Decision, [PushRequest]) {
    let decision =
        at.map { Suppression.decide(event: event, recipient: recipient, state: state, app: app, at: $0) }
        ?? Suppression.decide(event: event, recipient: recipient, state: state, app: app, now: now0)
    guard case .deliver(let targets) = decision else { return (decision, []) }
    let requests = try Renderer.render(
        event: event, recipient: recipient, state: state, targets: targets, app: app,
        senderDisplayName: senderDisplayName, now: now0)
    return (decision, requests)
}

func payload(_ r: PushRequest) throws -> JSONValue { try JSONValue.parse(r.payload) }

/// A record's binary form as format version 6 wrote it (records in flight during an upgrade): `wire` without
/// version 7's byte after the event (its sound silenced) and its byte after the state (the unread total known).
/// `silenced` is the same record with the event's sound silenced, `unknownTotal` the same record with the unread
/// total unknown: the bytes where they differ from `wire` locate the two flags.
func version6Bytes(_ wire: [UInt8], silenced: [UInt8], unknownTotal: [UInt8]) throws -> [UInt8] {
    try #require(wire.count == silenced.count)
    let event = try #require(zip(wire, silenced).enumerated().first { $0.element.0 != $0.element.1 }?.offset)
    // The total's own bytes may differ in length: count the flag's place from the end.
    let fromEnd = try #require(
        zip(wire.reversed(), unknownTotal.reversed()).enumerated().first { $0.element.0 != $0.element.1 }?.offset)
    let state = wire.count - 1 - fromEnd
    var out = wire
    out.remove(at: state)
    out.remove(at: event)
    out[2] = 6
    return out
}

/// `record`'s binary form as format version 6 wrote it (its event must not be silenced, its unread total known).
func version6Bytes(_ record: ResolvedRecord) throws -> [UInt8] {
    var silenced = record
    silenced.event.ext.apns.soundSilenced = true
    var unknown = record
    unknown.state.unread.storedTotal = nil
    return try version6Bytes(
        try version7Bytes(record, { $0.wireBytes() }), silenced: try version7Bytes(silenced, { $0.wireBytes() }),
        unknownTotal: try version7Bytes(unknown, { $0.wireBytes() }))
}

/// `record`'s binary form as format version 6 wrote it (its event must not be silenced, its unread total known).
func version6Bytes(_ record: DeliverableRecord) throws -> [UInt8] {
    var silenced = record
    silenced.event.ext.apns.soundSilenced = true
    var unknown = record
    unknown.state.unread.storedTotal = nil
    return try version6Bytes(
        try version7Bytes(record, { $0.wireBytes() }), silenced: try version7Bytes(silenced, { $0.wireBytes() }),
        unknownTotal: try version7Bytes(unknown, { $0.wireBytes() }))
}

/// A record's binary form as format version 7 wrote it: without version 8's six bytes after the event (no
/// channel type, avatar, hiding members, metadata, attachments or digest) and two after the state (no nickname, no count
/// of mentioned conversations). The record must set none of them; copies that set a channel type and a nickname
/// locate the bytes where they differ from `wire`.
func version7Bytes<R: StageRecordHolder>(_ record: R, _ wire: (R) -> [UInt8]) throws -> [UInt8] {
    let bytes = wire(record)
    var typed = record
    typed.event.conversation.channelType = "chat"
    let event = try #require(zip(bytes, wire(typed)).enumerated().first { $0.element.0 != $0.element.1 }?.offset)
    var named = record
    named.state.preferences.nickname = "n"
    let named8 = wire(named)
    let state = try #require(zip(bytes, named8).enumerated().first { $0.element.0 != $0.element.1 }?.offset)
    try #require(bytes[event..<(event + 6)].allSatisfy { $0 == 0 } && bytes[state] == 0 && bytes[state + 1] == 0)
    var out = bytes
    out.removeSubrange(state..<(state + 2))
    out.removeSubrange(event..<(event + 6))
    out[2] = 7
    return out
}

/// A record with an event and a state (resolved and deliverable records).
protocol StageRecordHolder {
    var event: ChatEvent { get set }
    var state: UserState { get set }
}

extension ResolvedRecord: StageRecordHolder {}
extension DeliverableRecord: StageRecordHolder {}
