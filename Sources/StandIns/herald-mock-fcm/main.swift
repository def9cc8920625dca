// herald-mock-fcm: the FCM HTTP v1, custom-webhook, Web Push and LibreTranslate stand-in (tests, demos). One TLS
// port: HTTP/2 for messages:send, HTTP/1.1 for the OAuth2 token endpoint (/token), webhook receivers
// (/webhook/<name>) and the translator (/translate); a Web Push service at /wp/<id> (HTTP/2).
import ArgumentParser
import Foundation
import Glibc
import HeraldMockProviders

@main
struct MockFCM: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-mock-fcm",
        abstract: "FCM HTTP v1 + OAuth2 token endpoint + webhook receiver + LibreTranslate stand-in over TLS.")

    @Option(help: "Address to listen on.") var host = "127.0.0.1"
    @Option(help: "Port (0: the kernel picks; the chosen port is printed).") var port = 0
    @Option(help: "TLS certificate (PEM).") var cert: String
    @Option(help: "TLS private key (PEM).") var key: String
    @Option(help: "Firebase project id served.") var project: String
    @Option(name: .customLong("client-email"), help: "Service account client_email accepted by /token.")
    var clientEmail: String
    @Option(
        name: .customLong("service-public-key"),
        help: "The service account's public key, certificate or private key (PEM).")
    var servicePublicKey: String
    @Option(name: .customLong("token-lifetime"), help: "Seconds an access token lives.") var tokenLifetime = 3600
    @Option(name: .customLong("unregistered"), help: "A registration token answered 404 UNREGISTERED (repeatable).")
    var unregistered: [String] = []
    @Option(name: .customLong("goaway-after"), help: "Send GOAWAY after this many streams per connection (0: never).")
    var goawayAfter = 0
    @Option(name: .customLong("webhook-user"), help: "Basic auth user the webhook receivers require.") var webhookUser:
        String?
    @Option(name: .customLong("webhook-password"), help: "Basic auth password the webhook receivers require.")
    var webhookPassword: String?
    @Option(help: "Append one JSON line per answer to this file.") var record: String?
    @Option(
        name: .customLong("webhook-fault"),
        help: "NAME=STATUS*COUNT: /webhook/NAME answers STATUS to its first COUNT requests (repeatable).")
    var webhookFault: [String] = []
    @Option(
        name: .customLong("webpush-keys"),
        help:
            "Directory of Web Push subscriptions' keys: /wp/ID decrypts with ID.json ({\"private_key\": PEM, \"auth\": base64url}); ID.gone answers 410."
    )
    var webpushKeys: String?
    @Flag(name: .customLong("no-http2"), help: "Offer only HTTP/1.1 in ALPN (a push service without HTTP/2).")
    var noHTTP2 = false
    @Option(name: .customLong("port-file"), help: "Write the bound port to this file once listening.") var portFile:
        String?
    @Option(
        name: .customLong("translate-api-key"),
        help: "The api_key POST /translate (LibreTranslate) requires; 403 without it (default: none required).")
    var translateAPIKey: String?
    @Option(
        name: .customLong("translate-delay-ms"), help: "Hold every /translate answer this long (deadline tests).")
    var translateDelayMs = 0

    func run() throws {
        var c = MockProvidersConfiguration(
            host: host, port: port, certificatePath: cert, privateKeyPath: key,
            projectID: project, clientEmail: clientEmail,
            servicePublicKeyPath: servicePublicKey, accessTokenLifetime: tokenLifetime,
            unregisteredTokens: Set(unregistered), goawayAfterStreams: goawayAfter)
        if let webhookUser { c.webhookAuth = (webhookUser, webhookPassword ?? "") }
        c.recordPath = record
        c.webPushKeyDirectory = webpushKeys
        c.http2 = !noHTTP2
        c.translateAPIKey = translateAPIKey
        c.translateDelay = .milliseconds(max(0, translateDelayMs))
        for spec in webhookFault {
            let parts = spec.split(separator: "=", maxSplits: 1)
            let rhs = parts.count == 2 ? parts[1].split(separator: "*") : []
            guard parts.count == 2, rhs.count == 2, let status = Int(rhs[0]), let count = Int(rhs[1]), count > 0 else {
                throw ValidationError("--webhook-fault: expected NAME=STATUS*COUNT, got \(spec)")
            }
            c.webhookFaultsByName[String(parts[0]), default: []] += Array(
                repeating: MockFault(status: status), count: count)
        }
        // SIGTERM and SIGINT are blocked in every thread (the server's threads inherit the mask) and taken here by
        // sigwait: an ignored signal would be discarded, and a handler would run on whichever thread it hits.
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGTERM)
        sigaddset(&set, SIGINT)
        pthread_sigmask(SIG_BLOCK, &set, nil)
        // Process-wide, once: a write to a connection the client reset fails with EPIPE instead of killing the
        // stand-in with SIGPIPE.
        signal(SIGPIPE, SIG_IGN)
        let server = try MockProvidersServer(configuration: c)
        try server.start()
        FileHandle.standardOutput.write(Data("herald-mock-fcm listening on \(host):\(server.port)\n".utf8))
        if let portFile { try String(server.port).write(toFile: portFile, atomically: true, encoding: .utf8) }
        var signalNumber: Int32 = 0
        while sigwait(&set, &signalNumber) != 0 {}
        // Every answer is already in the record file (written under the server's lock as it is given); the
        // connection threads end when their sockets are shut down, and nothing of theirs needs to outlive this.
        server.stop()
        fflush(nil)
        _exit(0)
    }
}
