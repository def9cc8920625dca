// End to end, cleared on read on FCM and webhooks (docs/behaviour.md §6c): a user reads a conversation on an iPhone;
// the Android phone gets a data-only FCM message and the webhook a `conversation-read` event, the iPhone nothing.
// Runs in the shared "End to end" suite.
import Foundation
import HeraldCore
import HeraldTestSupport
import Testing

extension EndToEndTests {
    @Test("mark_read on the iPhone: a data-only FCM clear to the Android phone, a conversation-read webhook, no APNs")
    func clearedOnReadOverFCMAndWebhook() async throws {
        let iphone = tok(921), android = fcmTok(921), hook = "hook-rc-1"
        try await register("rc-1", ["--token", iphone, "--bundle-id", "com.example.calls"])
        try await register(
            "rc-1", ["--token", android, "--platform", "FCM_ANDROID", "--provider-id", "fcm-provider-1"])
        try await register("rc-1", ["--token", hook, "--kind", "webhook", "--provider-id", "custom-1"])
        let conversation = Scenarios.id("rc-conv")
        func fcmClears() -> [[String: Any]] {
            providerAnswers("send").filter {
                $0["target"] as? String == android && $0["status"] as? Int == 200
                    && ($0["body"] as? String)?.contains(conversation) == true
            }
        }
        func webhookClears() -> [[String: Any]] {
            providerAnswers("webhook").filter {
                ($0["body"] as? String)?.contains(#""uid":"rc-1""#) == true && $0["status"] as? Int == 200
            }
        }
        let apnsBefore = stack.recorded().filter { $0.token == iphone }.count

        let answer = try await stack.api(
            "POST", "/v1/apps/app4/users/rc-1/read",
            body: #"{"conversation": "\#(conversation)", "token": "\#(iphone)"}"#)
        #expect(answer.status == 202, "\(answer.body)")
        let arrived = await eventually(timeout: .seconds(120), interval: .milliseconds(200)) {
            !fcmClears().isEmpty && !webhookClears().isEmpty
        }
        #expect(arrived, "the clear did not reach FCM and the webhook\n\(failureContext())")
        #expect(await stack.awaitIdle(), "the pipeline did not go idle")

        // FCM: one data-only message, normal priority, collapsed per conversation.
        let fcm = fcmClears()
        #expect(fcm.count == 1, "FCM clears: \(fcm.count)")
        let fcmBody = try #require(fcm.first?["body"] as? String)
        let message = try #require(
            (try JSONSerialization.jsonObject(with: Data(fcmBody.utf8)) as? [String: Any])?["message"]
                as? [String: Any], "FCM body \(fcmBody)")
        #expect(message["notification"] == nil, "a clear shows nothing: \(fcmBody)")
        let data = message["data"] as? [String: String] ?? [:]
        #expect(data["type"] == "read" && data["conversation"] == conversation, "data \(data)")
        let androidConfig = message["android"] as? [String: Any] ?? [:]
        #expect(androidConfig["priority"] as? String == "normal", "android \(androidConfig)")
        #expect(androidConfig["collapse_key"] as? String == "r-" + conversation, "android \(androidConfig)")
        #expect((androidConfig["notification"] as? [String: Any]) == nil, "android \(androidConfig)")

        // Webhook: one conversation-read event for the user.
        let hooks = webhookClears()
        #expect(hooks.count == 1, "webhook clears: \(hooks.count)")
        let hookBody = try #require(hooks.first?["body"] as? String)
        let event = try #require(
            try JSONSerialization.jsonObject(with: Data(hookBody.utf8)) as? [String: Any], "webhook body \(hookBody)")
        #expect(event["trigger"] as? String == "conversation-read", "webhook \(hookBody)")
        let hookData = event["data"] as? [String: Any] ?? [:]
        #expect(hookData["type"] as? String == "read", "webhook \(hookBody)")
        #expect(hookData["conversationId"] as? String == conversation, "webhook \(hookBody)")
        #expect((hookData["to"] as? [String: Any])?["uid"] as? String == "rc-1", "webhook \(hookBody)")
        #expect(hookData["readAt"] as? Int != nil, "webhook \(hookBody)")

        // The iPhone read: nothing went to it.
        #expect(
            stack.recorded().filter { $0.token == iphone }.count == apnsBefore, "a clear reached the reading device")
    }
}
