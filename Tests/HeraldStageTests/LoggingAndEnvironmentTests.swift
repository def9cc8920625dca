import Foundation
import HeraldCore
import HeraldStage
import Logging
import Testing

final class CapturingSink: LogSink, @unchecked Sendable {
    // @unchecked Sendable: `stored` is only accessed under `lock`.
    private let lock = NSLock()
    private var stored: [String] = []
    func write(line: String) { lock.lock(); stored.append(line); lock.unlock() }
    var lines: [String] { lock.lock(); defer { lock.unlock() }; return stored }
}

@Suite("JSON logs")
struct JSONLogTests {
    static let token = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"

    @Test("each line is one JSON object with ts, level, label, message and metadata")
    func lineIsJSON() throws {
        let sink = CapturingSink()
        var logger = Logger(label: "herald.send") { JSONLogHandler(label: $0, level: .debug, sink: sink) }
        logger[metadataKey: LogKey.stage] = "send"
        logger.info(
            "sent \"quoted\"\nnext line",
            metadata: [
                LogKey.eventId: "e-1", LogKey.partition: .stringConvertible(3),
                "nested": ["list": ["a", "b"]],
            ])
        logger.trace("below the level: not written")

        #expect(sink.lines.count == 1)
        let line = try #require(sink.lines.first)
        #expect(!line.contains("\n"))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["level"] as? String == "info")
        #expect(object["label"] as? String == "herald.send")
        #expect(object["message"] as? String == "sent \"quoted\"\nnext line")
        let ts = try #require(object["ts"] as? String)
        #expect(try Date(ts, strategy: .iso8601.year().month().day().time(includingFractionalSeconds: true)) <= Date())
        let metadata = try #require(object["metadata"] as? [String: Any])
        #expect(metadata[LogKey.stage] as? String == "send")
        #expect(metadata[LogKey.eventId] as? String == "e-1")
        #expect(metadata[LogKey.partition] as? String == "3")
        #expect((metadata["nested"] as? [String: Any])?["list"] as? [String] == ["a", "b"])
    }

    @Test("tokens are cut to 8 characters, message text and secrets are never written")
    func redaction() throws {
        #expect(redactToken(Self.token) == "a1b2c3d4…")
        let sink = CapturingSink()
        let logger = Logger(label: "herald.send") { JSONLogHandler(label: $0, sink: sink) }
        logger.warning(
            "dead token",
            metadata: [
                LogKey.token: .string(Self.token), "text": "Bye, see you at 8", "password": "hunter2",
                "context": ["device_token": .string(Self.token)],
            ])
        let line = try #require(sink.lines.first)
        #expect(!line.contains(Self.token))
        #expect(!line.contains("Bye, see you"))
        #expect(!line.contains("hunter2"))
        let metadata = try #require(
            (try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["metadata"] as? [String: Any])
        #expect(metadata[LogKey.token] as? String == "a1b2c3d4…")
        #expect(metadata["text"] as? String == "[redacted]")
        #expect((metadata["context"] as? [String: String])?["device_token"] == "a1b2c3d4…")
    }

    @Test("control characters are escaped so a line stays valid JSON")
    func controlCharacters() throws {
        let line = JSONLogHandler.line(
            ts: Date(timeIntervalSince1970: 0), level: .error, label: "l",
            message: "a\u{0}b\u{1b}c\u{2028}d\\", metadata: [:])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["message"] as? String == "a\u{0}b\u{1b}c\u{2028}d\\")
        #expect(object["ts"] as? String == "1970-01-01T00:00:00.000Z")
        #expect(object["metadata"] == nil)
    }
}

@Suite("Environment binding")
struct EnvironmentTests {
    @Test("defaults apply when nothing is set (the metrics endpoint binds to loopback unless configured)")
    func defaults() throws {
        let environment = try StageEnvironment(environment: [:])
        #expect(environment.pipelineFile == "pipelines/example.yaml")
        #expect(environment.kafkaBrokers == "127.0.0.1:9092")
        #expect(environment.redisURL == "redis://127.0.0.1:6379")
        #expect(environment.metricsHost == "127.0.0.1")
        #expect(environment.metricsPort == 9100)
        #expect(environment.shutdownDeadline == .milliseconds(25_000))
        #expect(environment.logLevel == .info)
        #expect(!environment.instance.isEmpty)
        #expect(environment.warnings.isEmpty)
        for key in ConfigKey.all {
            #expect(key.name.hasPrefix("HERALD_"))
        }
    }

    @Test("values override defaults; empty values count as unset")
    func overrides() throws {
        let environment = try StageEnvironment(environment: [
            "HERALD_PIPELINE": "/etc/herald/p.yaml", "HERALD_KAFKA_BROKERS": "k1:9092,k2:9092",
            "HERALD_REDIS_URL": "redis://r:6380/1", "HERALD_METRICS_PORT": "0", "HERALD_SHUTDOWN_DEADLINE_MS": "1500",
            "HERALD_LOG_LEVEL": "DEBUG", "HERALD_INSTANCE": "send-7", "HERALD_METRICS_HOST": "",
        ])
        #expect(environment.pipelineFile == "/etc/herald/p.yaml")
        #expect(environment.kafkaBrokers == "k1:9092,k2:9092")
        #expect(environment.redisURL == "redis://r:6380/1")
        #expect(environment.metricsPort == 0)
        #expect(environment.shutdownDeadline == .milliseconds(1500))
        #expect(environment.logLevel == .debug)
        #expect(environment.instance == "send-7")
        #expect(environment.metricsHost == "127.0.0.1")
    }

    @Test("unknown HERALD_* keys are warned about; other variables and declared extra keys are not")
    func unknownKeys() throws {
        let environment = try StageEnvironment(
            environment: [
                "HERALD_REDIS_ULR": "redis://typo", "HERALD_SEND_CONCURRENCY": "8", "PATH": "/bin", "HOME": "/root",
                "HERALD_STAGE_ENDPOINTS": "http://127.0.0.1:9101",
            ],
            extraKnownKeys: ["HERALD_SEND_CONCURRENCY"])
        #expect(environment.warnings.count == 1)
        #expect(environment.warnings.first?.contains("HERALD_REDIS_ULR") == true)
        #expect(environment.redisURL == "redis://127.0.0.1:6379")
    }

    @Test(
        "bad values are errors naming the key",
        arguments: [
            ("HERALD_METRICS_PORT", "http"), ("HERALD_METRICS_PORT", "70000"),
            ("HERALD_SHUTDOWN_DEADLINE_MS", "-1"), ("HERALD_LOG_LEVEL", "loud"),
        ])
    func badValues(key: String, value: String) {
        #expect {
            try StageEnvironment(environment: [key: value])
        } throws: { error in
            (error as? ConfigurationError)?.key == key
        }
    }
}

@Suite("Key files")
struct KeyFileTests {
    @Test("a key file readable by group or others gets a warning; one only its owner reads does not")
    func exposure() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "herald-keys-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let key = directory.appendingPathComponent("AuthKey.p8").path
        try Data("-----BEGIN PRIVATE KEY-----\n".utf8).write(to: URL(fileURLWithPath: key))
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: key)
        #expect(KeyFiles.exposureWarning(path: key) == nil)
        for mode in [0o640, 0o644, 0o604] {
            try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: key)
            let warning = try #require(KeyFiles.exposureWarning(path: key))
            #expect(warning.contains(key) && warning.contains("chmod 600") && warning.contains(String(mode, radix: 8)))
        }
        // A Kubernetes secret volume for a pod running as 65532 with fsGroup 1234: root's file, the pod's group.
        try FileManager.default.setAttributes(
            [.posixPermissions: 0o440, .ownerAccountID: 0, .groupOwnerAccountID: 1234], ofItemAtPath: key)
        #expect(KeyFiles.exposureWarning(path: key, processUID: 65532, processGroups: [65532, 1234]) == nil)
        #expect(
            KeyFiles.exposureWarning(path: key, processUID: 65532, processGroups: [65532]) != nil,
            "a group the process is not in")
        #expect(KeyFiles.exposureWarning(path: key, processUID: 0, processGroups: [1234]) != nil, "root needs none")
        try FileManager.default.setAttributes([.posixPermissions: 0o444], ofItemAtPath: key)
        #expect(
            KeyFiles.exposureWarning(path: key, processUID: 65532, processGroups: [1234]) != nil, "others can read")
        #expect(KeyFiles.exposureWarning(path: directory.appendingPathComponent("missing.p8").path) == nil)
        let credential = APNsCredential(bundleID: "b", teamID: "T", keyID: "K", keyFile: key)
        #expect(KeyFiles.paths(of: credential) == [key])
    }

    /// A Kubernetes secret volume: `/secrets/AuthKey.p8` -> `..data/AuthKey.p8` -> `..2026_x/AuthKey.p8`.
    @Test("the mode checked is the file's a link leads to, not the link's (Kubernetes secret volumes)")
    func linksAreFollowed() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "herald-keys-\(UUID().uuidString)")
        let versioned = directory.appendingPathComponent("..2026_01_01_00_00_00.1")
        try FileManager.default.createDirectory(at: versioned, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = versioned.appendingPathComponent("AuthKey.p8").path
        try Data("-----BEGIN PRIVATE KEY-----\n".utf8).write(to: URL(fileURLWithPath: file))
        try FileManager.default.createSymbolicLink(
            atPath: directory.appendingPathComponent("..data").path, withDestinationPath: versioned.lastPathComponent)
        let key = directory.appendingPathComponent("AuthKey.p8").path
        try FileManager.default.createSymbolicLink(atPath: key, withDestinationPath: "..data/AuthKey.p8")

        try FileManager.default.setAttributes([.posixPermissions: 0o400], ofItemAtPath: file)
        #expect(KeyFiles.exposureWarning(path: key) == nil, "a 0400 secret behind links is private")
        try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: file)
        let warning = try #require(KeyFiles.exposureWarning(path: key))
        #expect(warning.contains(key) && warning.contains("644"))
    }

    @Test("an app's key files include its FCM service accounts; each exposed one is warned about")
    func serviceAccountsAreKeyFiles() throws {
        let app = AppConfig(
            appID: "chat", credentials: [APNsCredential(bundleID: "b", teamID: "T", keyID: "K", keyFile: "/k/a.p8")],
            fcmCredentials: [
                FCMCredential(providerID: "fcm-1", serviceAccountFile: "/k/sa-1.json"),
                FCMCredential(providerID: "fcm-2", serviceAccountFile: "/k/sa-2.json"),
            ])
        #expect(KeyFiles.paths(of: app) == ["/k/a.p8", "/k/sa-1.json", "/k/sa-2.json"])
    }
}
