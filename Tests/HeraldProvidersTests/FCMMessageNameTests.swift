// FCM's message name for a traced request's span: read from the 200's body for a traced delivery only.

import Foundation
import HeraldCore
import HeraldMockProviders
import HeraldPushProviders
import Testing

@Suite("FCM message names of traced requests", .serialized)
struct FCMMessageNameTests {
    @Test("a traced delivery's response carries the message name FCM answered; an untraced one's does not")
    func messageNameOfTracedDeliveriesOnly() async throws {
        let pki = try ProviderPKI()
        let server = try startStandIn(pki)
        defer { server.stop() }
        let client = try fcmClient(pki, server)
        var traced = try fcmDelivery(regToken(1))
        traced.traced = true
        let named = await client.send(traced)
        let plain = await client.send(try fcmDelivery(regToken(2)))
        await client.shutdown()
        #expect(named.status == 200 && plain.status == 200)
        let name = try #require(named.messageName)
        #expect(name.hasPrefix("projects/") && name.contains("/messages/"))
        #expect(plain.messageName == nil, "an untraced 200 is not parsed")
    }
}
