// The workload options `pipeline` and `stage` share (each keeps its own users and conversation size defaults).
import ArgumentParser
import HeraldBenchSupport

struct WorkloadArguments: ParsableArguments {
    @Option(help: "Fraction of users in Do Not Disturb.") var dnd = 0.1
    @Option(help: "Fraction of users who muted their group.") var muted = 0.1
    @Option(help: "Fraction of users online (their only device is online).") var online = 0.1
    @Option(
        help:
            "Conversations outside the run each user is also in: an unread count in each, a push setting in one in five."
    )
    var otherConversations = 0
    @Option(help: "Payload profile: compact (app1), sendbird (app2), cometchat (app3).") var profile = "compact"
    @Option(name: .customLong("text-bytes"), help: "Message text length.") var textBytes = 60

    func validate() throws {
        if dnd + muted + online > 1 { throw ValidationError("--dnd + --muted + --online must not exceed 1") }
        if otherConversations < 0 { throw ValidationError("--other-conversations must not be negative") }
    }

    /// The workload of `users` in conversations of `conversationSize` with these options.
    func workload(users: Int, conversationSize: Int) -> WorkloadOptions {
        var w = WorkloadOptions()
        w.users = users
        w.conversationSize = conversationSize
        w.dnd = dnd
        w.muted = muted
        w.online = online
        w.otherConversations = otherConversations
        w.profile = profile
        w.textBytes = textBytes
        return w
    }
}
