import ArgumentParser
import Foundation
import HeraldCore

/// `heraldctl`: the operator's and the chat team's command-line tool.
/// Each subcommand lives in its own file beside this one.
@main
struct Heraldctl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "heraldctl",
        abstract:
            "Operate Herald: simulate events, push to one device, manage state, inspect the DLQ, show the stages' status.",
        version: HeraldVersion.current,
        subcommands: [
            Simulate.self,
            Push.self,
            Topics.self,
            DeviceCommand.self,
            PrefsCommand.self,
            MembersCommand.self,
            PresenceCommand.self,
            CountsCommand.self,
            StateCommand.self,
            Publish.self,
            DLQCommand.self,
            Explain.self,
            Shards.self,
            Status.self,
            TraceCommand.self,
        ]
    )

    static func main() async {
        // Process-wide, once, before any connection: hiredis and OpenSSL write to sockets with write(2), and a
        // write to a connection the peer reset would raise SIGPIPE and kill the tool. Ignored, the write fails
        // with EPIPE and the command reports a connection error instead.
        signal(SIGPIPE, SIG_IGN)
        await main(nil)
    }
}
