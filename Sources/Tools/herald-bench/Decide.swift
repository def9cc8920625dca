// herald-bench decide: recipient decisions plus rendered payloads per second on one
// core, for a 50-member group with mixed preferences and the Sendbird profile.
// The event is decoded once (as the stages do); each recipient is decided and,
// when delivered, rendered into APNs requests with their payload bytes.

import ArgumentParser
import Foundation
import HeraldBenchSupport
import HeraldCore

struct DecideBench: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "decide",
        abstract: "Measure decisions + rendered payloads per second on one core (50-member group, Sendbird profile).")

    @Option(help: "Seconds to measure after warm-up.")
    var seconds: Double = 3

    @Option(help: "Members of the group.")
    var members: Int = 50

    func run() throws {
        let workload = try DecideWorkload(members: members)
        let event = workload.event
        let states = workload.states
        func round() -> (decisions: Int, payloads: Int, bytes: Int) { workload.round() }

        // Warm up (fills the time zone cache, faults in code).
        for _ in 0..<200 { _ = round() }
        func threadCPUSeconds() -> Double {
            var ts = timespec()
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)
            return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
        }
        let clock = ContinuousClock()
        let cpuStart = threadCPUSeconds()
        var decisions = 0, payloads = 0, bytes = 0
        let start = clock.now
        let deadline = start.advanced(by: .milliseconds(Int(seconds * 1000)))
        var rounds = 0
        while clock.now < deadline {
            for _ in 0..<20 {
                let r = round()
                decisions += r.decisions
                payloads += r.payloads
                bytes &+= r.bytes
                rounds += 1
            }
        }
        let elapsed = clock.now - start
        let cpu = threadCPUSeconds() - cpuStart
        let secs = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let perRound = round()
        print("herald-bench: \(members)-member group, Sendbird profile, mixed preferences, one thread")
        print(
            "  per event: \(perRound.decisions) decisions, \(perRound.payloads) payloads (\(perRound.payloads > 0 ? perRound.bytes / perRound.payloads : 0) bytes average)"
        )
        print(String(format: "  %d events in %.2f s wall, %.2f s on-CPU (this thread)", rounds, secs, cpu))
        print(String(format: "  rendered payloads per wall second:  %.0f", Double(payloads) / secs))
        print(String(format: "  recipients (decision + render) per wall second:  %.0f", Double(decisions) / secs))
        print(
            String(
                format: "  recipients (decision + render) per CPU second:   %.0f  (one core; target 150000)",
                Double(decisions) / cpu))

        /// Runs `body` for about `budget` CPU-seconds of this thread; how many times a CPU-second.
        func perCPUSecond(_ body: () throws -> Void) rethrows -> Double {
            let budget = min(1.0, seconds / 3)
            let start = threadCPUSeconds()
            var count = 0
            while threadCPUSeconds() - start < budget {
                for _ in 0..<100 { try body() }
                count += 100
            }
            return Double(count) / (threadCPUSeconds() - start)
        }

        // Stage record codec: what suppress/render pay per recipient on Kafka.
        let (user, sample) = states[1]
        let record = DeliverableRecord(event: event, recipient: "u1", state: sample, targets: sample.devices)
        let encoded = StageCodec.encode(record)
        let codec = try perCPUSecond {
            let bytes = StageCodec.encode(record)
            _ = try StageCodec.decode(DeliverableRecord.self, from: bytes)
        }
        print(
            String(
                format: "  herald.deliverable record (%d bytes) encode + decode per CPU second: %.0f",
                encoded.count, codec))

        // Suppress's read of a resolved record and the deliverable it writes, with the event not seen before (as in
        // a backlog, where an event's recipients are thousands of records apart): the whole record decoded and the
        // deliverable encoded, against the fields the rules read and the deliverable put together from the bytes.
        let resolved = StageCodec.encode(ResolvedRecord(event: event, recipient: user, state: sample))
        let whole = try perCPUSecond {
            var reuse = EventReuse()
            let read = try BinaryRecordFormat.decode(ResolvedRecord.self, from: resolved, reusing: &reuse)
            var state = read.state
            state.devices = []
            state.online = []
            _ = DeliverableRecord(
                event: read.event, recipient: read.recipient, state: state, targets: read.state.devices,
                senderDisplayName: read.senderDisplayName
            ).wireBytes()
        }
        let forwarded = try perCPUSecond {
            var reuse = EventReuse()
            let read = try ResolvedRecord.readForRules(resolved, reusing: &reuse)
            guard let parts = read.forwarded else { return }
            _ = DeliverableRecord.wireBytes(forwarding: parts, targets: read.record.state.devices, burst: nil)
        }
        print(
            String(
                format:
                    "  herald.resolved (%d bytes) to herald.deliverable per CPU second: %.0f whole, %.0f read for the rules (%.2fx)",
                resolved.count, whole, forwarded, forwarded / whole))
    }
}

/// The decide benchmark's work: one event to a group with mixed preferences, each member decided and rendered.
/// The pipeline benchmark runs it for a second before and after a run as a marker of the host's speed
/// (`hostRecipientsPerCPUSecond`): CPU-seconds per notification measured on different days compare only after
/// scaling by it.
struct DecideWorkload {
    let members: Int
    let app: AppConfig
    let event: ChatEvent
    let states: [(String, UserState)]
    let now: Date

    init(members: Int = 50) throws {
        self.members = members
        let app = AppConfig(
            appID: "bench", payloadProfile: .sendbird(key: "sendbird"), multiDevice: .anyOffline,
            templates: TemplateConfig(customTypes: [
                "support": TemplatePair(
                    text: "[{channel_name}] {sender_name}: {message}", file: "{file_type_friendly}: {filename}")
            ]),
            credentials: [APNsCredential(bundleID: "com.example.chat", teamID: "T", keyID: "K", keyFile: "k.p8")])
        // The same event as herald-bench json's.
        let event = try ChatEvent.decode(Array(JSONBench.eventJSON.utf8))
        let languages = [["en"], ["fr", "en"], ["ko"], ["zh"], [], ["de"]]
        let zones = ["Asia/Seoul", "Europe/Paris", "America/New_York", "UTC"]
        var states: [(String, UserState)] = []
        for i in 0..<members {
            var prefs = Preferences()
            prefs.languages = languages[i % languages.count]
            if i % 5 == 1 { prefs.template = .alternative }
            if i % 9 == 2 { prefs.displayStyle = .simpleBanner }
            if i % 7 == 3 { prefs.trigger = .mentionOnly }
            if i % 6 == 4 {
                prefs.dnd = DoNotDisturb(
                    start: ClockTime(hour: 22), end: ClockTime(hour: 8), timezone: zones[i % zones.count])
            }
            if i % 11 == 5 { prefs.snooze = Snooze(start: 1_731_990_000_000, end: 1_732_010_000_000) }
            if i % 13 == 6 { prefs.conversations["c-hiking"] = ConversationPreference(trigger: .default, muted: true) }
            if i % 8 == 7 { prefs.badge = false }
            var state = UserState(preferences: prefs, unread: Unread(total: i % 17, conversations: ["c-hiking": i % 4]))
            let deviceCount = 1 + i % 3
            for d in 0..<deviceCount {
                let token = String(repeating: String(format: "%02x", (i * 7 + d) % 256), count: 32)
                state.register(Device(token: token, kind: .apns, registeredAt: Int64(1_731_000_000_000 + d)))
            }
            if i % 10 == 0, let first = state.devices.first { state.online = [first.token] }
            states.append(("u\(i)", state))
        }
        let now = Date(timeIntervalSince1970: 1_732_000_000)

        self.app = app
        self.event = event
        self.states = states
        self.now = now
    }

    func round() -> (decisions: Int, payloads: Int, bytes: Int) {
        var decisions = 0, payloads = 0, bytes = 0
        for (user, state) in states {
            let decision = Suppression.decide(event: event, recipient: user, state: state, app: app, now: now)
            decisions += 1
            if case .deliver(let targets) = decision {
                do {
                    let requests = try Renderer.render(
                        event: event, recipient: user, state: state, targets: targets,
                        app: app, now: now)
                    payloads += requests.count
                    for r in requests { bytes &+= r.payload.count }
                } catch {
                    print("render failed: \(error)")
                }
            }
        }
        return (decisions, payloads, bytes)
    }

    /// Recipients decided and rendered per CPU-second of this thread, over `seconds` of CPU time after a short
    /// warm-up: the decide benchmark's figure (585,000-623,000 on a quiet 2-core host, 154,000-269,000 on a busy
    /// one; docs/performance.md).
    static func hostRecipientsPerCPUSecond(seconds: Double = 1) -> Double? {
        guard let workload = try? DecideWorkload() else { return nil }
        for _ in 0..<50 { _ = workload.round() }
        let start = HeraldBenchClock.threadCPUNanoseconds()
        var decisions = 0
        while Double(HeraldBenchClock.threadCPUNanoseconds() - start) < seconds * 1e9 {
            decisions += workload.round().decisions
        }
        return Double(decisions) / (Double(HeraldBenchClock.threadCPUNanoseconds() - start) / 1e9)
    }
}
