import Foundation
import HeraldCore

/// Where one app's translations are asked for: a LibreTranslate server (docs/behaviour.md §7a).
public struct TranslateEndpoint: Sendable, Hashable {
    /// `<base URL>/translate` (`TranslatorPolicy.endpoint`).
    public var url: String
    /// Sent as `api_key` when set.
    public var apiKey: String?
    /// The whole call: connect, send, answer.
    public var deadline: Duration

    public init(url: String, apiKey: String? = nil, deadline: Duration) {
        self.url = url
        self.apiKey = apiKey
        self.deadline = deadline
    }
}

/// LibreTranslate's `POST /translate` over HTTP/1.1 (libcurl, connections kept alive per host): one JSON request
/// `{q, source, target, format: "text", api_key}` per text, answered `{"translatedText": "..."}`. Anything else (a
/// timeout, a refused connection, a status other than 2xx, an answer without a `translatedText` string) is a
/// `TranslationFailure`; nothing here throws, and no call outlasts its deadline by more than the client's poll (50 ms).
public final class TranslateClient: Sendable {
    private let http: HTTP1Client

    /// `configuration.maxInFlight` bounds the calls in flight; a batch asks one per message and language.
    public init(
        configuration: HTTP1ClientConfiguration = HTTP1ClientConfiguration(maxInFlight: 4096, maxConnectionsPerHost: 16)
    ) throws(HTTPError) {
        http = try HTTP1Client(configuration: configuration)
    }

    /// Translates `text` from `source` (a language code, or `auto`) into `target`.
    public func translate(
        _ text: String, source: String, target: String, at endpoint: TranslateEndpoint
    ) async -> Result<String, TranslationFailure> {
        Self.outcome(await http.send(Self.request(text, source: source, target: target, at: endpoint)))
    }

    public func shutdown() async { await http.shutdown() }

    /// The request: a JSON body through HeraldCore's writer (the key only when there is one).
    static func request(_ text: String, source: String, target: String, at endpoint: TranslateEndpoint) -> HTTPRequest {
        var w = JSONWriter(capacity: text.utf8.count + 96)
        w.raw("{\"q\":"); w.string(text)
        w.raw(",\"source\":"); w.string(source)
        w.raw(",\"target\":"); w.string(target)
        w.raw(",\"format\":\"text\"")
        if let key = endpoint.apiKey { w.raw(",\"api_key\":"); w.string(key) }
        w.byte(UInt8(ascii: "}"))
        return HTTPRequest(
            url: endpoint.url, headers: [("Content-Type", "application/json"), ("Accept", "application/json")],
            body: w.bytes, timeout: endpoint.deadline)
    }

    /// The translation in an answer, or why there is none.
    static func outcome(_ response: HTTPResponse) -> Result<String, TranslationFailure> {
        guard let status = response.status else {
            switch response.failure {
            case .timedOut?: return .failure(.timeout)
            case .connectFailed?: return .failure(.unreachable)
            case .transfer?, .shutdown?, nil: return .failure(.transport)
            }
        }
        guard (200..<300).contains(status) else { return .failure(.status(status)) }
        guard let answer = try? JSONValue.parse(response.body), let text = answer["translatedText"]?.stringValue,
            Translation.isUsable(text)
        else { return .failure(.badAnswer) }
        return .success(text)
    }
}
