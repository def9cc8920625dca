// A browser's Web Push subscription (the W3C Push API's `PushSubscription.toJSON()`: `endpoint`, `keys.p256dh`,
// `keys.auth`) as a device of kind `webpush`, and the per-app Web Push settings.
import Foundation

/// One browser's push subscription. As a `Device` of kind `webpush` it is held in the token, written
/// `<p256dh>.<auth>.<endpoint>` (base64url has no `.`, so the first two dots split it), so it is stored, published
/// on `herald.registry` and removed like any other token.
public struct WebPushSubscription: Sendable, Hashable {
    /// The push service URL to POST to (`https`).
    public var endpoint: String
    /// The user agent's P-256 public key: base64url of the uncompressed point (65 bytes).
    public var p256dh: String
    /// The authentication secret: base64url of 16 bytes.
    public var auth: String

    /// Longest endpoint, in bytes.
    public static let maxEndpointBytes = 2048

    public init(endpoint: String, p256dh: String, auth: String) {
        self.endpoint = endpoint
        self.p256dh = p256dh
        self.auth = auth
    }

    /// The subscription a `webpush` device token holds, or nil when the token is not of that form.
    public init?(token: String) {
        let parts = token.split(separator: ".", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        self.init(endpoint: String(parts[2]), p256dh: String(parts[0]), auth: String(parts[1]))
    }

    /// The device token (`<p256dh>.<auth>.<endpoint>`).
    public var token: String { p256dh + "." + auth + "." + endpoint }

    /// The endpoint's origin, `https://host[:port]` (the port only when not 443); nil when it is not https.
    public var origin: String? { Self.origin(ofEndpoint: endpoint) }

    /// What is wrong with the subscription, or nil: the endpoint is an `https` URL with a host, no user info, no
    /// fragment and no white space, at most `maxEndpointBytes`; `p256dh` is base64url of a 65-byte uncompressed
    /// point; `auth` is base64url of 16 bytes. (Whether the point lies on the curve is checked when encrypting.)
    public var problem: String? {
        if endpoint.isEmpty { return "the subscription has no endpoint" }
        if endpoint.utf8.count > Self.maxEndpointBytes {
            return "the endpoint is longer than \(Self.maxEndpointBytes) bytes"
        }
        if endpoint.contains(where: { $0.isWhitespace }) { return "the endpoint has white space" }
        guard let components = URLComponents(string: endpoint), components.scheme?.lowercased() == "https" else {
            return "the endpoint is not an https URL"
        }
        guard let host = components.host, !host.isEmpty else { return "the endpoint has no host" }
        if components.user != nil || components.password != nil { return "the endpoint has user info" }
        if components.fragment != nil { return "the endpoint has a fragment" }
        guard let key = Self.base64URLDecode(p256dh), key.count == 65, key[0] == 0x04 else {
            return "keys.p256dh is not base64url of an uncompressed P-256 point (65 bytes)"
        }
        guard let secret = Self.base64URLDecode(auth), secret.count == 16 else {
            return "keys.auth is not base64url of 16 bytes"
        }
        return nil
    }

    /// The origin (`https://host[:port]`, lower case, the port only when not 443) of an `https` URL, or nil.
    public static func origin(ofEndpoint endpoint: String) -> String? {
        guard let components = URLComponents(string: endpoint), components.scheme?.lowercased() == "https",
            let host = components.host?.lowercased(), !host.isEmpty
        else { return nil }
        let shownHost = host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
        if let port = components.port, port != 443 { return "https://\(shownHost):\(port)" }
        return "https://\(shownHost)"
    }

    /// The bytes of base64url text without padding (standard base64's `+` and `/` are refused), or nil.
    public static func base64URLDecode(_ text: String) -> [UInt8]? {
        var standard = ""
        standard.reserveCapacity(text.utf8.count + 3)
        for c in text.unicodeScalars {
            switch c {
            case "A"..."Z", "a"..."z", "0"..."9": standard.unicodeScalars.append(c)
            case "-": standard += "+"
            case "_": standard += "/"
            default: return nil
            }
        }
        if standard.utf8.count % 4 == 1 { return nil }
        standard += String(repeating: "=", count: (4 - standard.utf8.count % 4) % 4)
        guard let data = Data(base64Encoded: standard) else { return nil }
        return Array(data)
    }
}

/// An app's Web Push settings (the pipeline file's `webpush:` section of the app).
public struct WebPushSettings: Sendable, Hashable {
    /// PEM file of the VAPID key (EC P-256).
    public var vapidKeyFile: String
    /// The VAPID `sub` claim: a `mailto:` address or an `https:` URL.
    public var subject: String
    /// Push-service origins a subscription's endpoint may have (`https://host[:port]`); empty: any.
    public var allowedOrigins: [String]

    public init(vapidKeyFile: String, subject: String, allowedOrigins: [String] = []) {
        self.vapidKeyFile = vapidKeyFile
        self.subject = subject
        self.allowedOrigins = allowedOrigins.map { $0.lowercased() }
    }

    /// Why the subscription's endpoint is refused by the allow-list, or nil.
    public func originProblem(_ subscription: WebPushSubscription) -> String? {
        guard !allowedOrigins.isEmpty else { return nil }
        guard let origin = subscription.origin else { return "the endpoint is not an https URL" }
        if allowedOrigins.contains(origin) { return nil }
        return "the endpoint's origin \(origin) is not in the app's webpush.allowed_origins"
    }
}

extension AppConfig {
    /// Why this app refuses a `webpush` device, or nil (also nil for every other kind): its subscription is
    /// malformed, or its endpoint's origin is not in the app's `webpush.allowed_origins`.
    public func webPushProblem(_ device: Device) -> String? {
        guard device.kind == .webpush else { return nil }
        guard let subscription = WebPushSubscription(token: device.token) else {
            return "a webpush token is <p256dh>.<auth>.<endpoint>"
        }
        if let problem = subscription.problem { return problem }
        return webPush?.originProblem(subscription)
    }
}
