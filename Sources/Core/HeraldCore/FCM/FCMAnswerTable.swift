// FCM HTTP v1 answers, classified into the same classes as APNs answers
// (APNsAnswerTable beside it), so send treats both alike.

import Foundation

/// FCM's `FcmError.errorCode` values, plus `unknown(String)` for one added later.
public enum FCMErrorCode: Hashable, Sendable, CustomStringConvertible {
    case unspecifiedError
    case invalidArgument
    case unregistered
    case senderIDMismatch
    case quotaExceeded
    case unavailable
    case `internal`
    case thirdPartyAuthError
    case unknown(String)

    static let known: [(String, FCMErrorCode)] = [
        ("UNSPECIFIED_ERROR", .unspecifiedError), ("INVALID_ARGUMENT", .invalidArgument),
        ("UNREGISTERED", .unregistered), ("SENDER_ID_MISMATCH", .senderIDMismatch),
        ("QUOTA_EXCEEDED", .quotaExceeded), ("UNAVAILABLE", .unavailable), ("INTERNAL", .internal),
        ("THIRD_PARTY_AUTH_ERROR", .thirdPartyAuthError),
    ]

    public init(wire: String) {
        self = Self.known.first { $0.0 == wire }?.1 ?? .unknown(wire)
    }

    public var wire: String {
        if case .unknown(let text) = self { return text }
        return Self.known.first { $0.1 == self }?.0 ?? "\(self)"
    }

    public var description: String { wire }
}

/// The parts of an FCM error body that decide what to do:
/// `{"error":{"code":404,"message":"...","status":"NOT_FOUND","details":[{"@type":
/// "type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"},
/// {"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"message.token"}]}]}}`
public struct FCMErrorBody: Sendable, Hashable {
    /// The google.rpc status name (`NOT_FOUND`, `INVALID_ARGUMENT`, `UNAUTHENTICATED`, ...).
    public var status: String?
    /// FCM's own error code from `details`, when present.
    public var errorCode: FCMErrorCode?
    public var message: String?
    /// The fields a `BadRequest` detail names (`message.token`, ...).
    public var fieldViolations: [String]

    public init(
        status: String? = nil, errorCode: FCMErrorCode? = nil, message: String? = nil,
        fieldViolations: [String] = []
    ) {
        self.status = status; self.errorCode = errorCode; self.message = message
        self.fieldViolations = fieldViolations
    }

    /// Parses an error body; nil when it is not FCM's JSON error object.
    public static func parse(_ bytes: some Collection<UInt8>) -> FCMErrorBody? {
        guard let root = try? JSONValue.parse(bytes), let error = root["error"], case .object = error else {
            return nil
        }
        var out = FCMErrorBody()
        if case .string(let s)? = error["status"] { out.status = s }
        if case .string(let m)? = error["message"] { out.message = m }
        if case .array(let details)? = error["details"] {
            for d in details {
                if case .string(let code)? = d["errorCode"] { out.errorCode = FCMErrorCode(wire: code) }
                if case .array(let violations)? = d["fieldViolations"] {
                    for v in violations { if case .string(let f)? = v["field"] { out.fieldViolations.append(f) } }
                }
            }
        }
        return out
    }

    /// The error code, else the status: what the answer is called in metrics, logs and the DLQ.
    public var reasonText: String { errorCode?.wire ?? status ?? "" }

    /// Whether an INVALID_ARGUMENT is about the registration token (rather than the message).
    public var isAboutToken: Bool {
        if fieldViolations.contains("message.token") { return true }
        let m = (message ?? "").lowercased()
        return m.contains("registration token")
    }
}

/// The single table from FCM status + error code to a class of answer.
/// Source: Firebase's "FCM HTTP v1 error codes" (ErrorCode enum).
public enum FCMAnswerTable {
    public struct Row: Sendable {
        public let status: Int
        public let code: FCMErrorCode?
        public let answer: PushAnswerClass
    }

    /// Exact (status, code) rows first; rows with `code == nil` apply to any other code of that status.
    /// INVALID_ARGUMENT is `tokenDead` only when the body says it is about the token (see `classify`).
    public static let rows: [Row] = [
        Row(status: 200, code: nil, answer: .delivered),
        Row(status: 400, code: .invalidArgument, answer: .permanent),
        Row(status: 400, code: nil, answer: .permanent),
        // UNAUTHENTICATED: the access token is missing, expired or foreign: renew it once, then permanent.
        Row(status: 401, code: .thirdPartyAuthError, answer: .permanent),
        Row(status: 401, code: nil, answer: .renewCredentials),
        Row(status: 403, code: .senderIDMismatch, answer: .permanent),
        Row(status: 403, code: nil, answer: .permanent),
        Row(status: 404, code: .unregistered, answer: .tokenDead(unregisteredAt: nil)),
        Row(status: 404, code: nil, answer: .tokenDead(unregisteredAt: nil)),
        Row(status: 429, code: .quotaExceeded, answer: .retryable),
        Row(status: 429, code: nil, answer: .retryable),
        Row(status: 500, code: .internal, answer: .retryable),
        Row(status: 500, code: nil, answer: .retryable),
        Row(status: 503, code: .unavailable, answer: .retryable),
        Row(status: 503, code: nil, answer: .retryable),
    ]

    /// Classifies an HTTP answer of `messages:send`.
    public static func classify(status: Int, body: FCMErrorBody?) -> PushAnswerClass {
        let code = body?.errorCode
        if status == 400, code == nil || code == .invalidArgument, body?.isAboutToken == true {
            return .tokenDead(unregisteredAt: nil)
        }
        if status == 403, code == .senderIDMismatch { return .permanent }
        let row =
            rows.first { $0.status == status && $0.code != nil && $0.code == code }
            ?? rows.first { $0.status == status && $0.code == nil }
        if let row { return row.answer }
        if (200..<300).contains(status) { return .delivered }
        return (500..<600).contains(status) ? .retryable : .permanent
    }

    /// Classifies a failure below HTTP (same as APNs).
    public static func classify(_ failure: PushTransportFailure) -> PushAnswerClass {
        APNsAnswerTable.classify(failure)
    }

    /// `Retry-After` in seconds (FCM sends an integer); nil when absent or not a number.
    public static func retryAfter(_ header: String?) -> Duration? {
        guard let header, let seconds = Int(header.trimmingCharacters(in: .whitespaces)), seconds >= 0 else {
            return nil
        }
        return .seconds(min(seconds, 3600))
    }
}
