// The stand-ins end on SIGTERM by themselves, with exit status 0, as scripts/local-stack.sh and the test stacks
// expect: a stand-in that needs SIGKILL makes every stack's stop wait for its grace period.
import Foundation
import HeraldTestSupport
import Testing

@Suite("Stand-ins stop on SIGTERM")
struct StandInShutdownTests {
    /// A directory with the stand-ins' TLS certificate and key and an RSA service-account key.
    static func material() throws -> String {
        let dir = NSTemporaryDirectory() + "herald-standin-stop-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try runToolChecked(
            "openssl",
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "key.pem",
                "-out", "cert.pem", "-subj", "/CN=localhost", "-days", "2",
            ], cwd: dir)
        try runToolChecked(
            "openssl", ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key"], cwd: dir
        )
        return dir
    }

    static func arguments(_ standIn: String, _ dir: String) -> [String] {
        let common = ["--port", "0", "--port-file", dir + "/\(standIn).port", "--cert", dir + "/cert.pem"]
        switch standIn {
        case "herald-mock-fcm":
            return common + [
                "--key", dir + "/key.pem", "--project", "p", "--client-email", "sa@p.iam.gserviceaccount.com",
                "--service-public-key", dir + "/sa.key", "--record", dir + "/fcm.jsonl",
            ]
        default:
            return common + ["--key", dir + "/key.pem", "--record", dir + "/apns.jsonl"]
        }
    }

    @Test(
        "a stand-in that was listening exits 0 on SIGTERM without being killed",
        arguments: ["herald-mock-fcm", "herald-mock-apns"])
    func stopsOnSigterm(standIn: String) async throws {
        let dir = try Self.material()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let child = ChildProcess(
            name: standIn, executable: try Paths.executable(standIn), arguments: Self.arguments(standIn, dir),
            logPath: dir + "/\(standIn).log")
        try child.start()
        defer { child.killNow() }
        try await waitUntil("\(standIn) listening: \(child.logTail())", timeout: .seconds(60)) {
            FileManager.default.fileExists(atPath: dir + "/\(standIn).port")
        }
        // `stop` sends SIGTERM and answers nil only when it had to fall back to SIGKILL. The grace is long so that
        // a loaded machine cannot fail the test; a stand-in that ignores SIGTERM fails it.
        let status = await child.stop(grace: .seconds(60))
        #expect(status == 0, "\(standIn) did not end by itself on SIGTERM: \(child.logTail())")
    }
}
