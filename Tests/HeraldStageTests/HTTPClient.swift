import Foundation
import HeraldTestSupport

/// A minimal HTTP/1.1 GET over a raw TCP socket (no URLSession), run off the cooperative pool: HeraldTestSupport's
/// `TestHTTP`, plus an idle connection for the shutdown tests.
enum RawHTTP {
    typealias Answer = TestHTTP.Answer

    static func get(port: Int, path: String) async throws -> Answer {
        try await TestHTTP.request(port: port, method: "GET", path: path)
    }

    /// Connects and sends nothing, like a scraper's idle keep-alive connection. The caller closes the descriptor.
    static func openIdleConnection(port: Int) throws -> Int32 {
        try TestHTTP.connectLoopback(port: port)
    }
}
