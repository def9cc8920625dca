// The README's day-one path, walked as a newcomer would: the local stack (`scripts/local-stack.sh --up` on free
// ports with the built executables), then the README's own commands, taken from README.md: register a device, set
// preferences and presence, set the conversation's members and read the preferences back with curl; publish the
// first event with the kcat line; read the explain with heraldctl and through the API. Each command's answer must be
// the one the README shows. Only the ports, the run directory and the token's path are replaced.
import Foundation
import HeraldTestSupport
import Testing

@Suite(.serialized) struct DayOneWalkTests {
    static let readme = Paths.packageRoot + "/README.md"

    /// One command of a README code block and the answer shown under it (nil when none is shown).
    struct Step {
        var command: String
        var answer: String?
    }

    /// The commands of the first ```sh block after `heading`, each with the JSON line shown after it.
    static func steps(after heading: String, in text: String) throws -> [Step] {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let start = try #require(lines.firstIndex(of: heading), "README.md has no \(heading)")
        let open = try #require(lines[start...].firstIndex(of: "```sh"), "no sh block after \(heading)")
        let close = try #require(lines[(open + 1)...].firstIndex(of: "```"))
        var steps: [Step] = []
        var continued = false
        for line in lines[(open + 1)..<close] {
            if line.hasPrefix("{") && !continued {
                steps[steps.count - 1].answer = line
            } else if continued || line.hasPrefix(" ") {
                steps[steps.count - 1].command += "\n" + line
            } else {
                steps.append(Step(command: line, answer: nil))
            }
            continued = line.hasSuffix("\\")
        }
        return steps
    }

    /// A README answer against the real one: equal as JSON, where a value written `...` in the README matches any
    /// value and a `...` between fields stands for fields left out.
    static func matches(_ shown: String, _ actual: String) -> Bool {
        func canonical(_ v: Any) -> Data? { try? JSONSerialization.data(withJSONObject: [v], options: .sortedKeys) }
        guard let got = try? JSONSerialization.jsonObject(with: Data(actual.utf8)) as? [String: Any] else {
            return false
        }
        let elided = shown.contains(",...,") || shown.contains("{...,") || shown.contains(",...}")
        var text = shown.replacingOccurrences(of: ":...", with: ":null")
        for gap in [",...,": ",", "{...,": "{", ",...}": "}"] {
            text = text.replacingOccurrences(of: gap.key, with: gap.value)
        }
        guard let want = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            return false
        }
        if !elided && Set(want.keys) != Set(got.keys) { return false }
        for (key, value) in want where !(value is NSNull) {
            guard let other = got[key], canonical(value) == canonical(other) else { return false }
        }
        return true
    }

    /// Ten consecutive ports below the test port allocator's range, none of which accepts connections now.
    static func portBlock() throws -> Int {
        for _ in 0..<200 {
            let base = Int.random(in: 10_000..<14_990)
            if (0..<10).allSatisfy({ !portAcceptsConnections(base + $0) }) { return base }
        }
        throw TestSupportError("no free block of 10 ports")
    }

    @Test("README: register a device, set preferences and members, publish with kcat, read the explain")
    func readmeDayOnePath() async throws {
        let readme = try String(contentsOfFile: Self.readme, encoding: .utf8)
        let registering = try Self.steps(after: "## Registering devices and preferences", in: readme)
        let connecting = try Self.steps(after: "## Connecting your chat back end", in: readme)
        let explaining = readme.components(separatedBy: "\n").filter {
            $0.hasPrefix("heraldctl explain --app app1 --event m-1001")
        }
        #expect(registering.count >= 5, "the registration block: \(registering.map(\.command))")
        let publish = try #require(connecting.first { $0.command.contains("kcat -P") }, "no kcat line")
        let explainLine = try #require(explaining.first, "no heraldctl explain line for m-1001")
        let explainIndex = try #require(
            readme.components(separatedBy: "\n").firstIndex(of: explainLine))
        let explainAnswer = readme.components(separatedBy: "\n")[explainIndex + 1]

        // The local stack, as the README starts it, on ports of its own.
        let run = try temporaryDirectory("herald-day-one")
        // The broker takes three ports from the Kafka port up, and its control API the port 100 above it.
        let ports = (
            redis: try freePort(), kafka: try DevBroker.freeBasePort(), apns: try freePort(), fcm: try freePort()
        )
        let base = try Self.portBlock()
        let environment = [
            "HERALD_LOCAL_BIN": Paths.binDirectory, "HERALD_LOCAL_REDIS_PORT": String(ports.redis),
            "HERALD_LOCAL_KAFKA_PORT": String(ports.kafka), "HERALD_LOCAL_APNS_PORT": String(ports.apns),
            "HERALD_LOCAL_FCM_PORT": String(ports.fcm), "HERALD_LOCAL_METRICS_BASE": String(base),
        ]
        // Its output goes to a file (no pipe: the processes it leaves running would hold a pipe open for good).
        let log = run + ".log"
        let script = Paths.packageRoot + "/scripts/local-stack.sh"
        func stack(_ arguments: [String], _ step: String) async throws -> Int32? {
            let child = ChildProcess(
                name: "local-stack", executable: "/bin/bash", arguments: [script] + arguments + ["--run-dir", run],
                environment: environment, logPath: log + "." + step)
            try child.start()
            try await waitUntil(
                "scripts/local-stack.sh \(step) ended", timeout: .seconds(600), interval: .milliseconds(200)
            ) {
                !child.isRunning
            }
            return child.exitStatus
        }
        let status = try await stack(["--up", "--no-setup", "--no-build"], "up")
        defer {
            let stop = ChildProcess(
                name: "local-stack", executable: "/bin/bash", arguments: [script, "--stop", "--run-dir", run],
                environment: environment, logPath: log + ".stop")
            try? stop.start()
            _ = eventuallyBlocking(timeout: .seconds(120)) { !stop.isRunning }
        }
        let output = (try? String(contentsOfFile: log + ".up", encoding: .utf8)) ?? ""
        try #require(status == 0, "scripts/local-stack.sh --up failed:\n\(output.suffix(3000))")
        #expect(output.contains("registry API on http://127.0.0.1:\(base + 7)/v1"), "\(output.suffix(2000))")

        // The README's commands with this stack's ports and run directory.
        func localized(_ command: String) -> String {
            command.replacingOccurrences(of: "127.0.0.1:19207", with: "127.0.0.1:\(base + 7)")
                .replacingOccurrences(of: "run/local/api-token", with: run + "/api-token")
                .replacingOccurrences(of: "127.0.0.1:19192", with: "127.0.0.1:\(ports.kafka)")
        }
        let shell = [
            "PATH": Paths.binDirectory + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"),
            "HERALD_KAFKA_BROKERS": "127.0.0.1:\(ports.kafka)", "HERALD_REDIS_URL": "redis://127.0.0.1:\(ports.redis)",
        ]
        var prelude = ""
        for step in registering {
            let command = localized(step.command)
            if step.answer == nil {
                // An assignment the next commands use (API=..., AUTH=...).
                prelude += command + "\n"
                continue
            }
            let shown = try #require(step.answer)
            // Writes are applied asynchronously: a read is repeated until it shows what the README shows.
            var last = ""
            try await waitUntil(
                "README: \(step.command.prefix(60)) answers \(shown); it answered \(last)", timeout: .seconds(60),
                interval: .milliseconds(500)
            ) {
                last = try await runToolAsync("/bin/bash", ["-c", prelude + command], environment: shell).output
                return Self.matches(shown, last.trimmingCharacters(in: .whitespacesAndNewlines))
            }
        }

        let published = try await runToolAsync("/bin/bash", ["-c", localized(publish.command)], environment: shell)
        #expect(published.status == 0, "kcat: \(published.output)")

        // The explain, from heraldctl and from the API, once the pipeline decided.
        var answer = ""
        try await waitUntil(
            "README: \(explainLine) answers \(explainAnswer); it answered \(answer)", timeout: .seconds(90),
            interval: .milliseconds(500)
        ) {
            answer = try await runToolAsync("/bin/bash", ["-c", explainLine], environment: shell).output
            return Self.matches(explainAnswer, answer.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        let api = try await runToolAsync(
            "/bin/bash", ["-c", prelude + #"curl -s -H "$AUTH" "$API/users/u2/explain?event=m-1001""#],
            environment: shell)
        #expect(
            Self.matches(explainAnswer, api.output.trimmingCharacters(in: .whitespacesAndNewlines)),
            "the API's explain: \(api.output)")
    }
}
