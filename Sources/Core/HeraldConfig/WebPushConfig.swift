// The pipeline file's `webpush:` section of an app (docs/pipeline-config.md, "Web Push").
import HeraldCore
import Yams

extension PipelineLoader {
    /// `webpush: {vapid_key_file, subject, allowed_origins}`: the VAPID key (a PEM file, EC P-256), the contact
    /// sent as the token's `sub` (`mailto:` or `https:`), and the push-service origins subscriptions may use
    /// (`https://host[:port]`; absent or empty: any). Nil when the section is absent.
    static func readWebPush(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> WebPushSettings? {
        guard let node else { return nil }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["vapid_key_file", "subject", "allowed_origins"])
        guard let file = try r.string(m["vapid_key_file"], path + ".vapid_key_file"), !file.isEmpty else {
            throw ConfigError(path: path + ".vapid_key_file", message: "missing (a PEM file of an EC P-256 key)")
        }
        guard let subject = try r.string(m["subject"], path + ".subject") else {
            throw ConfigError(path: path + ".subject", message: "missing (a mailto: address or an https: URL)")
        }
        let lower = subject.lowercased()
        guard
            (lower.hasPrefix("mailto:") && subject.contains("@")) || (lower.hasPrefix("https://") && subject.count > 8)
        else {
            throw ConfigError(path: path + ".subject", message: "expected a mailto: address or an https: URL")
        }
        var origins: [String] = []
        if let list = m["allowed_origins"] {
            for (n, item) in try r.sequence(list, path + ".allowed_origins").enumerated() {
                let ip = path + ".allowed_origins[\(n)]"
                guard let text = try r.string(item, ip),
                    let origin = WebPushSubscription.origin(ofEndpoint: text), origin == text.lowercased()
                else {
                    throw ConfigError(path: ip, message: "expected an origin, https://host or https://host:port")
                }
                origins.append(origin)
            }
        }
        return WebPushSettings(vapidKeyFile: file, subject: subject, allowedOrigins: origins)
    }
}
