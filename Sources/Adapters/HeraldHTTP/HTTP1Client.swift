import CHeraldCurl
import Foundation
import HeraldCore
import Synchronization

/// One HTTP/1.1 request (a POST unless `method` says otherwise).
public struct HTTPRequest: Sendable {
    public var url: String
    public var method: String
    public var headers: [(String, String)]
    public var body: [UInt8]
    /// Whole-request deadline (connect, send, answer).
    public var timeout: Duration
    /// Basic authentication (user, password); nil sends none.
    public var basicAuth: (user: String, password: String)?
    /// The caller's own identifier, echoed in the response.
    public var tag: UInt64

    public init(
        url: String, method: String = "POST", headers: [(String, String)] = [], body: [UInt8] = [],
        timeout: Duration = .seconds(10), basicAuth: (user: String, password: String)? = nil, tag: UInt64 = 0
    ) {
        self.url = url; self.method = method; self.headers = headers; self.body = body; self.timeout = timeout
        self.basicAuth = basicAuth; self.tag = tag
    }
}

/// The outcome of one request: an HTTP answer, or a failure below HTTP.
public struct HTTPResponse: Sendable {
    public enum Failure: Sendable, Equatable, CustomStringConvertible {
        /// The request's timeout passed (libcurl's CURLE_OPERATION_TIMEDOUT).
        case timedOut
        /// DNS, TCP or TLS trouble before an answer.
        case connectFailed(String)
        /// Anything else libcurl reports.
        case transfer(String)
        /// The client was shut down first.
        case shutdown

        public var description: String {
            switch self {
            case .timedOut: "TimedOut"
            case .connectFailed(let why): "ConnectFailed(\(why))"
            case .transfer(let why): "Transfer(\(why))"
            case .shutdown: "Shutdown"
            }
        }
    }

    public var tag: UInt64
    public var status: Int?
    /// Response headers, names lowercased (the last value of a repeated header wins).
    public var headers: [String: String]
    public var body: [UInt8]
    public var failure: Failure?
}

/// Tunables; defaults in brackets.
public struct HTTP1ClientConfiguration: Sendable {
    /// PEM file of CAs to trust instead of the system store (tests: the stand-in's certificate).
    public var trustedCAFile: String?
    /// Requests accepted and not yet answered; `submit` waits beyond it [1000].
    public var maxInFlight: Int
    /// Connections kept per host (reused across requests, HTTP/1.1 keep-alive) [32].
    public var maxConnectionsPerHost: Int
    public var connectTimeout: Duration

    public init(
        trustedCAFile: String? = nil, maxInFlight: Int = 1000, maxConnectionsPerHost: Int = 32,
        connectTimeout: Duration = .seconds(2)
    ) {
        self.trustedCAFile = trustedCAFile
        self.maxInFlight = max(1, maxInFlight)
        self.maxConnectionsPerHost = max(1, maxConnectionsPerHost)
        self.connectTimeout = connectTimeout
    }
}

/// An HTTP/1.1 client over libcurl's multi interface, driven by a thread of its own: many requests
/// in flight, connections kept alive and reused per host, at most `maxInFlight` accepted at once.
/// Used for plain request/response work (the FCM OAuth token exchange, custom webhooks); HTTP/2
/// stays on the nghttp2 client.
public final class HTTP1Client: Sendable {
    private let loop: CurlLoop

    public init(configuration: HTTP1ClientConfiguration = HTTP1ClientConfiguration()) throws(HTTPError) {
        HTTP1Client.globalInit()
        loop = try CurlLoop(configuration: configuration)
        loop.start()
    }

    deinit { loop.requestStop() }

    /// Sends one request and waits for its outcome.
    public func send(_ request: HTTPRequest) async -> HTTPResponse {
        _ = await loop.gate.acquire(upTo: 1)
        return await withCheckedContinuation { c in
            loop.enqueue([Transfer(request: request) { c.resume(returning: $0) }])
        }
    }

    /// Sends a batch; `onComplete` runs once per request on the client's thread (keep it short).
    /// Returns once all are accepted (waiting while `maxInFlight` are outstanding).
    public func submit(_ requests: [HTTPRequest], onComplete: @escaping @Sendable (HTTPResponse) -> Void) async {
        for request in requests {
            _ = await loop.gate.acquire(upTo: 1)
            loop.enqueue([Transfer(request: request, completion: onComplete)])
        }
    }

    /// Stops: requests still queued or in flight complete with `.shutdown`.
    public func shutdown() async { await loop.stop() }

    /// Requests answered so far with an HTTP status, and new connections libcurl opened.
    public var stats: HTTP1ClientStats { loop.stats }

    private static let initOnce: Void = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) }()
    static func globalInit() { _ = initOnce }
}

public struct HTTP1ClientStats: Sendable, Equatable {
    public var answered = 0
    public var failed = 0
    /// Connections opened (a reused keep-alive connection does not count).
    public var connectionsOpened = 0
    public init() {}
}

public struct HTTPError: Error, Sendable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { "HTTP client error: \(message)" }
}

/// One request's transfer state; owned by the loop thread once enqueued.
final class Transfer: @unchecked Sendable {
    // @unchecked Sendable: handed from the submitting task to the loop thread through the locked
    // inbox; afterwards only the loop thread touches it.
    let request: HTTPRequest
    let completion: @Sendable (HTTPResponse) -> Void
    var body: [UInt8] = []
    var headers: [String: String] = [:]
    var easy: UnsafeMutableRawPointer?
    var headerList: UnsafeMutablePointer<curl_slist>?

    init(request: HTTPRequest, completion: @escaping @Sendable (HTTPResponse) -> Void) {
        self.request = request
        self.completion = completion
    }
}

/// The multi handle and its thread.
final class CurlLoop: @unchecked Sendable {
    // @unchecked Sendable: what other threads reach is in `shared`, behind its lock; the multi handle and `live`
    // are touched only by the loop thread (curl_multi_wakeup is documented as callable from any thread).
    let configuration: HTTP1ClientConfiguration
    let gate: InFlightGate
    private let multi: UnsafeMutableRawPointer
    /// What the submitting tasks and the loop thread share.
    private struct Shared {
        var inbox: [Transfer] = []
        var stopping = false
        var finished = false
        var waiters: [CheckedContinuation<Void, Never>] = []
        var stats = HTTP1ClientStats()
    }
    private let shared = Mutex(Shared())
    private var live: [ObjectIdentifier: Transfer] = [:]

    init(configuration: HTTP1ClientConfiguration) throws(HTTPError) {
        guard let m = curl_multi_init() else { throw HTTPError("curl_multi_init failed") }
        multi = m
        self.configuration = configuration
        gate = InFlightGate(limit: configuration.maxInFlight)
        _ = herald_curl_multi_setopt_long(m, CURLMOPT_MAX_HOST_CONNECTIONS, configuration.maxConnectionsPerHost)
        _ = herald_curl_multi_setopt_long(m, CURLMOPT_MAXCONNECTS, configuration.maxConnectionsPerHost * 4)
        // No HTTP/1.1 pipelining and no multiplexing: one request per connection at a time.
        _ = herald_curl_multi_setopt_long(m, CURLMOPT_PIPELINING, 0)
    }

    deinit { curl_multi_cleanup(multi) }

    func start() {
        let t = Thread { [self] in run() }
        t.name = "herald-http1"
        t.start()
    }

    var stats: HTTP1ClientStats { shared.withLock { $0.stats } }

    func enqueue(_ transfers: [Transfer]) {
        let refused = shared.withLock { shared -> Bool in
            if shared.stopping || shared.finished { return true }
            shared.inbox.append(contentsOf: transfers)
            return false
        }
        if refused {
            for t in transfers { t.completion(Self.response(t, failure: .shutdown)); gate.release(1) }
            return
        }
        curl_multi_wakeup(multi)
    }

    func requestStop() {
        shared.withLock { $0.stopping = true }
        curl_multi_wakeup(multi)
    }

    func stop() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let done = shared.withLock { shared -> Bool in
                if shared.finished { return true }
                shared.stopping = true
                shared.waiters.append(c)
                return false
            }
            if done { c.resume() } else { curl_multi_wakeup(multi) }
        }
    }

    private func run() {
        var running: Int32 = 0
        while true {
            let (batch, stop) = shared.withLock { shared -> ([Transfer], Bool) in
                let b = shared.inbox
                shared.inbox.removeAll()
                return (b, shared.stopping)
            }
            if stop {
                for t in batch { finish(t, failure: .shutdown) }
                for t in Array(live.values) {
                    if let e = t.easy { curl_multi_remove_handle(multi, e) }
                    finish(t, failure: .shutdown)
                }
                let ws = shared.withLock { shared -> [CheckedContinuation<Void, Never>] in
                    shared.finished = true
                    let late = shared.inbox
                    shared.inbox.removeAll()
                    for t in late { t.completion(Self.response(t, failure: .shutdown)); gate.release(1) }
                    let w = shared.waiters
                    shared.waiters.removeAll()
                    return w
                }
                for w in ws { w.resume() }
                return
            }
            for t in batch { add(t) }
            curl_multi_perform(multi, &running)
            var left: Int32 = 0
            while let msg = curl_multi_info_read(multi, &left) {
                guard msg.pointee.msg == CURLMSG_DONE, let easy = msg.pointee.easy_handle,
                    let raw = herald_curl_private(easy)
                else { continue }
                let t = Unmanaged<Transfer>.fromOpaque(raw).takeUnretainedValue()
                let code = msg.pointee.data.result
                curl_multi_remove_handle(multi, easy)
                let opened = herald_curl_num_connects(easy)
                shared.withLock { $0.stats.connectionsOpened += opened }
                if code == CURLE_OK {
                    finish(t, status: herald_curl_response_code(easy))
                } else if code == CURLE_OPERATION_TIMEDOUT {
                    finish(t, failure: .timedOut)
                } else if code == CURLE_COULDNT_CONNECT || code == CURLE_COULDNT_RESOLVE_HOST
                    || code == CURLE_SSL_CONNECT_ERROR || code == CURLE_PEER_FAILED_VERIFICATION
                {
                    finish(t, failure: .connectFailed(String(cString: curl_easy_strerror(code))))
                } else {
                    finish(t, failure: .transfer(String(cString: curl_easy_strerror(code))))
                }
            }
            var numfds: Int32 = 0
            curl_multi_poll(multi, nil, 0, live.isEmpty ? 1000 : 50, &numfds)
        }
    }

    private func add(_ t: Transfer) {
        guard let easy = curl_easy_init() else { finish(t, failure: .transfer("curl_easy_init failed")); return }
        t.easy = easy
        let r = t.request
        _ = herald_curl_setopt_string(easy, CURLOPT_URL, r.url)
        _ = herald_curl_setopt_long(easy, CURLOPT_HTTP_VERSION, herald_curl_http_1_1())
        _ = herald_curl_setopt_long(easy, CURLOPT_NOSIGNAL, 1)
        _ = herald_curl_setopt_long(easy, CURLOPT_TIMEOUT_MS, Int(r.timeout.milliseconds))
        _ = herald_curl_setopt_long(
            easy, CURLOPT_CONNECTTIMEOUT_MS, Int(configuration.connectTimeout.milliseconds))
        _ = herald_curl_setopt_string(easy, CURLOPT_PROTOCOLS_STR, "https,http")
        // TLS 1.2 or later, and the CA file (which replaces libcurl's default bundle) applied, or no request: a
        // setting libcurl refuses must not leave the transfer with weaker TLS than configured.
        var tlsApplied = herald_curl_require_tls_1_2(easy) == 0
        if let ca = configuration.trustedCAFile {
            tlsApplied = tlsApplied && herald_curl_setopt_string(easy, CURLOPT_CAINFO, ca) == 0
        }
        guard tlsApplied else {
            finish(t, failure: .transfer("libcurl refused the TLS settings (TLS 1.2 minimum, CA file)"))
            return
        }
        if r.method == "POST" {
            _ = herald_curl_setopt_long(easy, CURLOPT_POST, 1)
            r.body.withUnsafeBytes {
                _ = herald_curl_set_body(easy, $0.baseAddress ?? UnsafeRawPointer(bitPattern: 1), $0.count)
            }
        } else if r.method != "GET" {
            _ = herald_curl_setopt_string(easy, CURLOPT_CUSTOMREQUEST, r.method)
        }
        var list: UnsafeMutablePointer<curl_slist>? = nil
        for (name, value) in r.headers { list = curl_slist_append(list, "\(name): \(value)") }
        // libcurl adds "Expect: 100-continue" to larger POSTs; an extra round trip we do not want.
        list = curl_slist_append(list, "Expect:")
        t.headerList = list
        _ = herald_curl_setopt_slist(easy, CURLOPT_HTTPHEADER, list)
        if let auth = r.basicAuth {
            _ = herald_curl_setopt_long(easy, CURLOPT_HTTPAUTH, herald_curl_auth_basic())
            _ = herald_curl_setopt_string(easy, CURLOPT_USERNAME, auth.user)
            _ = herald_curl_setopt_string(easy, CURLOPT_PASSWORD, auth.password)
        }
        let me = Unmanaged.passUnretained(t).toOpaque()
        _ = herald_curl_setopt_pointer(easy, CURLOPT_PRIVATE, me)
        _ = herald_curl_set_write(
            easy,
            { data, size, count, user in
                guard let data, let user else { return 0 }
                let t = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
                let n = size * count
                if t.body.count < 1 << 20 {
                    data.withMemoryRebound(to: UInt8.self, capacity: n) {
                        t.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: n))
                    }
                }
                return n
            }, me)
        _ = herald_curl_set_header(
            easy,
            { data, size, count, user in
                guard let data, let user else { return 0 }
                let t = Unmanaged<Transfer>.fromOpaque(user).takeUnretainedValue()
                let n = size * count
                let line = data.withMemoryRebound(to: UInt8.self, capacity: n) {
                    String(decoding: UnsafeBufferPointer(start: $0, count: n), as: UTF8.self)
                }
                if line.hasPrefix("HTTP/") { t.headers.removeAll() }  // a new response (after a 100 or a redirect)
                if let colon = line.firstIndex(of: ":") {
                    let name = line[..<colon].lowercased()
                    let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespacesAndNewlines)
                    t.headers[name] = value
                }
                return n
            }, me)
        live[ObjectIdentifier(t)] = t
        curl_multi_add_handle(multi, easy)
    }

    private func finish(_ t: Transfer, status: Int? = nil, failure: HTTPResponse.Failure? = nil) {
        live.removeValue(forKey: ObjectIdentifier(t))
        if let e = t.easy { curl_easy_cleanup(e) }
        t.easy = nil
        if let l = t.headerList { curl_slist_free_all(l) }
        t.headerList = nil
        var response = Self.response(t, failure: failure)
        response.status = status
        shared.withLock { if status != nil { $0.stats.answered += 1 } else { $0.stats.failed += 1 } }
        t.completion(response)
        gate.release(1)
    }

    static func response(_ t: Transfer, failure: HTTPResponse.Failure?) -> HTTPResponse {
        HTTPResponse(tag: t.request.tag, status: nil, headers: t.headers, body: t.body, failure: failure)
    }
}
