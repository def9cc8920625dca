// Translations Herald asks for (docs/behaviour.md §7a): when an app has a translator, suppress asks it for the
// message text in a recipient's first preferred language when the event carries no translation into it, and puts
// the answer among the event's translations in the recipient's deliverable record; render then picks it as it picks
// any translation the chat back end sent (`Renderer.displayText`). What is decided here is pure: which recipient
// needs which language, the codes the translator is sent, and how a failure is named. The translator itself
// (LibreTranslate over HTTP) and its cache (Redis) are adapters.

/// An app's translator (`translator:` in the pipeline file, docs/pipeline-config.md): a LibreTranslate server.
public struct TranslatorPolicy: Sendable, Hashable {
    /// The server's base URL; requests go to `<url>/translate`.
    public var url: String
    /// The environment variable holding the API key sent as `api_key`; nil sends none.
    public var apiKeyEnv: String?
    /// How long one call may take (connect, send, answer) before the original text is sent.
    public var deadlineMilliseconds: Int64
    /// How long a translation is kept in Redis; 0 keeps none.
    public var cacheTTLMilliseconds: Int64
    /// The most translations kept per app (the oldest go first); 0 keeps none.
    public var cacheMaxEntries: Int

    public static let defaultDeadlineMilliseconds: Int64 = 1_000
    public static let defaultCacheTTLMilliseconds: Int64 = 3_600_000
    public static let defaultCacheMaxEntries = 10_000

    public init(
        url: String, apiKeyEnv: String? = nil, deadlineMilliseconds: Int64 = defaultDeadlineMilliseconds,
        cacheTTLMilliseconds: Int64 = defaultCacheTTLMilliseconds, cacheMaxEntries: Int = defaultCacheMaxEntries
    ) {
        self.url = url
        self.apiKeyEnv = apiKeyEnv
        self.deadlineMilliseconds = max(1, deadlineMilliseconds)
        self.cacheTTLMilliseconds = max(0, cacheTTLMilliseconds)
        self.cacheMaxEntries = max(0, cacheMaxEntries)
    }

    /// Where a translation is asked for: `<url>/translate` (LibreTranslate's route).
    public var endpoint: String {
        var base = Substring(url)
        while base.hasSuffix("/") { base = base.dropLast() }
        return base + "/translate"
    }

    /// Whether translations are kept in Redis.
    public var caches: Bool { cacheTTLMilliseconds > 0 && cacheMaxEntries > 0 }
}

/// Why a translation was not had: the push then goes out with the original text, and the explain trail says why
/// (`Translation.failedReason`).
public enum TranslationFailure: Error, Sendable, Hashable {
    /// No answer within the deadline.
    case timeout
    /// An answer other than 2xx (403: the API key; 400: the request; 429: the server's rate limit; 5xx).
    case status(Int)
    /// A 2xx answer that is not JSON with a `translatedText` string (or one longer than an event may carry).
    case badAnswer
    /// No connection (refused, no route, name not found, TLS failed).
    case unreachable
    /// The transfer failed otherwise, or the client was shutting down.
    case transport

    /// The code in the explain trail: `timeout`, `http_<status>`, `bad_answer`, `unreachable`, `transport`.
    public var code: String {
        switch self {
        case .timeout: "timeout"
        case .status(let status): "http_\(status)"
        case .badAnswer: "bad_answer"
        case .unreachable: "unreachable"
        case .transport: "transport"
        }
    }
}

public enum Translation {
    /// The explain trail's reason on a `deliver` decision whose push went out untranslated:
    /// `translation_failed:<code>` (`TranslationFailure.code`).
    public static let failedReasonPrefix = "translation_failed:"

    public static func failedReason(_ failure: TranslationFailure) -> String { failedReasonPrefix + failure.code }

    /// Whether a push of `event` may show a translated text at all: a message (or an edited one) of type text or
    /// admin with text. Read from what suppress's rules read (kind and message type), before anything is decoded.
    public static func mayTranslate(_ event: ChatEvent) -> Bool {
        guard event.kind == .message || event.kind == .messageEdited, let m = event.message else { return false }
        return m.type != .file
    }

    /// The preferred language a push to a recipient with `languages` needs a translation into that `event` does not
    /// carry: the first one, when the message is not written in one of the recipient's languages (Sendbird: "if
    /// messages are sent in one of those languages, the notifications won't be translated"), the event has no
    /// translation into it, and the translator has a code for it. Nil otherwise (nothing to ask).
    public static func missingLanguage(_ event: ChatEvent, languages: [String]) -> String? {
        guard mayTranslate(event), let m = event.message, !m.text.isEmpty, let first = languages.first,
            let target = code(first)
        else { return nil }
        if Renderer.isInPreferredLanguage(m, languages: languages) { return nil }
        if m.translation(first) != nil { return nil }
        // Written in the same language as the target (`fr-CA` to a reader of `fr`): nothing to translate.
        if let language = m.language, code(language) == target { return nil }
        return first
    }

    /// The translator's code for a language tag: its primary subtag, lowercased (`fr` for `fr-CA`, `zh` for
    /// `zh-Hans`), as LibreTranslate names languages; nil for a tag whose primary subtag is not 2 or 3 letters.
    public static func code(_ tag: String) -> String? {
        let primary = Language.primary(tag)
        guard (2...3).contains(primary.utf8.count),
            primary.utf8.allSatisfy({ $0 >= UInt8(ascii: "a") && $0 <= UInt8(ascii: "z") })
        else { return nil }
        return primary
    }

    /// The source code sent for a message: its language's code, else `auto` (the translator detects it).
    public static func sourceCode(_ message: ChatEvent.Message) -> String {
        message.language.flatMap(code) ?? "auto"
    }

    /// Whether a translator's text may be carried as a translation: not empty, and within what an event may carry.
    public static func isUsable(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.count <= ChatEvent.Limits.textBytes
    }
}

extension ChatEvent.Message {
    /// The message with `text` as its translation into `language` (replacing one it had), kept sorted by tag.
    public func adding(translation text: String, language: String) -> ChatEvent.Message {
        var copy = self
        copy.translations = (translations.filter { $0.0 != language } + [(language, text)]).sorted { $0.0 < $1.0 }
        return copy
    }
}

extension ChatEvent {
    /// The event with `text` as its message's translation into `language` (unchanged without a message).
    public func adding(translation text: String, language: String) -> ChatEvent {
        guard let m = message else { return self }
        var copy = self
        copy.message = m.adding(translation: text, language: language)
        return copy
    }
}
