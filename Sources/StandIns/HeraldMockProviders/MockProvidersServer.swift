// The FCM and custom-webhook stand-in: one TLS listener; ALPN picks the protocol.
// - h2: FCM HTTP v1 `POST /v1/projects/{project}/messages:send` (nghttp2 server session).
// - http/1.1: the OAuth2 token endpoint `POST /token` (RS256 assertion checked against the
//   service account's public key), webhook receivers `POST /webhook/<name>`, and LibreTranslate's
//   `POST /translate` (what a self-hosted translator checks, deterministic translations).
// Thread per connection with blocking TLS I/O: simple, and plenty for tests and demos.
import CNghttp2
import COpenSSL
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Settings of the stand-in. Defaults in brackets.
public struct MockProvidersConfiguration: Sendable {
    public var host: String
    /// 0 lets the kernel pick [0].
    public var port: Int
    public var certificatePath: String
    public var privateKeyPath: String
    /// The Firebase project whose messages:send is served.
    public var projectID: String
    /// The service account (`client_email`) whose assertions are accepted, and its RSA public key (PEM;
    /// a certificate or private key file works too).
    public var clientEmail: String
    public var servicePublicKeyPath: String
    /// Lifetime of issued access tokens [3600 s].
    public var accessTokenLifetime: Int
    /// Registration tokens answered 404 UNREGISTERED.
    public var unregisteredTokens: Set<String>
    /// Registration tokens answered 403 SENDER_ID_MISMATCH.
    public var foreignTokens: Set<String>
    /// After this many streams a connection gets GOAWAY (0: never).
    public var goawayAfterStreams: Int
    /// Basic credentials the webhook receivers require (user, password); nil: none.
    public var webhookAuth: (user: String, password: String)?
    /// SETTINGS_MAX_CONCURRENT_STREAMS [100].
    public var maxConcurrentStreams: Int
    /// Faults given, in order, to the first requests of named webhook receivers (`/webhook/<name>`).
    public var webhookFaultsByName: [String: [MockFault]] = [:]
    /// Append one JSON line per answer here (endpoint, status, reason, target, body); nil: memory only.
    public var recordPath: String?
    /// Where Web Push subscriptions' keys are read from, `<id>.json` per `/wp/<id>` (and `<id>.gone` marks one
    /// gone); nil: only those given with `addWebPushSubscription`.
    public var webPushKeyDirectory: String?
    /// Offer HTTP/2 in ALPN [true]; false: HTTP/1.1 only, as a push service without HTTP/2 (FCM's messages:send is
    /// then unreachable).
    public var http2 = true
    /// The `api_key` `/translate` requires (403 otherwise, as LibreTranslate with API keys required); nil: none.
    public var translateAPIKey: String?
    /// How long `/translate` holds every answer first (deadline tests and demos).
    public var translateDelay: Duration = .zero

    public init(
        host: String = "127.0.0.1", port: Int = 0, certificatePath: String, privateKeyPath: String,
        projectID: String, clientEmail: String, servicePublicKeyPath: String, accessTokenLifetime: Int = 3600,
        unregisteredTokens: Set<String> = [], foreignTokens: Set<String> = [], goawayAfterStreams: Int = 0,
        webhookAuth: (user: String, password: String)? = nil, maxConcurrentStreams: Int = 100
    ) {
        self.host = host; self.port = port; self.certificatePath = certificatePath; self.privateKeyPath = privateKeyPath
        self.projectID = projectID; self.clientEmail = clientEmail; self.servicePublicKeyPath = servicePublicKeyPath
        self.accessTokenLifetime = accessTokenLifetime; self.unregisteredTokens = unregisteredTokens
        self.foreignTokens = foreignTokens; self.goawayAfterStreams = goawayAfterStreams; self.webhookAuth = webhookAuth
        self.maxConcurrentStreams = maxConcurrentStreams
    }
}

/// One answer the stand-in gave.
public struct MockAnswer: Sendable, Equatable {
    public enum Endpoint: String, Sendable { case token, send, webhook, webpush, translate }
    public var endpoint: Endpoint
    public var status: Int
    /// FCM error code or status name; the token endpoint's `error`; empty on success.
    public var reason: String
    /// messages:send: the registration token; webhook: the receiver name; translate: the target language.
    public var target: String
    /// The request body as received.
    public var body: [UInt8]
    /// The `authorization` header.
    public var authorization: String?
    /// Web Push: the `ttl`, `urgency`, `topic` and `content-encoding` headers (the body is the decrypted message).
    public var headers: [String: String] = [:]
    /// Web Push: the body as received (encrypted).
    public var received: [UInt8] = []
    /// The answer's body, when it is worth keeping (translate).
    public var answer: [UInt8]? = nil
}

/// A fault to give instead of the normal answer.
public struct MockFault: Sendable, Equatable {
    public var status: Int
    /// FCM error code for messages:send answers.
    public var errorCode: String?
    public var retryAfter: Int?
    /// Hold the answer this long first (webhook deadline tests).
    public var delay: Duration

    public init(status: Int, errorCode: String? = nil, retryAfter: Int? = nil, delay: Duration = .zero) {
        self.status = status; self.errorCode = errorCode; self.retryAfter = retryAfter; self.delay = delay
    }
}

public struct MockSetupError: Error, CustomStringConvertible {
    public let description: String
    init(_ d: String) { description = d }
}

/// The stand-in server. `start()` runs it on threads of its own; `stop()` closes it.
public final class MockProvidersServer: @unchecked Sendable {
    // @unchecked Sendable: mutable state (tokens, answers, fault queues, counters) is in `state`, behind its
    // lock; each connection's TLS and nghttp2 state is confined to that connection's thread.
    public let configuration: MockProvidersConfiguration
    public private(set) var port: Int = 0
    private let ctx: OpaquePointer
    private let publicKey: OpaquePointer
    /// What the connection threads and the controls share.
    private struct State {
        var listenFD: Int32 = -1
        var issued: [String: (project: String, expires: Date)] = [:]
        var answers: [MockAnswer] = []
        var sendFaults: [MockFault] = []
        var webhookFaults: [MockFault] = []
        var namedWebhookFaults: [String: [MockFault]] = [:]
        var translateFaults: [MockFault] = []
        var stopped = false
        var openFDs: Set<Int32> = []
        var tokenCounter = 0
        var connectionsAccepted = 0
        var webPushKeys: [String: MockWebPushSubscription] = [:]
        var webPushGoneIDs: Set<String> = []
    }
    private let state: Mutex<State>

    public init(configuration: MockProvidersConfiguration) throws {
        self.configuration = configuration
        state = Mutex(State(namedWebhookFaults: configuration.webhookFaultsByName))
        guard let ctx = SSL_CTX_new(TLS_server_method()) else { throw MockSetupError("SSL_CTX_new failed") }
        self.ctx = ctx
        SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, Int(TLS1_2_VERSION), nil)
        guard SSL_CTX_use_certificate_chain_file(ctx, configuration.certificatePath) == 1,
            SSL_CTX_use_PrivateKey_file(ctx, configuration.privateKeyPath, SSL_FILETYPE_PEM) == 1
        else {
            SSL_CTX_free(ctx)
            throw MockSetupError("cannot load the stand-in's certificate or key")
        }
        if !configuration.http2 {
            SSL_CTX_set_alpn_select_cb(
                ctx,
                { _, out, outlen, input, inlen, _ in
                    // http/1.1 only: a client that offers nothing else gets no protocol.
                    guard let input, let out, let outlen else { return SSL_TLSEXT_ERR_NOACK }
                    var i = 0
                    while i < Int(inlen) {
                        let n = Int(input[i])
                        if n == 8, i + 8 < Int(inlen),
                            String(decoding: UnsafeBufferPointer(start: input + i + 1, count: 8), as: UTF8.self)
                                == "http/1.1"
                        {
                            out.pointee = input + i + 1
                            outlen.pointee = 8
                            return SSL_TLSEXT_ERR_OK
                        }
                        i += 1 + n
                    }
                    return SSL_TLSEXT_ERR_NOACK
                }, nil)
        } else {
            SSL_CTX_set_alpn_select_cb(
                ctx,
                { _, out, outlen, input, inlen, _ in
                    // Prefer h2, else http/1.1.
                    guard let input, let out, let outlen else { return SSL_TLSEXT_ERR_NOACK }
                    var i = 0
                    var http11: Int?
                    while i < Int(inlen) {
                        let n = Int(input[i])
                        if n == 2, i + 2 < Int(inlen) + 1, input[i + 1] == UInt8(ascii: "h"),
                            input[i + 2] == UInt8(ascii: "2")
                        {
                            out.pointee = input + i + 1
                            outlen.pointee = 2
                            return SSL_TLSEXT_ERR_OK
                        }
                        if n == 8,
                            String(decoding: UnsafeBufferPointer(start: input + i + 1, count: 8), as: UTF8.self)
                                == "http/1.1"
                        {
                            http11 = i
                        }
                        i += 1 + n
                    }
                    if let at = http11 {
                        out.pointee = input + at + 1
                        outlen.pointee = 8
                        return SSL_TLSEXT_ERR_OK
                    }
                    return SSL_TLSEXT_ERR_NOACK
                }, nil)
        }
        guard let key = Self.loadPublicKey(configuration.servicePublicKeyPath) else {
            SSL_CTX_free(ctx)
            throw MockSetupError(
                "cannot load the service account public key from \(configuration.servicePublicKeyPath)")
        }
        publicKey = key
    }

    deinit {
        SSL_CTX_free(ctx)
        EVP_PKEY_free(publicKey)
    }

    static func loadPublicKey(_ path: String) -> OpaquePointer? {
        guard let f = fopen(path, "r") else { return nil }
        defer { fclose(f) }
        if let k = PEM_read_PUBKEY(f, nil, nil, nil) { return k }
        rewind(f)
        if let cert = PEM_read_X509(f, nil, nil, nil) {
            defer { X509_free(cert) }
            return X509_get_pubkey(cert)
        }
        rewind(f)
        if let k = PEM_read_PrivateKey(f, nil, nil, nil) { return k }
        ERR_clear_error()
        return nil
    }

    /// Binds and starts accepting.
    public func start() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw MockSetupError("socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(configuration.port).bigEndian)
        inet_pton(AF_INET, configuration.host, &addr.sin_addr)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 128) == 0 else {
            close(fd)
            throw MockSetupError(
                "cannot listen on \(configuration.host):\(configuration.port): \(String(cString: strerror(errno)))")
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        port = Int(UInt16(bigEndian: addr.sin_port))
        state.withLock { s in s.listenFD = fd }
        let t = Thread { [self] in acceptLoop(fd) }
        t.name = "mock-providers-accept"
        t.start()
    }

    /// Stops accepting and ends every open connection. Descriptors are only shut down here, under the lock; the
    /// threads that own them close them. Closing one here could let its number be reused by another socket of the
    /// process before the owner's last call on it, which would then act on a stranger's connection.
    public func stop() {
        state.withLock { s in
            s.stopped = true
            if s.listenFD >= 0 { shutdown(s.listenFD, Int32(SHUT_RDWR)) }
            for fd in s.openFDs { shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    // MARK: Control (tests)

    /// Answers the next messages:send requests with these faults, in order.
    public func injectSendFaults(_ faults: [MockFault]) { state.withLock { s in s.sendFaults += faults } }
    /// Answers the next webhook requests with these faults, in order.
    public func injectWebhookFaults(_ faults: [MockFault]) { state.withLock { s in s.webhookFaults += faults } }
    /// Answers the next `/translate` requests with these faults, in order (a fault with status 200 and a delay
    /// answers the translation late).
    public func injectTranslateFaults(_ faults: [MockFault]) { state.withLock { s in s.translateFaults += faults } }
    /// Forgets every issued access token (the next messages:send gets 401 UNAUTHENTICATED).
    public func revokeAccessTokens() { state.withLock { s in s.issued.removeAll() } }
    /// Everything answered so far, in order.
    public var recorded: [MockAnswer] { state.withLock { s in s.answers } }
    public func recorded(_ endpoint: MockAnswer.Endpoint) -> [MockAnswer] {
        recorded.filter { $0.endpoint == endpoint }
    }
    public var accessTokensIssued: Int { state.withLock { s in s.tokenCounter } }
    /// Serves `/wp/<id>` for a subscription whose keys the caller holds.
    public func addWebPushSubscription(id: String, _ subscription: MockWebPushSubscription) {
        state.withLock { s in s.webPushKeys[id] = subscription }
    }
    /// Answers 410 to `/wp/<id>` from now on.
    public func markWebPushGone(id: String) { state.withLock { s in _ = s.webPushGoneIDs.insert(id) } }
    func webPushSubscriptions(_ id: String) -> MockWebPushSubscription? { state.withLock { s in s.webPushKeys[id] } }
    func webPushMarkedGone(_ id: String) -> Bool { state.withLock { s in s.webPushGoneIDs.contains(id) } }
    public var connections: Int { state.withLock { s in s.connectionsAccepted } }

    /// Issues an access token for `project` outside the token endpoint (tests of foreign tokens).
    public func issueToken(project: String, lifetime: TimeInterval = 3600) -> String {
        state.withLock { s in
            s.tokenCounter += 1
            let t = "ya29.mock-\(s.tokenCounter)-\(UInt32.random(in: 0...UInt32.max))"
            s.issued[t] = (project, Date().addingTimeInterval(lifetime))
            return t
        }
    }

    func record(_ a: MockAnswer) {
        state.withLock { s in
            s.answers.append(a)
            guard let path = configuration.recordPath else { return }
            var line: [String: Any] = [
                "endpoint": a.endpoint.rawValue, "status": a.status, "reason": a.reason,
                "target": a.target, "body": String(decoding: a.body, as: UTF8.self),
            ]
            if !a.headers.isEmpty { line["headers"] = a.headers }
            if !a.received.isEmpty { line["received"] = Data(a.received).base64EncodedString() }
            if let answer = a.answer { line["answer"] = String(decoding: answer, as: UTF8.self) }
            guard var data = try? JSONSerialization.data(withJSONObject: line, options: [.sortedKeys]) else { return }
            data.append(10)
            if let h = FileHandle(forWritingAtPath: path) {
                h.seekToEndOfFile()
                h.write(data)
                h.closeFile()
            } else {
                _ = FileManager.default.createFile(atPath: path, contents: data)
            }
        }
    }

    // MARK: Connections

    private func acceptLoop(_ listener: Int32) {
        defer {
            state.withLock { s in s.listenFD = -1 }
            close(listener)
        }
        while true {
            let fd = accept(listener, nil, nil)
            if fd < 0 {
                if errno == EINTR { continue }
                return
            }
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let ok = state.withLock { s -> Bool in
                if s.stopped { return false }
                s.openFDs.insert(fd)
                s.connectionsAccepted += 1
                return true
            }
            if !ok { close(fd); return }
            let t = Thread { [self] in
                serve(fd)
                state.withLock { s in
                    _ = s.openFDs.remove(fd)
                    close(fd)
                }
            }
            t.name = "mock-providers-conn"
            t.start()
        }
    }

    private func serve(_ fd: Int32) {
        guard let ssl = SSL_new(ctx) else { return }
        defer { SSL_free(ssl) }
        SSL_set_fd(ssl, fd)
        guard SSL_accept(ssl) == 1 else { ERR_clear_error(); return }
        var proto: UnsafePointer<UInt8>? = nil
        var protoLength: UInt32 = 0
        SSL_get0_alpn_selected(ssl, &proto, &protoLength)
        if let proto, protoLength == 2, proto[0] == UInt8(ascii: "h"), proto[1] == UInt8(ascii: "2") {
            H2Session(server: self, ssl: ssl).run()
        } else {
            serveHTTP1(ssl)
        }
        SSL_shutdown(ssl)
    }

    // MARK: HTTP/1.1 (token endpoint, webhooks)

    private func serveHTTP1(_ ssl: OpaquePointer) {
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            // Headers.
            var headerEnd: Int?
            while headerEnd == nil {
                if let r = buffer.firstRange(of: [13, 10, 13, 10]) { headerEnd = r.upperBound; break }
                let n = SSL_read(ssl, &chunk, Int32(chunk.count))
                if n <= 0 { return }
                buffer.append(contentsOf: chunk[0..<Int(n)])
            }
            guard let end = headerEnd else { return }
            let head = String(decoding: buffer[0..<end], as: UTF8.self)
            var lines = head.components(separatedBy: "\r\n")
            let requestLine = lines.removeFirst().split(separator: " ")
            guard requestLine.count >= 2 else { return }
            var headers: [String: String] = [:]
            for line in lines {
                guard let colon = line.firstIndex(of: ":") else { continue }
                headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                    in: .whitespaces)
            }
            let length = Int(headers["content-length"] ?? "0") ?? 0
            while buffer.count < end + length {
                let n = SSL_read(ssl, &chunk, Int32(chunk.count))
                if n <= 0 { return }
                buffer.append(contentsOf: chunk[0..<Int(n)])
            }
            let body = Array(buffer[end..<(end + length)])
            buffer.removeFirst(end + length)
            let path = String(requestLine[1])
            let (status, extra, answerBody) = handleHTTP1(
                method: String(requestLine[0]), path: path, headers: headers, body: body)
            var out = "HTTP/1.1 \(status) \(status == 200 ? "OK" : "Error")\r\nContent-Type: application/json\r\n"
            for (k, v) in extra { out += "\(k): \(v)\r\n" }
            out += "Content-Length: \(answerBody.count)\r\n\r\n"
            let bytes = Array(out.utf8) + answerBody
            if SSL_write(ssl, bytes, Int32(bytes.count)) <= 0 { return }
            if headers["connection"]?.lowercased() == "close" { return }
        }
    }

    func handleHTTP1(
        method: String, path: String, headers: [String: String], body: [UInt8]
    ) -> (Int, [(String, String)], [UInt8]) {
        if path == "/token" {
            let (status, json, reason) = tokenAnswer(body)
            record(
                MockAnswer(endpoint: .token, status: status, reason: reason, target: "", body: body, authorization: nil)
            )
            return (status, [], Array(json.utf8))
        }
        if path.hasPrefix("/wp/") {
            // Web Push over HTTP/1.1 (MockWebPush.swift): the answer is recorded there.
            let (status, reason) = webPushAnswer(path: path, headers: headers, body: body)
            return (
                status, [],
                status == 201 ? [] : Array(#"{"reason":"\#(reason.replacingOccurrences(of: "\"", with: "'"))"}"#.utf8)
            )
        }
        if path.hasPrefix("/webhook/") {
            let name = String(path.dropFirst("/webhook/".count))
            let auth = headers["authorization"]
            if let need = configuration.webhookAuth {
                let expected = "Basic " + Data("\(need.user):\(need.password)".utf8).base64EncodedString()
                guard auth == expected else {
                    record(
                        MockAnswer(
                            endpoint: .webhook, status: 401, reason: "Unauthorized", target: name, body: body,
                            authorization: auth))
                    return (401, [], Array(#"{"message":"Unauthorized"}"#.utf8))
                }
            }
            guard method == "POST", (try? JSONSerialization.jsonObject(with: Data(body))) is [String: Any] else {
                record(
                    MockAnswer(
                        endpoint: .webhook, status: 400, reason: "not a JSON object", target: name, body: body,
                        authorization: auth))
                return (400, [], Array(#"{"message":"expected a JSON object"}"#.utf8))
            }
            let fault = state.withLock { s -> MockFault? in
                if var named = s.namedWebhookFaults[name], !named.isEmpty {
                    let f = named.removeFirst()
                    s.namedWebhookFaults[name] = named
                    return f
                }
                return s.webhookFaults.isEmpty ? nil : s.webhookFaults.removeFirst()
            }
            if let fault {
                if fault.delay > .zero {
                    Thread.sleep(
                        forTimeInterval: Double(fault.delay.components.seconds) + Double(
                            fault.delay.components.attoseconds) / 1e18)
                }
                record(
                    MockAnswer(
                        endpoint: .webhook, status: fault.status, reason: "fault", target: name, body: body,
                        authorization: auth))
                return (fault.status, fault.retryAfter.map { [("Retry-After", String($0))] } ?? [], Array("{}".utf8))
            }
            record(
                MockAnswer(endpoint: .webhook, status: 200, reason: "", target: name, body: body, authorization: auth))
            return (200, [], Array(#"{"ok":true}"#.utf8))
        }
        if path == "/translate" || path.hasPrefix("/translate?") {
            return translateAnswer(method: method, headers: headers, body: body)
        }
        return (404, [], Array(#"{"error":"not_found"}"#.utf8))
    }

    // MARK: LibreTranslate

    /// The languages `/translate` knows (LibreTranslate's codes); `auto` is a source too.
    public static let translateLanguages: Set<String> = [
        "ar", "de", "en", "es", "fr", "hi", "it", "ja", "ko", "nl", "pl", "pt", "ru", "sv", "tr", "uk", "zh",
    ]

    /// The stand-in's own translations: (text, target) -> text. Anything else is answered `[<target>] <text>`, so a
    /// test or the demo can always tell a translated push.
    public static let translateDictionary: [String: [String: String]] = [
        "@u5 are you coming?": ["fr": "@u5 tu viens ?", "de": "@u5 kommst du?"],
        "Bye!": ["fr": "Au revoir !", "de": "Tschüss!", "es": "¡Adiós!"],
        "Good night": ["fr": "Bonne nuit", "de": "Gute Nacht", "es": "Buenas noches"],
        "See you at the trailhead at 7!": [
            "fr": "On se retrouve au départ du sentier à 7 h !", "de": "Wir sehen uns um 7 am Ausgangspunkt!",
        ],
        "The trail is closed today": ["fr": "Le sentier est fermé aujourd'hui", "de": "Der Weg ist heute gesperrt"],
    ]

    /// What the stand-in answers for `text` into `target`.
    public static func translation(_ text: String, target: String) -> String {
        translateDictionary[text]?[target] ?? "[\(target)] \(text)"
    }

    /// LibreTranslate's `POST /translate`: a JSON object with `q` (a string, or a list of strings), `source` (a
    /// language or `auto`), `target`, optional `format` (`text`, `html`) and `api_key`. Checked as LibreTranslate
    /// checks it: 403 `Invalid API key` when a key is required and not the one given; 400 with `error` for a body
    /// that is not a JSON object, a missing or empty `q`, `source` or `target`, an unknown language or format; 405 for
    /// another method. Answers `{"translatedText": ...}` (and `detectedLanguage` for `auto`, as English).
    func translateAnswer(method: String, headers: [String: String], body: [UInt8]) -> (Int, [(String, String)], [UInt8])
    {
        func answer(
            _ status: Int, _ json: [String: Any], target: String, reason: String
        ) -> (
            Int, [(String, String)], [UInt8]
        ) {
            let bytes =
                (try? JSONSerialization.data(withJSONObject: json, options: [.sortedKeys])).map { Array($0) }
                ?? Array("{}".utf8)
            record(
                MockAnswer(
                    endpoint: .translate, status: status, reason: reason, target: target, body: body,
                    authorization: headers["authorization"], answer: bytes))
            return (status, [], bytes)
        }
        func invalid(_ message: String, target: String = "") -> (Int, [(String, String)], [UInt8]) {
            answer(400, ["error": message], target: target, reason: message)
        }
        guard method == "POST" else {
            return answer(405, ["error": "Method Not Allowed"], target: "", reason: "method")
        }
        guard headers["content-type"]?.lowercased().hasPrefix("application/json") == true,
            let request = (try? JSONSerialization.jsonObject(with: Data(body))) as? [String: Any]
        else { return invalid("Invalid request: expected a JSON object (Content-Type: application/json)") }
        if let required = configuration.translateAPIKey {
            guard request["api_key"] as? String == required else {
                return answer(403, ["error": "Invalid API key"], target: "", reason: "Invalid API key")
            }
        }
        let texts: [String]
        let batch: Bool
        if let q = request["q"] as? String, !q.isEmpty {
            texts = [q]
            batch = false
        } else if let q = request["q"] as? [String], !q.isEmpty, q.allSatisfy({ !$0.isEmpty }) {
            texts = q
            batch = true
        } else {
            return invalid("Invalid request: missing q parameter")
        }
        guard let source = request["source"] as? String, !source.isEmpty else {
            return invalid("Invalid request: missing source parameter")
        }
        guard let target = request["target"] as? String, !target.isEmpty else {
            return invalid("Invalid request: missing target parameter")
        }
        guard source == "auto" || Self.translateLanguages.contains(source) else {
            return invalid("\(source) is not supported", target: target)
        }
        guard Self.translateLanguages.contains(target) else {
            return invalid("\(target) is not supported", target: target)
        }
        if let format = request["format"] {
            guard let f = format as? String, f == "text" || f == "html" else {
                return invalid("Invalid request: format must be text or html", target: target)
            }
        }
        let fault = state.withLock { s in s.translateFaults.isEmpty ? nil : s.translateFaults.removeFirst() }
        let delay = fault?.delay ?? configuration.translateDelay
        if delay > .zero {
            Thread.sleep(
                forTimeInterval: Double(delay.components.seconds) + Double(delay.components.attoseconds) / 1e18)
        }
        if let fault, fault.status != 200 {
            return answer(fault.status, ["error": "injected fault"], target: target, reason: "fault")
        }
        let translated = texts.map { Self.translation($0, target: target) }
        var json: [String: Any] = ["translatedText": batch ? translated as Any : translated[0] as Any]
        if source == "auto" {
            let detected: [String: Any] = ["confidence": 90.0, "language": "en"]
            json["detectedLanguage"] = batch ? texts.map { _ in detected } as Any : detected as Any
        }
        return answer(200, json, target: target, reason: "")
    }

    /// The token endpoint: checks the JWT-bearer assertion (RS256 signature against the service
    /// account's public key, iss, aud, scope, iat/exp) and issues an access token.
    func tokenAnswer(_ body: [UInt8]) -> (Int, String, String) {
        func fail(_ error: String, _ description: String) -> (Int, String, String) {
            (400, #"{"error":"\#(error)","error_description":"\#(description)"}"#, error)
        }
        var form: [String: String] = [:]
        for pair in String(decoding: body, as: UTF8.self).split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1)
            if kv.count == 2 { form[String(kv[0])] = String(kv[1]).removingPercentEncoding ?? String(kv[1]) }
        }
        guard form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer" else {
            return fail("unsupported_grant_type", "expected jwt-bearer")
        }
        guard let assertion = form["assertion"] else { return fail("invalid_request", "no assertion") }
        let parts = assertion.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 3, let headerBytes = Self.base64URLDecode(parts[0]),
            let claimBytes = Self.base64URLDecode(parts[1]),
            let signature = Self.base64URLDecode(parts[2]),
            let header = try? JSONSerialization.jsonObject(with: Data(headerBytes)) as? [String: Any],
            let claims = try? JSONSerialization.jsonObject(with: Data(claimBytes)) as? [String: Any]
        else {
            return fail("invalid_grant", "malformed assertion")
        }
        guard header["alg"] as? String == "RS256" else { return fail("invalid_grant", "alg is not RS256") }
        guard verifyRS256(Array((parts[0] + "." + parts[1]).utf8), signature) else {
            return fail("invalid_grant", "Invalid JWT Signature.")
        }
        let now = Int64(Date().timeIntervalSince1970)
        guard claims["iss"] as? String == configuration.clientEmail else {
            return fail("invalid_grant", "unknown issuer")
        }
        guard
            claims["aud"] as? String == "https://\(configuration.host):\(port)/token"
                || (claims["aud"] as? String)?.hasSuffix("/token") == true
        else {
            return fail("invalid_grant", "wrong audience")
        }
        guard
            (claims["scope"] as? String)?.split(separator: " ").contains(
                "https://www.googleapis.com/auth/firebase.messaging") == true
        else {
            return fail("invalid_scope", "firebase.messaging scope missing")
        }
        guard let iat = (claims["iat"] as? NSNumber)?.int64Value, let exp = (claims["exp"] as? NSNumber)?.int64Value,
            iat <= now + 60, exp > now, exp - iat <= 3600
        else {
            return fail(
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.")
        }
        let token = issueToken(
            project: configuration.projectID, lifetime: TimeInterval(configuration.accessTokenLifetime))
        return (
            200,
            #"{"access_token":"\#(token)","expires_in":\#(configuration.accessTokenLifetime),"token_type":"Bearer"}"#,
            ""
        )
    }

    func verifyRS256(_ data: [UInt8], _ signature: [UInt8]) -> Bool {
        guard let md = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(md) }
        guard EVP_DigestVerifyInit(md, nil, EVP_sha256(), nil, publicKey) == 1 else { ERR_clear_error(); return false }
        let ok = EVP_DigestVerify(md, signature, signature.count, data, data.count) == 1
        ERR_clear_error()
        return ok
    }

    static func base64URLDecode(_ s: String) -> [UInt8]? {
        var t = s.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while t.count % 4 != 0 { t += "=" }
        return Data(base64Encoded: t).map { Array($0) }
    }

    // MARK: messages:send

    /// Validates and answers one messages:send request: (status, body, reason, retry-after).
    func sendAnswer(path: String, authorization: String?, body: [UInt8]) -> (Int, String, String, Int?) {
        func error(
            _ status: Int, _ name: String, _ code: String?, _ message: String, field: String? = nil
        ) -> (Int, String, String, Int?) {
            var details: [String] = []
            if let code {
                details.append(
                    #"{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"\#(code)"}"#)
            }
            if let field {
                details.append(
                    #"{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"\#(field)","description":"\#(message)"}]}"#
                )
            }
            return (
                status,
                #"{"error":{"code":\#(status),"message":"\#(message)","status":"\#(name)","details":[\#(details.joined(separator: ","))]}}"#,
                code ?? name, nil
            )
        }
        let prefix = "/v1/projects/", suffix = "/messages:send"
        guard path.hasPrefix(prefix), path.hasSuffix(suffix) else {
            return error(404, "NOT_FOUND", nil, "no such method")
        }
        let project = String(path.dropFirst(prefix.count).dropLast(suffix.count))
        // Authentication: an issued, unexpired token for this project.
        guard let auth = authorization, auth.lowercased().hasPrefix("bearer ") else {
            return error(401, "UNAUTHENTICATED", nil, "Request is missing required authentication credential.")
        }
        let token = String(auth.dropFirst(7))
        let grant = state.withLock { s in s.issued[token] }
        guard let grant, grant.expires > Date() else {
            return error(401, "UNAUTHENTICATED", nil, "Request had invalid authentication credentials.")
        }
        guard grant.project == project, project == configuration.projectID else {
            return error(403, "PERMISSION_DENIED", nil, "Permission denied for project \(project).")
        }
        // Schema.
        guard body.count <= 4096 + 512 else {
            return error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Message is too big")
        }
        guard let root = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any],
            let message = root["message"] as? [String: Any]
        else {
            return error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Invalid JSON payload received.")
        }
        guard let regToken = message["token"] as? String else {
            return error(
                400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Recipient of the message is not set.", field: "message")
        }
        guard !regToken.isEmpty, regToken.count <= 4096,
            regToken.unicodeScalars.allSatisfy({
                CharacterSet.alphanumerics.contains($0) || "-_:".unicodeScalars.contains($0)
            })
        else {
            return error(
                400, "INVALID_ARGUMENT", "INVALID_ARGUMENT",
                "The registration token is not a valid FCM registration token",
                field: "message.token")
        }
        let allowed: Set<String> = [
            "token", "notification", "data", "android", "apns", "webpush", "fcm_options", "name",
        ]
        if let extra = message.keys.first(where: { !allowed.contains($0) }) {
            return error(
                400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Unknown name \\\"\(extra)\\\" at 'message'",
                field: "message")
        }
        if let data = message["data"] {
            guard let d = data as? [String: Any] else {
                return error(
                    400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Invalid value at 'message.data'",
                    field: "message.data")
            }
            for (k, v) in d where !(v is String) {
                return error(
                    400, "INVALID_ARGUMENT", "INVALID_ARGUMENT",
                    "Invalid value at 'message.data[\(k)].value' (TYPE_STRING)",
                    field: "message.data[\(k)].value")
            }
        }
        if let n = message["notification"] {
            guard let o = n as? [String: Any], o.values.allSatisfy({ $0 is String }) else {
                return error(
                    400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Invalid value at 'message.notification'",
                    field: "message.notification")
            }
        }
        if let a = message["android"] {
            guard let o = a as? [String: Any] else {
                return error(
                    400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Invalid value at 'message.android'",
                    field: "message.android")
            }
            if let p = o["priority"], !(p as? String == "high" || p as? String == "normal") {
                return error(
                    400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Invalid value at 'message.android.priority'",
                    field: "message.android.priority")
            }
            if let ttl = o["ttl"] {
                guard let t = ttl as? String, t.hasSuffix("s"), Double(t.dropLast()) != nil else {
                    return error(
                        400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Invalid value at 'message.android.ttl'",
                        field: "message.android.ttl")
                }
            }
        }
        // The payload limit (data + notification).
        let payloadSize =
            ((try? JSONSerialization.data(withJSONObject: message["data"] ?? [String: Any]()))?.count ?? 0)
            + ((try? JSONSerialization.data(withJSONObject: message["notification"] ?? [String: Any]()))?.count ?? 0)
        if payloadSize > 4096 { return error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "Message is too big") }
        // Faults, then per-token answers.
        if let fault = state.withLock({ s in s.sendFaults.isEmpty ? nil : s.sendFaults.removeFirst() }) {
            let name: String
            switch fault.status {
            case 404: name = "NOT_FOUND"
            case 429: name = "RESOURCE_EXHAUSTED"
            case 500: name = "INTERNAL"
            case 503: name = "UNAVAILABLE"
            case 401: name = "UNAUTHENTICATED"
            case 403: name = "PERMISSION_DENIED"
            default: name = "INVALID_ARGUMENT"
            }
            var e = error(fault.status, name, fault.errorCode, "injected fault")
            e.3 = fault.retryAfter
            return e
        }
        if configuration.unregisteredTokens.contains(regToken) {
            return error(404, "NOT_FOUND", "UNREGISTERED", "Requested entity was not found.")
        }
        if configuration.foreignTokens.contains(regToken) {
            return error(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH", "SenderId mismatch")
        }
        let id = state.withLock { s in s.answers.count + 1 }
        return (200, #"{"name":"projects/\#(project)/messages/\#(id)"}"#, "", nil)
    }
}
