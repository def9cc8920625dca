// What APNs checks on each request, in the order the stand-in checks it. Pure: no I/O, no clock.
import Glibc

/// The request headers the stand-in looks at.
public enum RequestField: Int, CaseIterable, Sendable {
    case method, path, authorization, topic, pushType, priority, expiration, collapseID, apnsID

    static let count = RequestField.allCases.count

    /// Maps an HTTP/2 header name to a field.
    @inline(__always)
    static func from(name: UnsafeRawBufferPointer) -> RequestField? {
        switch name.count {
        case 5: return equals(name, ":path") ? .path : nil
        case 7:
            if equals(name, ":method") { return .method }
            if equals(name, "apns-id") { return .apnsID }
            return nil
        case 10: return equals(name, "apns-topic") ? .topic : nil
        case 13:
            if equals(name, "authorization") { return .authorization }
            if equals(name, "apns-priority") { return .priority }
            return nil
        case 14: return equals(name, "apns-push-type") ? .pushType : nil
        case 15: return equals(name, "apns-expiration") ? .expiration : nil
        case 16: return equals(name, "apns-collapse-id") ? .collapseID : nil
        default: return nil
        }
    }

    @inline(__always)
    static func equals(_ a: UnsafeRawBufferPointer, _ b: StaticString) -> Bool {
        guard a.count == b.utf8CodeUnitCount, let base = a.baseAddress else { return false }
        return memcmp(base, b.utf8Start, a.count) == 0
    }
}

/// The raw request head of one stream: header values copied into one reusable byte arena.
public struct RequestHead {
    public private(set) var arena: [UInt8] = []
    private var starts = [Int32](repeating: 0, count: RequestField.count)
    private var counts = [Int32](repeating: -1, count: RequestField.count)
    /// A checked header appeared twice.
    public private(set) var duplicate = false

    public init() { arena.reserveCapacity(512) }

    public mutating func reset() {
        arena.removeAll(keepingCapacity: true)
        for i in 0..<RequestField.count { counts[i] = -1 }
        duplicate = false
    }

    public mutating func set(_ field: RequestField, _ value: UnsafeRawBufferPointer) {
        let i = field.rawValue
        if counts[i] >= 0 { duplicate = true; return }
        starts[i] = Int32(arena.count)
        counts[i] = Int32(value.count)
        arena.append(contentsOf: value)
    }

    public mutating func set(_ field: RequestField, _ value: String) {
        var v = value
        v.withUTF8 { set(field, UnsafeRawBufferPointer($0)) }
    }

    public func has(_ field: RequestField) -> Bool { counts[field.rawValue] >= 0 }

    /// The field's bytes, or nil when absent.
    @inline(__always)
    public func with<R>(_ field: RequestField, _ body: (UnsafeRawBufferPointer?) -> R) -> R {
        let i = field.rawValue
        let n = Int(counts[i])
        guard n >= 0 else { return body(nil) }
        return arena.withUnsafeBytes { raw in
            body(UnsafeRawBufferPointer(rebasing: raw[Int(starts[i])..<(Int(starts[i]) + n)]))
        }
    }

    public func string(_ field: RequestField) -> String? {
        with(field) { $0.map { String(decoding: $0, as: UTF8.self) } }
    }

    /// The device token part of the path when it starts with /3/device/.
    public func withToken<R>(_ body: (UnsafeRawBufferPointer?) -> R) -> R {
        with(.path) { path in
            guard let path, path.count >= RequestCheck.pathPrefix.count,
                RequestField.equals(
                    UnsafeRawBufferPointer(rebasing: path[0..<RequestCheck.pathPrefix.count]), "/3/device/")
            else { return body(nil) }
            return body(UnsafeRawBufferPointer(rebasing: path[RequestCheck.pathPrefix.count...]))
        }
    }
}

/// APNs push types and the topic suffix each requires.
public enum PushType: Int, Sendable, CaseIterable {
    case alert, background, location, voip, complication, fileprovider, mdm, liveactivity, pushtotalk, widgets

    public var name: String {
        switch self {
        case .alert: "alert"
        case .background: "background"
        case .location: "location"
        case .voip: "voip"
        case .complication: "complication"
        case .fileprovider: "fileprovider"
        case .mdm: "mdm"
        case .liveactivity: "liveactivity"
        case .pushtotalk: "pushtotalk"
        case .widgets: "widgets"
        }
    }

    /// What the topic must append to the bundle id for this push type.
    public var topicSuffix: String {
        switch self {
        case .voip: ".voip"
        case .complication: ".complication"
        case .fileprovider: ".pushkit.fileprovider"
        case .liveactivity: ".push-type.liveactivity"
        case .location: ".location-query"
        case .pushtotalk: ".voip-ptt"
        case .widgets: ".push-type.widgets"
        case .alert, .background, .mdm: ""
        }
    }

    /// Largest payload APNs accepts for this push type.
    public var payloadLimit: Int { self == .voip ? 5120 : 4096 }

    static func parse(_ value: UnsafeRawBufferPointer) -> PushType? {
        for t in PushType.allCases {
            var name = t.name
            let match = name.withUTF8 { n in
                n.count == value.count && memcmp(n.baseAddress!, value.baseAddress!, n.count) == 0
            }
            if match { return t }
        }
        return nil
    }
}

/// The APNs environment a stand-in plays (APNs serves each on its own host).
public enum MockEnvironment: String, Sendable, CaseIterable {
    case production, sandbox
}

/// What a device token was issued for: the app's bundle id and the APNs environment. APNs answers a request for
/// another environment `BadDeviceToken` and one for another app's topic `DeviceTokenNotForTopic`.
public struct MockTokenRegistration: Sendable, Hashable {
    public var bundleID: String
    public var environment: MockEnvironment

    public init(bundleID: String, environment: MockEnvironment) {
        self.bundleID = bundleID
        self.environment = environment
    }

    /// Parses `TOKEN:BUNDLE:production|sandbox` into the lowercased token and its registration.
    public static func parse(_ argument: String) -> (token: String, registration: MockTokenRegistration)? {
        let parts = argument.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty, !parts[1].isEmpty,
            let environment = MockEnvironment(rawValue: String(parts[2]))
        else { return nil }
        return (parts[0].lowercased(), MockTokenRegistration(bundleID: String(parts[1]), environment: environment))
    }
}

/// The request checks, configured once; `check` runs per request.
public struct RequestCheck: Sendable {
    static let pathPrefix: [UInt8] = Array("/3/device/".utf8)
    /// The largest body the stand-in keeps (larger ones are counted, not stored).
    public static let maxStoredBody = 5120

    let topics: [[UInt8]]
    let knownSuffixes: [[UInt8]]
    let deadTokens: [String: Int64?]
    /// Tokens with what they were issued for, checked against this stand-in's `environment` and each request's
    /// topic; a token not listed passes.
    let registered: [String: MockTokenRegistration]
    let environment: MockEnvironment

    public init(
        topics: [String], deadTokens: [String: Int64?], registered: [String: MockTokenRegistration] = [:],
        environment: MockEnvironment = .production
    ) {
        var tokens: [String: MockTokenRegistration] = [:]
        for (k, v) in registered { tokens[k.lowercased()] = v }
        self.registered = tokens
        self.environment = environment
        self.topics = topics.map { Array($0.utf8) }
        var suffixes = Set(PushType.allCases.map(\.topicSuffix))
        suffixes.remove("")
        self.knownSuffixes = suffixes.sorted().map { Array($0.utf8) }
        var dead: [String: Int64?] = [:]
        for (k, v) in deadTokens { dead[k.lowercased()] = v }
        self.deadTokens = dead
    }

    /// Checks one complete request.
    /// - Parameters:
    ///   - authorize: called after method and path pass; returns the auth failure, if any.
    ///   - certificateAuth: the connection presented a valid client certificate.
    ///   - nowMillis: the current time, for 410 timestamps.
    public func check(
        head: RequestHead, body: UnsafeRawBufferPointer, bodyLength: Int,
        certificateAuth: Bool, nowMillis: Int64,
        authorize: (UnsafeRawBufferPointer?) -> MockReason?
    ) -> MockVerdict {
        let isPost = head.with(.method) { m in m.map { RequestField.equals($0, "POST") } ?? false }
        guard isPost else { return MockVerdict(.methodNotAllowed) }

        let tokenState: Int = head.withToken { token in
            guard let token else { return 1 }  // not /3/device/
            if token.isEmpty { return 2 }
            return Self.isTokenShaped(token) ? 0 : 3
        }
        if tokenState == 1 { return MockVerdict(.badPath) }
        if tokenState == 2 { return MockVerdict(.missingDeviceToken) }
        if head.duplicate { return MockVerdict(.duplicateHeaders) }

        if let failure = head.with(.authorization, authorize) { return MockVerdict(failure) }

        if tokenState == 3 { return MockVerdict(.badDeviceToken) }

        if head.has(.apnsID) && !head.with(.apnsID, { Self.isUUID($0!) }) { return MockVerdict(.badMessageId) }

        var pushType = PushType.alert
        if head.has(.pushType) {
            guard let t = head.with(.pushType, { PushType.parse($0!) }) else { return MockVerdict(.invalidPushType) }
            pushType = t
        }

        if let failure = checkTopic(head: head, pushType: pushType, certificateAuth: certificateAuth) {
            return MockVerdict(failure)
        }
        if !registered.isEmpty, let failure = checkRegistration(head: head, pushType: pushType) {
            return MockVerdict(failure)
        }

        if head.has(.priority) {
            let ok = head.with(.priority) { p in
                RequestField.equals(p!, "10") || RequestField.equals(p!, "5") || RequestField.equals(p!, "1")
            }
            if !ok { return MockVerdict(.badPriority) }
        }
        if head.has(.expiration) {
            let ok = head.with(.expiration) { e in
                e!.count >= 1 && e!.count <= 18 && e!.allSatisfy { $0 &- 0x30 < 10 }
            }
            if !ok { return MockVerdict(.badExpirationDate) }
        }
        if head.has(.collapseID), head.with(.collapseID, { $0!.count > 64 }) { return MockVerdict(.badCollapseId) }

        if bodyLength == 0 { return MockVerdict(.payloadEmpty) }
        if bodyLength > pushType.payloadLimit { return MockVerdict(.payloadTooLarge) }
        // APNs documents no reason for a payload that is not a JSON object; the closest documented
        // one is PayloadEmpty (there is no usable payload). See docs/mock-apns.md.
        if !JSONCheck.isObject(body) { return MockVerdict(.payloadEmpty) }
        if pushType == .background, let failure = Self.checkBackground(head: head, body: body) {
            return MockVerdict(failure)
        }

        if !deadTokens.isEmpty {
            let key = head.withToken { String(decoding: $0!, as: UTF8.self).lowercased() }
            if let stamp = deadTokens[key] { return MockVerdict(.unregistered, timestamp: stamp ?? nowMillis) }
        }
        return .ok
    }

    /// A token issued for another environment is `BadDeviceToken` there; one issued for another app's bundle is
    /// `DeviceTokenNotForTopic` (APNs's answers to a sandbox token sent to production and to a token of another
    /// bundle).
    func checkRegistration(head: RequestHead, pushType: PushType) -> MockReason? {
        let token = head.withToken { $0.map { String(decoding: $0, as: UTF8.self).lowercased() } }
        guard let token, let registration = registered[token] else { return nil }
        if registration.environment != environment { return .badDeviceToken }
        let topic = head.string(.topic) ?? ""
        return topic == registration.bundleID + pushType.topicSuffix ? nil : .deviceTokenNotForTopic
    }

    /// A background push: priority 5 (APNs's documentation calls priority 10 with this push type an error, and a
    /// missing `apns-priority` means 10), and an `aps` that asks only to wake the app: `content-available` 1 and no
    /// `alert`, `sound` or `badge` (those need push type alert). APNs documents no reason for a payload that does not
    /// match its push type; the stand-in answers `InvalidPushType` (docs/mock-apns.md).
    static func checkBackground(head: RequestHead, body: UnsafeRawBufferPointer) -> MockReason? {
        let priority5 = head.with(.priority) { p in p.map { RequestField.equals($0, "5") } ?? false }
        if !priority5 { return .badPriority }
        guard let aps = JSONCheck.apsMembers(body), aps["content-available"] == .number(1) else {
            return .invalidPushType
        }
        if aps["alert"] != nil || aps["sound"] != nil || aps["badge"] != nil { return .invalidPushType }
        return nil
    }

    /// The push type a request asks for (alert when absent or invalid).
    public static func pushType(of head: RequestHead) -> PushType {
        head.with(.pushType) { $0.flatMap(PushType.parse) } ?? .alert
    }

    func checkTopic(head: RequestHead, pushType: PushType, certificateAuth: Bool) -> MockReason? {
        guard head.has(.topic) else {
            // A certificate for exactly one topic implies it; otherwise APNs requires the header.
            return certificateAuth && topics.count == 1 ? nil : .missingTopic
        }
        var suffix = pushType.topicSuffix
        return head.with(.topic) { topicBytes -> MockReason? in
            let topic = topicBytes!
            if topic.isEmpty { return .missingTopic }
            return suffix.withUTF8 { sfx -> MockReason? in
                let s = UnsafeRawBufferPointer(sfx)
                if topics.isEmpty {
                    // Any bundle passes, but the suffix the push type needs must be there.
                    if pushType == .mdm || s.isEmpty { return nil }
                    return Self.hasSuffix(topic, s) && topic.count > s.count ? nil : .deviceTokenNotForTopic
                }
                // Exact match: configured bundle + required suffix.
                for b in topics where b.count + s.count == topic.count {
                    if Self.matches(topic, bundle: b, suffix: s) { return nil }
                }
                // A known bundle with another push type's suffix: the token belongs to another topic.
                let otherSuffixes = [[UInt8]()] + knownSuffixes
                for b in topics {
                    for o in otherSuffixes where b.count + o.count == topic.count {
                        let hit = o.withUnsafeBytes { Self.matches(topic, bundle: b, suffix: $0) }
                        if hit { return .deviceTokenNotForTopic }
                    }
                }
                return .topicDisallowed
            }
        }
    }

    static func matches(_ topic: UnsafeRawBufferPointer, bundle: [UInt8], suffix: UnsafeRawBufferPointer) -> Bool {
        guard topic.count == bundle.count + suffix.count else { return false }
        let prefixOK = bundle.withUnsafeBytes { b in
            b.isEmpty || memcmp(topic.baseAddress!, b.baseAddress!, b.count) == 0
        }
        guard prefixOK else { return false }
        return suffix.isEmpty || memcmp(topic.baseAddress! + bundle.count, suffix.baseAddress!, suffix.count) == 0
    }

    static func hasSuffix(_ a: UnsafeRawBufferPointer, _ s: UnsafeRawBufferPointer) -> Bool {
        guard a.count >= s.count else { return false }
        return s.isEmpty || memcmp(a.baseAddress! + (a.count - s.count), s.baseAddress!, s.count) == 0
    }

    /// 64 to 200 hex characters, even length.
    public static func isTokenShaped(_ token: UnsafeRawBufferPointer) -> Bool {
        guard token.count >= 64, token.count <= 200, token.count % 2 == 0 else { return false }
        return token.allSatisfy(JSONCheck.isHex)
    }

    /// Canonical 8-4-4-4-12 hex UUID.
    public static func isUUID(_ v: UnsafeRawBufferPointer) -> Bool {
        guard v.count == 36 else { return false }
        for i in 0..<36 {
            let c = v[i]
            if i == 8 || i == 13 || i == 18 || i == 23 {
                if c != UInt8(ascii: "-") { return false }
            } else if !JSONCheck.isHex(c) {
                return false
            }
        }
        return true
    }
}
