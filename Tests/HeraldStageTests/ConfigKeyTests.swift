import Foundation
import HeraldConfig
import HeraldStage
import HeraldTestSupport
import Testing

@Suite("Configuration keys")
struct ConfigKeyTests {
    /// The lines of docs/operations.md's environment table (from its header row to the first line that is not a row).
    static func documentedTable() throws -> String {
        let text = try String(contentsOfFile: Paths.packageRoot + "/docs/operations.md", encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard let start = lines.firstIndex(of: "| key | default | meaning |") else { return "" }
        return lines[start...].prefix { $0.hasPrefix("|") }.joined(separator: "\n")
    }

    @Test("docs/operations.md's environment table is the one ConfigKey.all generates")
    func docsTableMatchesDeclarations() throws {
        let documented = try Self.documentedTable()
        #expect(
            documented == ConfigKey.markdownTable,
            "replace the table in docs/operations.md, \"Environment\", with:\n\(ConfigKey.markdownTable)")
    }

    /// The defaults README.md and docs/*.md state in prose for a key: "`KEY` (default N)", "`KEY`, default N",
    /// "`KEY`, N, the default"; N as written (digits; `25 s` for a key in milliseconds is 25000, `7 days` for a key in
    /// seconds 604800).
    static func statedDefaults(in text: String, key: ConfigKey) throws -> [String] {
        let name = NSRegularExpression.escapedPattern(for: key.name)
        let patterns = [
            #"`\#(name)`[^|.\n]{0,12}?default:?\s+`?([0-9][0-9,]*)(\s*ms\b|\s*s\b|\s*days?\b)?"#,
            #"`\#(name)`,\s+`?([0-9][0-9,]*)`?(\s*ms\b|\s*s\b|\s*days?\b)?,\s+the default"#,
        ]
        var found: [String] = []
        for pattern in patterns {
            let regex = try NSRegularExpression(pattern: pattern)
            let range = NSRange(text.startIndex..., in: text)
            for match in regex.matches(in: text, range: range) {
                guard let value = Range(match.range(at: 1), in: text).map({ String(text[$0]) }) else { continue }
                var number = value.replacingOccurrences(of: ",", with: "")
                let unit = Range(match.range(at: 2), in: text).map { text[$0].trimmingCharacters(in: .whitespaces) }
                if unit == "s", key.name.hasSuffix("_MS"), let seconds = Int(number) { number = String(seconds * 1000) }
                if unit?.hasPrefix("day") == true, key.name.hasSuffix("_SECONDS"), let days = Int(number) {
                    number = String(days * 86_400)
                }
                found.append(number)
            }
        }
        return found
    }

    @Test("the defaults README.md and docs/ state in prose are the declared ones")
    func proseDefaultsMatchDeclarations() throws {
        let docs = Paths.packageRoot + "/docs"
        let files =
            ["README.md"]
            + (try FileManager.default.contentsOfDirectory(atPath: docs)).filter { $0.hasSuffix(".md") }.map {
                "docs/" + $0
            }
        var checked = 0
        for file in files {
            let text = try String(contentsOfFile: Paths.packageRoot + "/" + file, encoding: .utf8)
            for key in ConfigKey.all {
                guard let declared = key.defaultValue else { continue }
                for stated in try Self.statedDefaults(in: text, key: key) {
                    checked += 1
                    #expect(
                        stated == declared, "\(file) states \(key.name) defaults to \(stated); declared: \(declared)")
                }
            }
        }
        // The guide states at least the in-flight bound and the metrics port; a pattern that finds nothing checks
        // nothing.
        #expect(checked >= 2, "no stated default found: the patterns no longer match the docs' wording")
    }

    @Test("the prose patterns find what they are meant to find")
    func statedDefaultPatterns() throws {
        let text = """
            bound (`HERALD_SEND_MAX_IN_FLIGHT`, 10000, the default) and `HERALD_METRICS_PORT` (default 9100);
            within `HERALD_SHUTDOWN_DEADLINE_MS` (default 25 s). `HERALD_APNS_CONNECTIONS` is a count.
            Entries expire (`HERALD_EXPLAIN_TTL_SECONDS`, default 7 days).
            """
        #expect(try Self.statedDefaults(in: text, key: .sendMaxInFlight) == ["10000"])
        #expect(try Self.statedDefaults(in: text, key: .metricsPort) == ["9100"])
        #expect(try Self.statedDefaults(in: text, key: .shutdownDeadlineMs) == ["25000"])
        #expect(try Self.statedDefaults(in: text, key: .apnsConnections) == [])
        #expect(try Self.statedDefaults(in: text, key: .explainTTLSeconds) == ["604800"])
    }

    @Test("every key is declared once, named HERALD_*, and its default parses")
    func declarations() throws {
        let names = ConfigKey.all.map(\.name)
        #expect(Set(names).count == names.count)
        let config = ConfigReader([:])
        for key in ConfigKey.all {
            #expect(key.name.hasPrefix("HERALD_"))
            #expect(throws: Never.self) { _ = try config.text(key) }
        }
    }

    @Test(
        "every HERALD_* key the stage sources name is declared",
        arguments: ["Sources/Stages", "Sources/Pipeline", "Sources/Runtime"])
    func sourcesUseDeclaredKeys(folder: String) throws {
        let declared = Set(ConfigKey.all.map(\.name)).union(ConfigReader.heraldctlKeys)
        let root = Paths.packageRoot + "/" + folder
        let files = try #require(FileManager.default.enumerator(atPath: root)).compactMap { $0 as? String }
            .filter { $0.hasSuffix(".swift") }
        let pattern = try Regex("HERALD_[A-Z0-9_]*[A-Z0-9]")
        for file in files {
            let text = try String(contentsOfFile: root + "/" + file, encoding: .utf8)
            for match in text.matches(of: pattern) {
                let name = String(text[match.range])
                #expect(
                    declared.contains(name), "\(folder)/\(file) names \(name), which ConfigKey.all does not declare")
            }
        }
    }

    @Test(
        "a bad value is an error naming the key, for every key that parses",
        arguments: [
            ("HERALD_BATCH_SIZE", "0"), ("HERALD_MAX_IN_FLIGHT", "many"), ("HERALD_REDIS_PORT", "70000"),
            ("HERALD_SEND_MAX_IN_FLIGHT", "-5"), ("HERALD_SEND_PRIORITY_RESERVE_PERCENT", "95"),
            ("HERALD_PRIORITY_LANES", "maybe"), ("HERALD_APNS_TIMEOUT_MS", "1.5"),
        ])
    func badValue(name: String, value: String) throws {
        let key = try #require(ConfigKey.all.first { $0.name == name })
        let config = ConfigReader([name: value])
        #expect {
            _ = try config.text(key)
        } throws: { error in
            (error as? ConfigurationError)?.key == name
        }
    }

    @Test("unset and empty values take the default; a set value wins")
    func defaults() throws {
        #expect(try ConfigReader([:]).requiredInt(.sendMaxInFlight) == 2000)
        #expect(try ConfigReader(["HERALD_SEND_MAX_IN_FLIGHT": " "]).requiredInt(.sendMaxInFlight) == 2000)
        #expect(try ConfigReader(["HERALD_SEND_MAX_IN_FLIGHT": "10000"]).requiredInt(.sendMaxInFlight) == 10000)
        #expect(try ConfigReader([:]).text(.fcmHost) == nil)
        #expect(try ConfigReader(["HERALD_PRIORITY_LANES": "OFF"]).text(.priorityLanes) == "off")
    }

    @Test("the environment overrides the pipeline file's brokers and Redis address")
    func pipelineOverrides() throws {
        let loaded = try PipelineLoader.load(yaml: "kafka: {brokers: a:1}").config
        let c = try loaded.applying(ConfigReader(["HERALD_KAFKA_BROKERS": "b:2", "HERALD_REDIS_PORT": "7000"]))
        #expect(c.kafka.brokers == "b:2" && c.redis.port == 7000)
        #expect(try loaded.applying(ConfigReader([:])).kafka.brokers == "a:1")
        #expect(throws: ConfigurationError.self) { try loaded.applying(ConfigReader(["HERALD_REDIS_PORT": "x"])) }
    }
}
