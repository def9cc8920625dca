// Reads one app of the pipeline file (`apps:` merged over `defaults:`) into `AppConfig`: rules, credentials,
// payload options and the per-app policies.

import Foundation
import HeraldCore
import Yams

extension PipelineLoader {
    static func readApp(_ r: inout Reader, _ node: Node, path: String, appID: String) throws(ConfigError) -> AppConfig {
        let m = try r.mapping(node, path)
        r.check(m, path, known: appKeys)
        var profile = PayloadProfile.compact
        if let p = m["payload"] {
            let pm = try r.mapping(p, path + ".payload")
            r.check(pm, path + ".payload", known: ["profile", "key"])
            let name = try r.string(pm["profile"], path + ".payload.profile") ?? "compact"
            let key = try r.string(pm["key"], path + ".payload.key") ?? "sendbird"
            switch name {
            case "compact": profile = .compact
            case "sendbird":
                // The object sits beside Herald's own keys (APNs `aps`, `e`; FCM data `message`, `title`, ...): a
                // key of the same name would be written twice.
                guard !PayloadProfile.reservedSendbirdKeys.contains(key), !key.isEmpty else {
                    throw ConfigError(
                        path: path + ".payload.key",
                        message:
                            "\"\(key)\" is taken by the payload itself; choose another (e.g. sendbird)")
                }
                profile = .sendbird(key: key)
            case "cometchat": profile = .cometchat
            default:
                throw ConfigError(
                    path: path + ".payload.profile", message: "expected compact, sendbird or cometchat, got \(name)")
            }
            if pm["key"] != nil, name != "sendbird" {
                r.warnings.append("\(path).payload.key: only used by the sendbird profile")
            }
        }
        var multi = MultiDeviceMode.allOffline
        if let raw = try r.string(m["multi_device"], path + ".multi_device") {
            guard let v = MultiDeviceMode(rawValue: raw) else {
                throw ConfigError(
                    path: path + ".multi_device",
                    message: "expected all_offline, any_offline or offline_only, got \(raw)")
            }
            multi = v
        }
        let badge = try r.bool(m["badge"], path + ".badge") ?? true
        var templates = TemplateConfig()
        if let t = m["templates"] {
            let tp = path + ".templates"
            let tm = try r.mapping(t, tp)
            r.check(tm, tp, known: ["default", "alternative", "title", "custom_types"])
            if let d = tm["default"] {
                templates.defaultPair = try readPair(
                    &r, d, tp + ".default", fallback: ("{sender_name}: {message}", "{filename}"))
            }
            if let a = tm["alternative"] {
                templates.alternativePair = try readPair(
                    &r, a, tp + ".alternative", fallback: ("New message arrived", "New file arrived"))
            }
            templates.title = try r.string(tm["title"], tp + ".title")
            if let c = tm["custom_types"] {
                for (name, pair) in try r.mapping(c, tp + ".custom_types").pairs {
                    templates.customTypes[name] = try readPair(
                        &r, pair, tp + ".custom_types.\(name)", fallback: ("{sender_name}: {message}", "{filename}"))
                }
            }
        }
        var catalogs: [String: [String: String]] = [:]
        if let c = m["catalogs"] {
            let known = Set(CatalogKey.allCases.map(\.rawValue))
            for (locale, table) in try r.mapping(c, path + ".catalogs").pairs {
                let lp = path + ".catalogs.\(locale)"
                let tm = try r.mapping(table, lp)
                r.check(tm, lp, known: known)
                var strings: [String: String] = [:]
                for (key, value) in tm.pairs where known.contains(key) {
                    strings[key] = try r.string(value, lp + ".\(key)")
                }
                catalogs[locale] = strings
            }
        }
        var credentials: [APNsCredential] = []
        if let c = m["credentials"] {
            for (n, item) in try r.sequence(c, path + ".credentials").enumerated() {
                credentials.append(try readCredential(&r, item, path: path + ".credentials[\(n)]"))
            }
        }
        let expiration = try r.int(m["expiration_seconds"], path + ".expiration_seconds", in: 0...2_592_000) ?? 86_400
        let callExpiration =
            try r.int(m["call_expiration_seconds"], path + ".call_expiration_seconds", in: 0...2_592_000) ?? 30
        var fcmCredentials: [FCMCredential] = []
        if let c = m["fcm_credentials"] {
            for (n, item) in try r.sequence(c, path + ".fcm_credentials").enumerated() {
                let ip = path + ".fcm_credentials[\(n)]"
                let im = try r.mapping(item, ip)
                r.check(im, ip, known: ["provider_id", "service_account_file", "include_notification"])
                guard let id = try r.string(im["provider_id"], ip + ".provider_id"), !id.isEmpty else {
                    throw ConfigError(path: ip + ".provider_id", message: "missing")
                }
                guard let file = try r.string(im["service_account_file"], ip + ".service_account_file"), !file.isEmpty
                else {
                    throw ConfigError(path: ip + ".service_account_file", message: "missing")
                }
                if fcmCredentials.contains(where: { $0.providerID == id }) {
                    throw ConfigError(path: ip + ".provider_id", message: "\(id) is used twice")
                }
                fcmCredentials.append(
                    FCMCredential(
                        providerID: id, serviceAccountFile: file,
                        includeNotification: try r.bool(im["include_notification"], ip + ".include_notification")
                            ?? true))
            }
        }
        var webhooks: [WebhookCredential] = []
        if let c = m["webhooks"] {
            for (n, item) in try r.sequence(c, path + ".webhooks").enumerated() {
                let ip = path + ".webhooks[\(n)]"
                let im = try r.mapping(item, ip)
                r.check(
                    im, ip,
                    known: ["provider_id", "url", "username", "password_env", "password", "region", "every_recipient"])
                guard let id = try r.string(im["provider_id"], ip + ".provider_id"), !id.isEmpty else {
                    throw ConfigError(path: ip + ".provider_id", message: "missing")
                }
                guard let url = try r.string(im["url"], ip + ".url"),
                    url.hasPrefix("https://") || url.hasPrefix("http://")
                else {
                    throw ConfigError(path: ip + ".url", message: "expected an https:// URL")
                }
                if url.hasPrefix("http://") { r.warnings.append("\(ip).url: not HTTPS; use it only for local tests") }
                let hook = WebhookCredential(
                    providerID: id, url: url, username: try r.string(im["username"], ip + ".username"),
                    passwordEnv: try r.string(im["password_env"], ip + ".password_env"),
                    password: try r.string(im["password"], ip + ".password"),
                    region: try r.string(im["region"], ip + ".region") ?? "us",
                    everyRecipient: try r.bool(im["every_recipient"], ip + ".every_recipient") ?? false)
                if hook.password != nil {
                    r.warnings.append("\(ip).password: a password in the pipeline file; prefer password_env")
                }
                webhooks.append(hook)
            }
        }
        var fcm = FCMOptions()
        if let f = m["fcm"] {
            let fm = try r.mapping(f, path + ".fcm")
            r.check(fm, path + ".fcm", known: ["channel_id", "click_action"])
            fcm = FCMOptions(
                channelID: try r.string(fm["channel_id"], path + ".fcm.channel_id"),
                clickAction: try r.string(fm["click_action"], path + ".fcm.click_action"))
        }
        var collapseID = CollapseIDSource.none
        if let raw = try r.string(m["collapse_id"], path + ".collapse_id") {
            guard let source = CollapseIDSource(rawValue: raw) else {
                throw ConfigError(path: path + ".collapse_id", message: "expected none or message, got \(raw)")
            }
            collapseID = source
        }
        let options = try readPayloadOptions(&r, m, path: path, profile: profile)
        let userDefaults = try readUserDefaults(&r, m["user_defaults"], path: path + ".user_defaults")
        var priority = PriorityPolicy()
        if let p = m["priority"] {
            let pm = try r.mapping(p, path + ".priority")
            r.check(pm, path + ".priority", known: Set(PriorityPolicy.keys + ["bulk_member_threshold"]))
            for key in PriorityPolicy.keys {
                guard let raw = try r.string(pm[key], path + ".priority.\(key)") else { continue }
                guard let value = PriorityClass(rawValue: raw) else {
                    throw ConfigError(
                        path: path + ".priority.\(key)",
                        message: "expected one of urgent, high, normal, bulk, got \(raw)")
                }
                priority[key] = value
            }
            if let n = try r.int(pm["bulk_member_threshold"], path + ".priority.bulk_member_threshold") {
                priority.bulkMemberThreshold = n
            }
        }
        var app = AppConfig(
            appID: appID, payloadProfile: profile, multiDevice: multi, badge: badge,
            templates: templates, catalogs: catalogs, credentials: credentials,
            expirationSeconds: Int64(expiration), callExpirationSeconds: Int64(callExpiration),
            fcmCredentials: fcmCredentials, webhooks: webhooks, fcm: fcm,
            collapseID: collapseID, payloadOptions: options, userDefaults: userDefaults,
            priority: priority)
        app.counts = try r.bool(m["counts"], path + ".counts") ?? false
        app.interruption = try readInterruption(&r, m, path: path)
        app.coalesce = try readCoalesce(&r, m["coalesce"], path: path + ".coalesce")
        app.floodGuard = try readFloodGuard(&r, m["flood_guard"], path: path + ".flood_guard")
        app.readSync = try readReadSync(&r, m["read_sync"], path: path + ".read_sync")
        app.push = try readSwitch(&r, m["push"], path: path + ".push") ?? true
        app.webPush = try readWebPush(&r, m["webpush"], path: path + ".webpush")
        app.digest = try readDigest(&r, m["digest"], path: path + ".digest")
        app.translator = try readTranslator(&r, m["translator"], path: path + ".translator")
        return app
    }

    /// `translator:` of an app (or of `defaults:`, for every app): `off` (the default), or `url` (the
    /// LibreTranslate server), `api_key_env`, `deadline_ms` (50 to 30000; default 1000), `cache_ttl_seconds` (0 to 30
    /// days; default 3600; 0 keeps nothing) and `cache_max_entries` (0 to 10,000,000; default 10,000; 0 keeps nothing)
    /// (docs/behaviour.md §7a).
    static func readTranslator(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> TranslatorPolicy?
    {
        guard let node else { return nil }
        if node.mapping == nil {
            guard try r.string(node, path) == "off" else {
                throw ConfigError(
                    path: path,
                    message: "expected off or {url, api_key_env, deadline_ms, cache_ttl_seconds, cache_max_entries}")
            }
            return nil
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["url", "api_key_env", "deadline_ms", "cache_ttl_seconds", "cache_max_entries"])
        guard let url = try r.string(m["url"], path + ".url"), url.hasPrefix("https://") || url.hasPrefix("http://"),
            url.utf8.count <= ChatEvent.Limits.urlBytes
        else {
            throw ConfigError(path: path + ".url", message: "expected the translator's https:// URL")
        }
        if url.hasPrefix("http://") {
            r.warnings.append(
                "\(path).url: not HTTPS; message texts cross the network in the clear (use it only for local tests)")
        }
        var apiKeyEnv: String?
        if let name = try r.string(m["api_key_env"], path + ".api_key_env") {
            guard !name.isEmpty else {
                throw ConfigError(
                    path: path + ".api_key_env", message: "empty (the environment variable holding the API key)")
            }
            apiKeyEnv = name
        }
        let deadline = try r.int(m["deadline_ms"], path + ".deadline_ms", in: 50...30_000)
        let ttl = try r.int(m["cache_ttl_seconds"], path + ".cache_ttl_seconds", in: 0...2_592_000)
        let entries = try r.int(m["cache_max_entries"], path + ".cache_max_entries", in: 0...10_000_000)
        return TranslatorPolicy(
            url: url, apiKeyEnv: apiKeyEnv,
            deadlineMilliseconds: deadline.map(Int64.init) ?? TranslatorPolicy.defaultDeadlineMilliseconds,
            cacheTTLMilliseconds: ttl.map { Int64($0) * 1000 } ?? TranslatorPolicy.defaultCacheTTLMilliseconds,
            cacheMaxEntries: entries ?? TranslatorPolicy.defaultCacheMaxEntries)
    }

    /// An on/off switch: `on`/`off` or `true`/`false` (nil when absent).
    static func readSwitch(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> Bool? {
        guard let node else { return nil }
        if let v = node.bool { return v }
        switch try r.string(node, path) {
        case "on"?: return true
        case "off"?: return false
        default: throw ConfigError(path: path, message: "expected on or off")
        }
    }

    /// `read_sync:` of an app: `on` (the default), `off`, or `{enabled, conversation_seconds (0 to 60; default 3),
    /// per_minute (1 to 1000; default 20)}` (docs/behaviour.md §6c).
    static func readReadSync(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> ReadSyncPolicy {
        guard let node else { return ReadSyncPolicy() }
        if node.mapping == nil {
            switch try r.string(node, path) {
            case "on"?, "true"?: return ReadSyncPolicy()
            case "off"?, "false"?: return .off
            default:
                throw ConfigError(
                    path: path, message: "expected on, off or {enabled, conversation_seconds, per_minute}")
            }
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["enabled", "conversation_seconds", "per_minute"])
        let defaults = ReadSyncPolicy()
        let seconds = try r.int(
            m["conversation_seconds"], path + ".conversation_seconds", in: 0...ReadSync.maxIntervalSeconds)
        return ReadSyncPolicy(
            enabled: try r.bool(m["enabled"], path + ".enabled") ?? true,
            conversationIntervalMilliseconds: seconds.map { Int64($0) * 1000 }
                ?? defaults.conversationIntervalMilliseconds,
            perMinute: try r.int(m["per_minute"], path + ".per_minute", in: 1...1000) ?? defaults.perMinute)
    }

    /// `digest:` of an app: `off` (the default), `on`, or `{conversations_named (0 to 10; default 3), sound (default
    /// false), deadline_seconds (60 to 604800; default 3600)}` (docs/behaviour.md §6d).
    static func readDigest(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> DigestPolicy {
        guard let node else { return DigestPolicy() }
        if node.mapping == nil {
            switch try r.string(node, path) {
            case "on"?, "true"?: return DigestPolicy(enabled: true)
            case "off"?, "false"?: return DigestPolicy()
            default:
                throw ConfigError(
                    path: path, message: "expected on, off or {conversations_named, sound, deadline_seconds}")
            }
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["conversations_named", "sound", "deadline_seconds"])
        let defaults = DigestPolicy(enabled: true)
        let named = try r.int(
            m["conversations_named"], path + ".conversations_named", in: 0...Digest.maxNamedConversations)
        let deadline = try r.int(m["deadline_seconds"], path + ".deadline_seconds", in: 60...604_800)
        return DigestPolicy(
            enabled: true, conversationsNamed: named ?? defaults.conversationsNamed,
            sound: try r.bool(m["sound"], path + ".sound") ?? false,
            deadlineMilliseconds: deadline.map { Int64($0) * 1000 } ?? defaults.deadlineMilliseconds)
    }

    /// `flood_guard:` of an app: `off` (the default), or `per_minute` (1 to 10000) (docs/behaviour.md §6b).
    static func readFloodGuard(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> FloodPolicy {
        guard let node else { return FloodPolicy() }
        if node.mapping == nil {
            guard try r.string(node, path) == "off" else {
                throw ConfigError(path: path, message: "expected off or {per_minute}")
            }
            return FloodPolicy()
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["per_minute"])
        guard let limit = try r.int(m["per_minute"], path + ".per_minute", in: 1...10_000) else {
            throw ConfigError(path: path + ".per_minute", message: "missing (1 to 10000)")
        }
        return FloodPolicy(perMinute: limit)
    }

    /// `coalesce:` of an app: `off` (the default), or `window_seconds` (1 to 3600) and `update_seconds` (0 to the
    /// window; default half of it) (docs/behaviour.md §6a).
    static func readCoalesce(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> CoalescePolicy {
        guard let node else { return CoalescePolicy() }
        if node.mapping == nil {
            guard try r.string(node, path) == "off" else {
                throw ConfigError(path: path, message: "expected off or {window_seconds, update_seconds}")
            }
            return CoalescePolicy()
        }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["window_seconds", "update_seconds"])
        guard let window = try r.int(m["window_seconds"], path + ".window_seconds", in: 1...3600) else {
            throw ConfigError(path: path + ".window_seconds", message: "missing (1 to 3600)")
        }
        let update = try r.int(m["update_seconds"], path + ".update_seconds", in: 0...window)
        return CoalescePolicy(
            windowMilliseconds: Int64(window) * 1000, updateMilliseconds: update.map { Int64($0) * 1000 })
    }

    /// `interruption_level:` and `relevance_score:` of an app: `off`, or per rule a level (`passive`, `active`,
    /// `time-sensitive`, `critical`) or a score from 0 to 1 over the defaults (docs/pipeline-config.md).
    static func readInterruption(
        _ r: inout Reader, _ m: YAMLMap, path: String
    ) throws(ConfigError)
        -> InterruptionPolicy
    {
        var policy = InterruptionPolicy()
        let rules = Set(InterruptionPolicy.rules)
        if let node = m["interruption_level"] {
            let p = path + ".interruption_level"
            if node.mapping == nil {
                guard try r.string(node, p) == "off" else {
                    throw ConfigError(path: p, message: "expected off or a mapping of rule to level")
                }
                policy.levels = nil
            } else {
                let lm = try r.mapping(node, p)
                r.check(lm, p, known: rules)
                for (rule, value) in lm.pairs where rules.contains(rule) {
                    let raw = try r.string(value, p + "." + rule) ?? ""
                    guard let level = InterruptionLevel(rawValue: raw) else {
                        throw ConfigError(
                            path: p + "." + rule,
                            message: "expected passive, active, time-sensitive or critical, got \(raw)")
                    }
                    policy.levels?[rule] = level
                }
            }
        }
        if let node = m["relevance_score"] {
            let p = path + ".relevance_score"
            if node.mapping == nil {
                guard try r.string(node, p) == "off" else {
                    throw ConfigError(path: p, message: "expected off or a mapping of rule to a score from 0 to 1")
                }
                policy.relevance = nil
            } else {
                let sm = try r.mapping(node, p)
                r.check(sm, p, known: rules)
                for (rule, value) in sm.pairs where rules.contains(rule) {
                    let raw = try r.string(value, p + "." + rule) ?? ""
                    guard let score = Double(raw), score >= 0, score <= 1 else {
                        throw ConfigError(path: p + "." + rule, message: "expected a number from 0 to 1, got \(raw)")
                    }
                    policy.relevance?[rule] = Int((score * 100).rounded())
                }
            }
        }
        return policy
    }

    /// `apns:`, `sendbird:` and `cometchat:` of an app (docs/pipeline-config.md).
    static func readPayloadOptions(
        _ r: inout Reader, _ m: YAMLMap, path: String,
        profile: PayloadProfile
    ) throws(ConfigError) -> PayloadOptions {
        var o = PayloadOptions()
        if let a = m["apns"] {
            let ap = path + ".apns"
            let am = try r.mapping(a, ap)
            r.check(
                am, ap, known: ["alert_string", "content_available", "mutable_content", "sound", "conversation_sounds"])
            o.alertString = try r.bool(am["alert_string"], ap + ".alert_string") ?? false
            o.contentAvailable = try r.bool(am["content_available"], ap + ".content_available") ?? false
            o.mutableContent = try r.bool(am["mutable_content"], ap + ".mutable_content") ?? false
            o.sound = try r.string(am["sound"], ap + ".sound")
            if let cs = am["conversation_sounds"] {
                for (conversation, sound) in try r.mapping(cs, ap + ".conversation_sounds").pairs {
                    o.conversationSounds[conversation] = try r.string(
                        sound, ap + ".conversation_sounds.\(conversation)")
                }
            }
        }
        if let s = m["sendbird"] {
            let sp = path + ".sendbird"
            let sm = try r.mapping(s, sp)
            r.check(
                sm, sp,
                known: [
                    "type_codes", "group_channel_type", "channel_unread_count", "push_title", "push_alert",
                    "audience_type", "mentioned_users",
                ])
            if case .sendbird = profile {} else { r.warnings.append("\(sp): only used by the sendbird profile") }
            if let codes = try r.string(sm["type_codes"], sp + ".type_codes") {
                guard codes == "v3" || codes == "v4" else {
                    throw ConfigError(
                        path: sp + ".type_codes",
                        message: "expected v3 (MESG/FILE/ADMM) or v4 (User/File/Admin), got \(codes)")
                }
                o.sendbirdV3TypeCodes = codes == "v3"
            }
            if let t = try r.string(sm["group_channel_type"], sp + ".group_channel_type") {
                guard t == "group_messaging" || t == "chat" else {
                    throw ConfigError(
                        path: sp + ".group_channel_type", message: "expected group_messaging or chat, got \(t)")
                }
                o.sendbirdGroupChannelType = t
            }
            o.sendbirdChannelUnreadCount = try r.bool(sm["channel_unread_count"], sp + ".channel_unread_count") ?? true
            o.sendbirdPushTitle = try r.bool(sm["push_title"], sp + ".push_title") ?? false
            o.sendbirdPushAlert = try r.bool(sm["push_alert"], sp + ".push_alert") ?? false
            o.sendbirdAudienceType = try r.string(sm["audience_type"], sp + ".audience_type")
            o.sendbirdMentionedUsers = try r.bool(sm["mentioned_users"], sp + ".mentioned_users") ?? false
        }
        if let c = m["cometchat"] {
            let cp = path + ".cometchat"
            let cm = try r.mapping(c, cp)
            r.check(cm, cp, known: ["include_message", "custom"])
            if case .cometchat = profile {} else { r.warnings.append("\(cp): only used by the cometchat profile") }
            o.cometchatIncludeMessage = try r.bool(cm["include_message"], cp + ".include_message") ?? false
            if let text = try r.string(cm["custom"], cp + ".custom") {
                guard let v = try? JSONValue.parse(Array(text.utf8)), case .object = v else {
                    throw ConfigError(path: cp + ".custom", message: "expected a JSON object written as a string")
                }
                o.cometchatCustom = v
            }
        }
        return o
    }

    /// `user_defaults:`: `preset: easemob` (display style simple_banner), `display_style`, `template`, `trigger`.
    static func readUserDefaults(_ r: inout Reader, _ node: Node?, path: String) throws(ConfigError) -> Preferences? {
        guard let node else { return nil }
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["preset", "display_style", "template", "trigger"])
        var p = Preferences()
        if let preset = try r.string(m["preset"], path + ".preset") {
            guard preset == "easemob" else {
                throw ConfigError(path: path + ".preset", message: "expected easemob, got \(preset)")
            }
            p.displayStyle = .simpleBanner
        }
        if let d = try r.string(m["display_style"], path + ".display_style") {
            switch d {
            case "summary": p.displayStyle = .summary
            case "simple_banner", "simple": p.displayStyle = .simpleBanner
            default:
                throw ConfigError(path: path + ".display_style", message: "expected summary or simple_banner, got \(d)")
            }
        }
        if let t = try r.string(m["template"], path + ".template") {
            guard let v = TemplateChoice(rawValue: t) else {
                throw ConfigError(path: path + ".template", message: "expected default or alternative, got \(t)")
            }
            p.template = v
        }
        if let t = try r.string(m["trigger"], path + ".trigger") {
            guard let v = PushTrigger(rawValue: t) else {
                throw ConfigError(path: path + ".trigger", message: "expected all, mention_only or off, got \(t)")
            }
            p.trigger = v
        }
        return p
    }

    static func readPair(
        _ r: inout Reader, _ node: Node, _ path: String,
        fallback: (String, String)
    ) throws(ConfigError) -> TemplatePair {
        let m = try r.mapping(node, path)
        r.check(m, path, known: ["text", "file"])
        return TemplatePair(
            text: try r.string(m["text"], path + ".text") ?? fallback.0,
            file: try r.string(m["file"], path + ".file") ?? fallback.1)
    }

    static func readCredential(_ r: inout Reader, _ node: Node, path: String) throws(ConfigError) -> APNsCredential {
        let m = try r.mapping(node, path)
        r.check(
            m, path,
            known: [
                "bundle_id", "environment", "team_id", "key_id", "key_file", "certificate_file",
                "private_key_file", "p12_file", "p12_password_env", "p12_password", "provider_id",
                "content_available", "mutable_content",
            ])
        guard let bundle = try r.string(m["bundle_id"], path + ".bundle_id"), !bundle.isEmpty else {
            throw ConfigError(path: path + ".bundle_id", message: "missing")
        }
        var env = APNsEnvironment.production
        if let e = try r.string(m["environment"], path + ".environment") {
            guard let v = APNsEnvironment(rawValue: e) else {
                throw ConfigError(path: path + ".environment", message: "expected production or sandbox, got \(e)")
            }
            env = v
        }
        var cred = APNsCredential(
            bundleID: bundle, environment: env,
            teamID: try r.string(m["team_id"], path + ".team_id"),
            keyID: try r.string(m["key_id"], path + ".key_id"),
            keyFile: try r.string(m["key_file"], path + ".key_file"),
            certificateFile: try r.string(m["certificate_file"], path + ".certificate_file"),
            privateKeyFile: try r.string(m["private_key_file"], path + ".private_key_file"),
            p12File: try r.string(m["p12_file"], path + ".p12_file"),
            p12PasswordEnv: try r.string(m["p12_password_env"], path + ".p12_password_env"),
            p12Password: try r.string(m["p12_password"], path + ".p12_password"))
        cred.providerID = try r.string(m["provider_id"], path + ".provider_id")
        cred.contentAvailable = try r.bool(m["content_available"], path + ".content_available")
        cred.mutableContent = try r.bool(m["mutable_content"], path + ".mutable_content")
        if cred.p12Password != nil {
            r.warnings.append("\(path).p12_password: a password in the pipeline file; prefer p12_password_env")
        }
        if cred.auth == nil {
            throw ConfigError(
                path: path, message: "needs team_id + key_id + key_file (token auth), certificate_file, or p12_file")
        }
        return cred
    }
}
