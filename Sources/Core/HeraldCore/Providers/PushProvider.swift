// The delivery paths Herald has (APNs, FCM HTTP v1, custom webhook) and the
// mapping from CometChat's platform names onto device kinds.

/// A push service Herald delivers through.
public enum PushProvider: String, Sendable, Hashable, CaseIterable {
    /// Apple Push Notification service over HTTP/2 (device and VoIP tokens).
    case apns
    /// Firebase Cloud Messaging HTTP v1 over HTTP/2 (registration tokens).
    case fcm
    /// A custom HTTPS webhook that receives one POST per recipient (CometChat's custom provider).
    case webhook
    /// The Web Push protocol (RFC 8030) with message encryption (RFC 8291) and VAPID (RFC 8292), over HTTP/2.
    case webpush
}

/// CometChat's `PushPlatforms` names (the `platform` argument of `registerPushToken`) and the device
/// kind each one maps to. Every `FCM_*` platform is an FCM registration token, whatever the OS;
/// `APNS_*_DEVICE` is an APNs device token and `APNS_*_VOIP` a PushKit token.
public enum PushPlatform {
    /// The device kind for a platform name (case-insensitive), or nil when unknown. Herald's own kind
    /// names (`apns`, `voip`, `fcm`, `webhook`) and `CUSTOM` (CometChat's custom provider) are accepted too.
    public static func kind(for platform: String) -> Device.Kind? {
        let name = platform.uppercased()
        if let own = Device.Kind(rawValue: platform.lowercased()) { return own }
        if name == "CUSTOM" || name == "WEBHOOK" { return .webhook }
        if name.hasPrefix("FCM_") { return known.contains(name) ? .fcm : nil }
        if name.hasPrefix("APNS_") && known.contains(name) {
            return name.hasSuffix("_VOIP") ? .voip : .apns
        }
        return nil
    }

    /// Every platform name CometChat documents.
    public static let known: Set<String> = [
        "FCM_ANDROID", "FCM_IOS", "FCM_WEB",
        "FCM_FLUTTER_ANDROID", "FCM_FLUTTER_IOS",
        "FCM_REACT_NATIVE_ANDROID", "FCM_REACT_NATIVE_IOS",
        "FCM_IONIC_CORDOVA_ANDROID", "FCM_IONIC_CORDOVA_IOS",
        "APNS_IOS_DEVICE", "APNS_IOS_VOIP",
        "APNS_FLUTTER_DEVICE", "APNS_FLUTTER_VOIP",
        "APNS_REACT_NATIVE_DEVICE", "APNS_REACT_NATIVE_VOIP",
        "APNS_IONIC_CORDOVA_DEVICE", "APNS_IONIC_CORDOVA_VOIP",
    ]
}
