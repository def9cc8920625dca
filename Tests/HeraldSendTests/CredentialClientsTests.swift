import HeraldCore
import HeraldPushProviders
import HeraldSend
import HeraldTestSupport
import Synchronization
import Testing

/// A provider client that sends nothing and counts its shutdowns.
final class FakeClient: CredentialClient, Sendable {
    let name: String
    private let shutdowns = Mutex(0)

    init(_ name: String) { self.name = name }

    func submit(_ requests: [PushDelivery], onComplete: @escaping @Sendable (PushResponse) -> Void) async {}
    func shutdown(grace: Duration) async { shutdowns.withLock { $0 += 1 } }
    var isShutDown: Bool { shutdowns.withLock { $0 > 0 } }
}

/// A credential of the fake provider: its key, its settings (the fingerprint) and whether it loads.
struct FakeCredential: Sendable {
    var key: String
    var settings: String
    var loads = true
}

struct Unloadable: Error {}

@Suite("A client per credential, kept across reloads")
struct CredentialClientsTests {
    typealias Clients = CredentialClients<String, FakeClient>

    static func entries(_ credentials: [FakeCredential]) -> [(String, String, FakeCredential)] {
        credentials.map { ($0.key, "app1", $0) }
    }
    static func fingerprint(_ credential: FakeCredential) -> [UInt8] { Array(credential.settings.utf8) }
    static func make(_ app: String, _ credential: FakeCredential) throws -> FakeClient {
        guard credential.loads else { throw Unloadable() }
        return FakeClient(credential.key + ":" + credential.settings)
    }

    @Test("a credential that does not load is reported and left out; the others get their client")
    func unusableLeftOut() {
        let reported = Mutex<[String]>([])
        let clients = Clients(
            Self.entries([
                FakeCredential(key: "a", settings: "1"), FakeCredential(key: "b", settings: "1", loads: false),
            ]),
            fingerprint: Self.fingerprint, make: Self.make
        ) { _, credential, _ in reported.withLock { $0.append(credential.key) } }
        #expect(clients.clients.keys.sorted() == ["a"])
        #expect(reported.withLock { $0 } == ["b"])
    }

    @Test("a reload keeps an unchanged credential's client, replaces a changed one and retires a removed one")
    func reloadKeepsUnchanged() throws {
        let before = Clients(
            Self.entries([
                FakeCredential(key: "a", settings: "1"), FakeCredential(key: "b", settings: "1"),
                FakeCredential(key: "c", settings: "1"),
            ]),
            fingerprint: Self.fingerprint, make: Self.make, unusable: { _, _, _ in })
        let (after, created) = try before.reloaded(
            Self.entries([
                FakeCredential(key: "a", settings: "1"), FakeCredential(key: "b", settings: "2"),
                FakeCredential(key: "d", settings: "1"),
            ]),
            fingerprint: Self.fingerprint, make: Self.make)
        #expect(after.clients["a"] === before.clients["a"])
        #expect(after.clients["b"] !== before.clients["b"] && after.clients["b"]?.name == "b:2")
        #expect(Set(created.map(\.name)) == ["b:2", "d:1"])
        #expect(Set(before.retired(by: after).map(\.name)) == ["b:1", "c:1"])
    }

    @Test("a reload with a credential that does not load throws and closes what it made; the old clients stay")
    func refusedReload() async throws {
        let before = Clients(
            Self.entries([FakeCredential(key: "a", settings: "1")]), fingerprint: Self.fingerprint, make: Self.make,
            unusable: { _, _, _ in })
        let made = Mutex<[FakeClient]>([])
        #expect(throws: Unloadable.self) {
            _ = try before.reloaded(
                Self.entries([
                    FakeCredential(key: "n", settings: "1"), FakeCredential(key: "a", settings: "2", loads: false),
                ]),
                fingerprint: Self.fingerprint
            ) { app, credential in
                let client = try Self.make(app, credential)
                made.withLock { $0.append(client) }
                return client
            }
        }
        let built = made.withLock { $0 }
        #expect(built.map(\.name) == ["n:1"])
        #expect(await eventually(timeout: .seconds(10)) { built.allSatisfy(\.isShutDown) })
        #expect(before.clients["a"]?.isShutDown == false)
    }
}
