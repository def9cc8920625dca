// Per-app configuration the core decides and renders with. HeraldConfig reads
// it from the pipeline YAML; the core only needs these typed values.

/// The custom-data shape of the payload (docs/behaviour.md §7).
public enum PayloadProfile: Sendable, Hashable {
    /// Easemob style top-level `f` / `t` / `m` / `g` / `e` (the default).
    case compact
    /// Sendbird style nested object under `key` (normally `sendbird`).
    case sendbird(key: String)
    /// CometChat flat fields (`title`, `body`, `sender`, ..., `callAction`).
    case cometchat

    /// Names the Sendbird object's key may not take: the keys written beside it in an APNs payload or FCM data.
    public static let reservedSendbirdKeys: Set<String> = ["aps", "e", "message", "title", "body", "badge"]

    public var name: String {
        switch self {
        case .compact: return "compact"
        case .sendbird: return "sendbird"
        case .cometchat: return "cometchat"
        }
    }
}

/// Which devices of a user with several are woken (Sendbird's dashboard option).
public enum MultiDeviceMode: String, Sendable, Hashable, CaseIterable {
    /// Send only when every device is offline (the default).
    case allOffline = "all_offline"
    /// As long as one device is offline, send to every device (Sendbird: a foreground app can show it too).
    case anyOffline = "any_offline"
    /// As long as one device is offline, send to the offline devices only (Herald's earlier `any_offline`).
    case offlineOnly = "offline_only"
}

/// One APNs credential of an app: token based (.p8) or certificate based.
public struct APNsCredential: Sendable, Hashable {
    public var bundleID: String
    public var environment: APNsEnvironment
    /// The provider id devices name to be sent with this credential (CometChat's APNs provider id): such a device
    /// gets its bundle id and environment unless it named its own.
    public var providerID: String?
    // Token based
    public var teamID: String?
    public var keyID: String?
    public var keyFile: String?
    // Certificate based
    public var certificateFile: String?
    public var privateKeyFile: String?
    public var p12File: String?
    /// Name of the environment variable holding the .p12 password (preferred).
    public var p12PasswordEnv: String?
    /// The .p12 password written in the file (discouraged; never logged).
    public var p12Password: String?
    /// `aps.content-available: 1` on alerts sent with this credential (CometChat's per-provider switch); nil: the
    /// app's `apns.content_available`.
    public var contentAvailable: Bool?
    /// `aps.mutable-content: 1` on alerts sent with this credential; nil: the app's `apns.mutable_content`.
    public var mutableContent: Bool?

    public enum Auth: Sendable, Hashable {
        case token(teamID: String, keyID: String, keyFile: String)
        case certificate(certificateFile: String, privateKeyFile: String?)
        /// `passwordEnv` names an environment variable; `password` is an inline password.
        case p12(file: String, passwordEnv: String?, password: String?)
    }

    public init(
        bundleID: String, environment: APNsEnvironment = .production, teamID: String? = nil,
        keyID: String? = nil, keyFile: String? = nil, certificateFile: String? = nil,
        privateKeyFile: String? = nil, p12File: String? = nil, p12PasswordEnv: String? = nil,
        p12Password: String? = nil
    ) {
        self.bundleID = bundleID; self.environment = environment; self.teamID = teamID; self.keyID = keyID
        self.keyFile = keyFile; self.certificateFile = certificateFile; self.privateKeyFile = privateKeyFile
        self.p12File = p12File; self.p12PasswordEnv = p12PasswordEnv; self.p12Password = p12Password
    }

    /// How this credential authenticates, or nil when incomplete.
    public var auth: Auth? {
        if let teamID, let keyID, let keyFile { return .token(teamID: teamID, keyID: keyID, keyFile: keyFile) }
        if let certificateFile { return .certificate(certificateFile: certificateFile, privateKeyFile: privateKeyFile) }
        if let p12File { return .p12(file: p12File, passwordEnv: p12PasswordEnv, password: p12Password) }
        return nil
    }
}

/// One FCM HTTP v1 credential of an app (CometChat allows several, one per Firebase project).
public struct FCMCredential: Sendable, Hashable {
    /// The name devices use to pick this credential (`provider_id`).
    public var providerID: String
    /// Path of the Google service-account JSON (`project_id`, `client_email`, `private_key`, `token_uri`).
    public var serviceAccountFile: String
    /// Whether messages carry FCM's `notification` block (displayed by the system) besides `data`;
    /// false sends data-only messages that the app displays itself. Calls are always data-only.
    public var includeNotification: Bool

    public init(providerID: String, serviceAccountFile: String, includeNotification: Bool = true) {
        self.providerID = providerID
        self.serviceAccountFile = serviceAccountFile
        self.includeNotification = includeNotification
    }
}

/// One custom webhook provider of an app (CometChat's "custom provider").
public struct WebhookCredential: Sendable, Hashable {
    public var providerID: String
    /// The HTTPS URL that receives one POST per recipient.
    public var url: String
    /// Basic authentication user; nil sends no `Authorization` header.
    public var username: String?
    /// Name of the environment variable holding the Basic password (preferred).
    public var passwordEnv: String?
    /// The password written in the file (discouraged; never logged).
    public var password: String?
    /// The `region` field of the payload (`us`, `eu`, `in`).
    public var region: String
    /// Posts for every recipient the rules let through, whether or not the user registered a `webhook` device
    /// (CometChat's custom provider, called once per member); the user's own devices are sent to beside it.
    public var everyRecipient: Bool

    public init(
        providerID: String, url: String, username: String? = nil, passwordEnv: String? = nil,
        password: String? = nil, region: String = "us", everyRecipient: Bool = false
    ) {
        self.providerID = providerID; self.url = url; self.username = username
        self.passwordEnv = passwordEnv; self.password = password; self.region = region
        self.everyRecipient = everyRecipient
    }

    /// The device an every-recipient provider posts to for `user` when the user has no `webhook` device of it.
    /// Its token is unique per (provider, user), since send claims each (event, token) pair once; a webhook has
    /// no token to declare dead, so it is never removed.
    public func everyRecipientDevice(user: String) -> Device {
        Device(token: "every-recipient:" + providerID + ":" + user, kind: .webhook, providerID: providerID)
    }
}

/// How FCM messages of an app are dressed (all optional; none by default).
public struct FCMOptions: Sendable, Hashable {
    /// `android.notification.channel_id` of chat notifications.
    public var channelID: String?
    /// `android.notification.click_action` (the activity intent filter to open).
    public var clickAction: String?

    public init(channelID: String? = nil, clickAction: String? = nil) {
        self.channelID = channelID
        self.clickAction = clickAction
    }
}

/// Two flags of an alert's `aps` that an app sets for all its pushes or a credential for its own.
public struct APSFlags: Sendable, Hashable {
    public var contentAvailable: Bool
    public var mutableContent: Bool

    public init(contentAvailable: Bool = false, mutableContent: Bool = false) {
        self.contentAvailable = contentAvailable
        self.mutableContent = mutableContent
    }
}

/// Per-app payload options for teams leaving a vendor (docs/pipeline-config.md `apns:`, `sendbird:`,
/// `cometchat:`). Every default reproduces Herald's payload without the option.
public struct PayloadOptions: Sendable, Hashable {
    /// `aps.alert` as a plain string (the body; title and loc keys are not sent), as older Sendbird samples read it.
    public var alertString = false
    /// `aps.content-available: 1` on every alert, so the app also runs in the background.
    public var contentAvailable = false
    /// `aps.mutable-content: 1` on every alert (a notification service extension may edit it).
    public var mutableContent = false
    /// `aps.sound` (and Sendbird's `push_sound`) when the event sets none; `default` when nil.
    public var sound: String?
    /// Per-conversation sounds, by conversation id; beat `sound`, lose to the event's `em_push_sound`.
    public var conversationSounds: [String: String] = [:]

    /// Sendbird v3 type codes: `MESG`, `FILE`, `ADMM` instead of `User`, `File`, `Admin`.
    public var sendbirdV3TypeCodes = false
    /// `channel_type` of group conversations: `group_messaging` (default) or `chat`.
    public var sendbirdGroupChannelType = "group_messaging"
    /// Whether the Sendbird object carries `channel_unread_count` (a dashboard switch at Sendbird).
    public var sendbirdChannelUnreadCount = true
    /// Sendbird `push_title`: the alert title (empty when there is none).
    public var sendbirdPushTitle = false
    /// Sendbird `push_alert`: the alert body.
    public var sendbirdPushAlert = false
    /// Sendbird `audience_type`, written verbatim when set.
    public var sendbirdAudienceType: String?
    /// Sendbird `mentioned_users` for a mentioned recipient, with Herald's mention counts when the app counts
    /// (`counts: true`), else 0.
    public var sendbirdMentionedUsers = false

    /// CometChat: include a `message` object (id, type, text, sender, receiver, conversation, time).
    public var cometchatIncludeMessage = false
    /// CometChat: the app's `custom` JSON object, written as is.
    public var cometchatCustom: JSONValue?

    public init() {}

    /// The sound of a conversation without an event sound.
    public func sound(conversation: String) -> String {
        if !conversationSounds.isEmpty, let s = conversationSounds[conversation] { return s }
        return sound ?? "default"
    }
}

/// App-level templates: overrides of the default / alternative pair, an
/// optional alert title, and per-custom_type pairs that beat both.
public struct TemplateConfig: Sendable, Hashable {
    public var defaultPair: TemplatePair?
    public var alternativePair: TemplatePair?
    /// Optional `aps.alert.title` template (e.g. `{channel_name}`); none by default.
    public var title: String?
    public var customTypes: [String: TemplatePair]

    public init(
        defaultPair: TemplatePair? = nil, alternativePair: TemplatePair? = nil, title: String? = nil,
        customTypes: [String: TemplatePair] = [:]
    ) {
        self.defaultPair = defaultPair; self.alternativePair = alternativePair; self.title = title
        self.customTypes = customTypes
    }
}

/// Everything the core needs to know about one app (tenant). Immutable but for the policies below; the
/// per-locale string tables are resolved once, at construction. A copy is one reference: the fields live in one
/// shared storage, copied only when a copy's policy is changed (stages look an app up for every record).
public struct AppConfig: Sendable {
    public var appID: String { storage.value.appID }
    public var payloadProfile: PayloadProfile { storage.value.payloadProfile }
    public var multiDevice: MultiDeviceMode { storage.value.multiDevice }
    /// App-wide badge switch; a user's `badge: false` also turns it off.
    public var badge: Bool { storage.value.badge }

    /// The badge of a push to `state` (whose effective preferences are `prefs`): the unread total, or nil (no
    /// badge in the payload) when the app or the user turned badges off, or when Herald does not know the count:
    /// the app keeps no counts (`counts`) and nothing set the user's total (`set_unread`). A badge of 0 clears
    /// the app icon's badge, so an unknown count is left out rather than sent as 0.
    public func badge(for state: UserState, preferences prefs: Preferences) -> Int? {
        guard badge, prefs.badge, counts || state.unread.totalKnown else { return nil }
        return state.unread.total
    }
    public var templates: TemplateConfig { storage.value.templates }
    /// Per-locale overrides of catalog keys (`CatalogKey` raw values).
    public var catalogs: [String: [String: String]] { storage.value.catalogs }
    public var credentials: [APNsCredential] { storage.value.credentials }
    /// `apns-expiration` of chat alerts, seconds after the event time.
    public var expirationSeconds: Int64 { storage.value.expirationSeconds }
    /// `apns-expiration` of call pushes, seconds after the event time.
    public var callExpirationSeconds: Int64 { storage.value.callExpirationSeconds }
    /// FCM HTTP v1 credentials, by provider id; the first is used for devices without one.
    public var fcmCredentials: [FCMCredential] { storage.value.fcmCredentials }
    /// Custom webhook providers; the first is used for devices without a provider id.
    public var webhooks: [WebhookCredential] { storage.value.webhooks }
    public var fcm: FCMOptions { storage.value.fcm }
    /// Where chat notifications' `apns-collapse-id` (FCM `collapse_key`) comes from. `.message` derives it from
    /// the message, so a duplicate that still reaches a device (the crash window of docs/pipeline.md) replaces
    /// the first notification instead of stacking; the price is that a later notification with the same id
    /// (an edit of that message) replaces it too. Calls always collapse by call session.
    public var collapseID: CollapseIDSource { storage.value.collapseID }
    public var payloadOptions: PayloadOptions { storage.value.payloadOptions }
    /// The app's default trigger, template and display style, used in each of those fields a user never set
    /// (`effectivePreferences`). Nil: the built-in defaults.
    public var userDefaults: Preferences? { storage.value.userDefaults }
    /// Which priority class (and so which lane) each kind of event gets (`Priority.classify`).
    public var priority: PriorityPolicy { storage.value.priority }
    /// Herald keeps the unread and mention counts itself (docs/behaviour.md §12): resolve counts every message
    /// event for its recipients, and the badge and Sendbird's counts use them. Off by default (`set_unread`).
    public var counts: Bool {
        get { storage.value.counts }
        set { storage.modify { $0.counts = newValue } }
    }
    /// Push on or off for the whole app (`push: off`, CometChat's dashboard switch): off, every recipient is
    /// suppressed with `app_off` (docs/behaviour.md §6); the app stays listed, so its events are not dead-lettered
    /// `unknown_app`, its registry updates and counts go on. On by default.
    public var push: Bool {
        get { storage.value.push }
        set { storage.modify { $0.push = newValue } }
    }
    /// `aps.interruption-level` and `aps.relevance-score` of alerts, by the rule that classed each push.
    public var interruption: InterruptionPolicy {
        get { storage.value.interruption }
        set { storage.modify { $0.interruption = newValue } }
    }
    /// Burst coalescing per (user, conversation) (docs/behaviour.md §6a); off by default.
    public var coalesce: CoalescePolicy {
        get { storage.value.coalesce }
        set { storage.modify { $0.coalesce = newValue } }
    }
    /// At most so many visible pushes per user per minute (docs/behaviour.md §6b); off by default.
    public var floodGuard: FloodPolicy {
        get { storage.value.floodGuard }
        set { storage.modify { $0.floodGuard = newValue } }
    }
    /// Clears on the user's other devices when a conversation is read (docs/behaviour.md §6c); on by default.
    public var readSync: ReadSyncPolicy {
        get { storage.value.readSync }
        set { storage.modify { $0.readSync = newValue } }
    }
    /// Web Push (device kind `webpush`): the VAPID key and subject, and the push services allowed; nil: the app
    /// sends no Web Push (its `webpush` devices are dead-lettered `no_provider`).
    public var webPush: WebPushSettings? {
        get { storage.value.webPush }
        set { storage.modify { $0.webPush = newValue } }
    }
    /// The digest when Do Not Disturb or a snooze ends (docs/behaviour.md §6d); off by default.
    public var digest: DigestPolicy {
        get { storage.value.digest }
        set { storage.modify { $0.digest = newValue } }
    }
    /// The translator suppress asks for the message text in a recipient's first preferred language when the event
    /// carries no translation into it (docs/behaviour.md §7a); nil (the default): none.
    public var translator: TranslatorPolicy? {
        get { storage.value.translator }
        set { storage.modify { $0.translator = newValue } }
    }
    var strings: [String: Strings] { storage.value.strings }
    var english: Strings { storage.value.english }
    var customTemplates: [String: (text: Template, file: Template)] { storage.value.customTemplates }
    var titleTemplate: Template? { storage.value.titleTemplate }

    /// The fields, shared by copies and copied before a change when another copy holds them too.
    private struct Fields: Sendable {
        let appID: String
        let payloadProfile: PayloadProfile
        let multiDevice: MultiDeviceMode
        let badge: Bool
        let templates: TemplateConfig
        let catalogs: [String: [String: String]]
        let credentials: [APNsCredential]
        let expirationSeconds: Int64
        let callExpirationSeconds: Int64
        let fcmCredentials: [FCMCredential]
        let webhooks: [WebhookCredential]
        let fcm: FCMOptions
        let collapseID: CollapseIDSource
        let payloadOptions: PayloadOptions
        let userDefaults: Preferences?
        let priority: PriorityPolicy
        var counts: Bool
        var push: Bool
        var interruption: InterruptionPolicy
        var coalesce: CoalescePolicy
        var floodGuard: FloodPolicy
        var readSync: ReadSyncPolicy
        var digest = DigestPolicy()
        var translator: TranslatorPolicy?
        let strings: [String: Strings]
        let english: Strings
        let customTemplates: [String: (text: Template, file: Template)]
        let titleTemplate: Template?
        var webPush: WebPushSettings? = nil
    }

    private var storage: CopyOnWrite<Fields>

    public init(
        appID: String = "default", payloadProfile: PayloadProfile = .compact,
        multiDevice: MultiDeviceMode = .allOffline, badge: Bool = true,
        templates: TemplateConfig = TemplateConfig(), catalogs: [String: [String: String]] = [:],
        credentials: [APNsCredential] = [], expirationSeconds: Int64 = 86_400,
        callExpirationSeconds: Int64 = 30, fcmCredentials: [FCMCredential] = [],
        webhooks: [WebhookCredential] = [], fcm: FCMOptions = FCMOptions(),
        collapseID: CollapseIDSource = .none, payloadOptions: PayloadOptions = PayloadOptions(),
        userDefaults: Preferences? = nil, priority: PriorityPolicy = PriorityPolicy()
    ) {
        // CometChat carries the sender in the alert title, so its body is the message alone.
        var templates = templates
        if case .cometchat = payloadProfile, templates.defaultPair == nil {
            templates.defaultPair = TemplatePair(text: "{message}", file: "{filename}")
        }
        var normalizedCatalogs: [String: [String: String]] = [:]
        for (locale, table) in catalogs {
            normalizedCatalogs[Language.normalize(locale), default: [:]].merge(table) { $1 }
        }

        // Resolution order for a key in locale L: app catalog[L], app templates,
        // built-in catalog[L], app catalog[en], built-in English.
        func lookup(_ locale: String, _ key: CatalogKey) -> String {
            if let v = normalizedCatalogs[locale]?[key.rawValue] { return v }
            switch key {
            case .defaultText: if let t = templates.defaultPair?.text { return t }
            case .defaultFile: if let t = templates.defaultPair?.file { return t }
            case .alternativeText: if let t = templates.alternativePair?.text { return t }
            case .alternativeFile: if let t = templates.alternativePair?.file { return t }
            default: break
            }
            if let v = BuiltInCatalogs.all[locale]?[key] { return v }
            if let v = normalizedCatalogs["en"]?[key.rawValue] { return v }
            return BuiltInCatalogs.english[key] ?? ""
        }
        var tables: [String: Strings] = [:]
        let locales = Set(BuiltInCatalogs.all.keys).union(normalizedCatalogs.keys)
        for locale in locales {
            tables[locale] = Strings(locale: locale) { lookup(locale, $0) }
        }
        let english = tables["en"] ?? Strings(locale: "en") { lookup("en", $0) }
        var custom: [String: (text: Template, file: Template)] = [:]
        for (k, pair) in templates.customTypes { custom[k] = (Template(pair.text), Template(pair.file)) }
        storage = CopyOnWrite(
            Fields(
                appID: appID, payloadProfile: payloadProfile, multiDevice: multiDevice, badge: badge,
                templates: templates, catalogs: normalizedCatalogs, credentials: credentials,
                expirationSeconds: expirationSeconds, callExpirationSeconds: callExpirationSeconds,
                fcmCredentials: fcmCredentials, webhooks: webhooks, fcm: fcm, collapseID: collapseID,
                payloadOptions: payloadOptions, userDefaults: userDefaults, priority: priority, counts: false,
                push: true,
                interruption: InterruptionPolicy(), coalesce: CoalescePolicy(), floodGuard: FloodPolicy(),
                readSync: ReadSyncPolicy(), translator: nil, strings: tables, english: english, customTemplates: custom,
                titleTemplate: templates.title.map(Template.init)))
    }

    /// The string table for a user's preferred languages: the first one picks
    /// (exact tag, then its primary subtag), English otherwise.
    public func strings(for languages: [String]) -> Strings {
        guard let first = languages.first else { return english }
        let n = Language.normalize(first)
        if let s = strings[n] { return s }
        if let s = strings[Language.primary(n)] { return s }
        return english
    }

    /// The preferences rules and rendering use: the user's, with the app's `user_defaults` in each of trigger,
    /// template and display style the user never set (`Preferences.unset`), field by field: a user who set only a
    /// language keeps the app's display style, and one who set the built-in value keeps it.
    public func effectivePreferences(_ p: Preferences) -> Preferences {
        guard let d = userDefaults, !p.unset.isEmpty else { return p }
        return p.withDefaults(d)
    }

    /// The bundle id used for devices registered without one: the first credential's.
    public var defaultBundleID: String? { credentials.first?.bundleID }

    /// The APNs credential a device's provider id names (nil: no provider id, or none of the app's credentials
    /// has it).
    public func apnsCredential(_ providerID: String?) -> APNsCredential? {
        guard let providerID else { return nil }
        return credentials.first { $0.providerID == providerID }
    }

    /// Where an APNs or VoIP push to `device` goes: its bundle id and environment, else those of the credential its
    /// provider id names, else Herald's guesses (the first credential's bundle id, production), marked in
    /// `guesses` so that send does not take an answer to a guess as the token's death. Nil bundle: no topic.
    public func apnsRoute(
        _ device: Device
    ) -> (bundleID: String?, environment: APNsEnvironment, guesses: PushRequest.Guesses) {
        let named = apnsCredential(device.providerID)
        var guesses: PushRequest.Guesses = []
        let bundle = device.bundleID ?? named?.bundleID ?? defaultBundleID
        if device.bundleID == nil && named == nil { guesses.insert(.topic) }
        let environment = device.registeredEnvironment ?? named?.environment ?? .production
        if device.registeredEnvironment == nil && named == nil { guesses.insert(.environment) }
        return (bundle, environment, guesses)
    }

    /// `content-available` and `mutable-content` of an alert to `device`: the credential the push goes out with (the
    /// one its provider id names, else the first for its bundle id) may set its own, else the app's `apns:` options.
    public func apsFlags(_ device: Device) -> APSFlags {
        let options = payloadOptions
        var credential = device.providerID == nil ? nil : apnsCredential(device.providerID)
        if credential == nil, !credentials.isEmpty {
            let bundle = device.bundleID ?? defaultBundleID
            credential = credentials.first { $0.bundleID == bundle }
        }
        return APSFlags(
            contentAvailable: credential?.contentAvailable ?? options.contentAvailable,
            mutableContent: credential?.mutableContent ?? options.mutableContent)
    }

    /// The FCM credential a device's provider id names (the first one when nil).
    public func fcmCredential(_ providerID: String?) -> FCMCredential? {
        guard let providerID else { return fcmCredentials.first }
        return fcmCredentials.first { $0.providerID == providerID }
    }

    /// The webhook provider a device's provider id names (the first one when nil).
    public func webhook(_ providerID: String?) -> WebhookCredential? {
        guard let providerID else { return webhooks.first }
        return webhooks.first { $0.providerID == providerID }
    }

    /// Locales with a string table (built-in plus configured).
    public var locales: [String] { strings.keys.sorted() }
}

/// App configurations by app id.
///
/// Read from a pipeline file (`listedOnly`), the apps listed under `apps:` are the only apps there are: a record
/// of any other app id is dead-lettered `unknown_app` by the stage that reads it (docs/behaviour.md §2). Built in
/// code without a file (tests, `heraldctl simulate` without `--pipeline`), every app id gets `fallback`.
public struct AppDirectory: Sendable {
    public var apps: [String: AppConfig]
    /// What `app(_:)` answers for an id not in `apps` (the file's `defaults:` section read on its own, else the
    /// built-in defaults).
    public var fallback: AppConfig
    /// Only the apps in `apps` are known (a directory read from a pipeline file).
    public var listedOnly: Bool

    public init(apps: [String: AppConfig] = [:], fallback: AppConfig = AppConfig(), listedOnly: Bool = false) {
        self.apps = apps
        self.fallback = fallback
        self.listedOnly = listedOnly
    }

    public func app(_ id: String) -> AppConfig { apps[id] ?? fallback }

    /// Whether records of this app id are served (else they are dead-lettered `unknown_app`).
    public func isKnown(_ id: String) -> Bool { !listedOnly || apps[id] != nil }

    /// The DLQ reason for a record of an app id that is not configured.
    public static let unknownAppReason = "unknown_app"

    /// The DLQ detail for a record of an unknown app id (the id cut to 64 characters).
    public static func unknownAppDetail(_ id: String) -> String {
        let shown = id.count > 64 ? String(id.prefix(64)) + "…" : id
        return "app_id \"\(shown)\" is not listed under apps: in the pipeline file"
    }
}

/// See `AppConfig.collapseID`.
public enum CollapseIDSource: String, Sendable, Hashable, CaseIterable {
    /// No collapse id on chat notifications (the default).
    case none
    /// `m-<message id>` (the event id for events without a message), hashed when longer than 64 bytes.
    case message
}
