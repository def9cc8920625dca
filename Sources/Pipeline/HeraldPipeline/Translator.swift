import HeraldCore

// The translator suppress asks for the texts an event carries no translation of (docs/behaviour.md §7a), as ports:
// `Translator` is what suppress calls once per batch; `CachedTranslator` puts it together from a cache (Redis in the
// stage) and the translation service (LibreTranslate over HTTP), so the order of things (cache first, one call per
// text, the answers kept) is tested here without a socket.

/// One text to translate: a message's text into one language, for an app's translator.
public struct TranslationRequest: Sendable, Hashable {
    public var appID: String
    public var messageID: String
    public var text: String
    /// The translator's code of the message's language (`Translation.sourceCode`), `auto` when the event names none.
    public var source: String
    /// The translator's code of the language asked for (`Translation.code`).
    public var target: String
    public var policy: TranslatorPolicy

    public init(
        appID: String, messageID: String, text: String, source: String, target: String, policy: TranslatorPolicy
    ) {
        self.appID = appID
        self.messageID = messageID
        self.text = text
        self.source = source
        self.target = target
        self.policy = policy
    }
}

/// What became of one request.
public enum TranslationOutcome: Sendable, Hashable {
    /// Found in the cache.
    case cached(String)
    /// Asked of the translator, which answered.
    case translated(String)
    /// Not had: the original text is sent.
    case failed(TranslationFailure)

    /// The translated text, nil when it failed.
    public var text: String? {
        switch self {
        case .cached(let text), .translated(let text): text
        case .failed: nil
        }
    }

    /// `herald_translations_total{outcome}`: `hit`, `translated`, `timeout`, `failed`.
    public var metricOutcome: String {
        switch self {
        case .cached: "hit"
        case .translated: "translated"
        case .failed(.timeout): "timeout"
        case .failed: "failed"
        }
    }
}

/// Translates a batch's texts.
public protocol Translator: Sendable {
    /// The outcome of each request, in order. Never throws and never waits much longer than the longest deadline of
    /// the requests' policies: a failure is an outcome.
    func translate(_ requests: [TranslationRequest]) async -> [TranslationOutcome]
}

/// Where translations are kept between batches and processes (Redis in the stage, docs/redis-keys.md).
public protocol TranslationCache: Sendable {
    /// The kept translation of each request (nil: none, or one of another text), in one round trip.
    func lookup(_ requests: [TranslationRequest]) async throws -> [String?]
    /// Keeps the translations, each for its policy's TTL and within its app's bound, in one round trip.
    func store(_ entries: [(request: TranslationRequest, text: String)]) async throws
}

/// The translation service: one call per request, within its policy's deadline.
public protocol TranslationService: Sendable {
    func translate(_ request: TranslationRequest) async -> Result<String, TranslationFailure>
}

/// The cache first (requests whose policy caches), then one service call per request not found, all at once; what
/// the service answered is kept. A cache that fails is passed by: the batch is translated without it.
public struct CachedTranslator: Translator {
    public var cache: (any TranslationCache)?
    public var service: any TranslationService
    /// Told when the cache fails (the batch goes on without it).
    public var onCacheFailure: @Sendable (any Error) -> Void

    public init(
        cache: (any TranslationCache)?, service: any TranslationService,
        onCacheFailure: @escaping @Sendable (any Error) -> Void = { _ in }
    ) {
        self.cache = cache
        self.service = service
        self.onCacheFailure = onCacheFailure
    }

    public func translate(_ requests: [TranslationRequest]) async -> [TranslationOutcome] {
        var outcomes: [TranslationOutcome?] = Array(repeating: nil, count: requests.count)
        let cached = requests.indices.filter { requests[$0].policy.caches }
        if let cache, !cached.isEmpty {
            do {
                let found = try await cache.lookup(cached.map { requests[$0] })
                if found.count == cached.count {
                    for (index, text) in zip(cached, found) {
                        if let text, Translation.isUsable(text) { outcomes[index] = .cached(text) }
                    }
                }
            } catch {
                onCacheFailure(error)
            }
        }
        let asked = requests.indices.filter { outcomes[$0] == nil }
        let service = self.service
        let answers = await withTaskGroup(
            of: (Int, Result<String, TranslationFailure>).self,
            returning: [Int: Result<String, TranslationFailure>].self
        ) { group in
            for index in asked {
                let request = requests[index]
                group.addTask { (index, await service.translate(request)) }
            }
            var answers: [Int: Result<String, TranslationFailure>] = [:]
            for await (index, answer) in group { answers[index] = answer }
            return answers
        }
        var keep: [(request: TranslationRequest, text: String)] = []
        for index in asked {
            switch answers[index] {
            case .success(let text)? where Translation.isUsable(text):
                outcomes[index] = .translated(text)
                if requests[index].policy.caches { keep.append((requests[index], text)) }
            case .success?: outcomes[index] = .failed(.badAnswer)
            case .failure(let failure)?: outcomes[index] = .failed(failure)
            case nil: outcomes[index] = .failed(.transport)
            }
        }
        if let cache, !keep.isEmpty {
            do { try await cache.store(keep) } catch { onCacheFailure(error) }
        }
        return outcomes.map { $0 ?? .failed(.transport) }
    }
}
