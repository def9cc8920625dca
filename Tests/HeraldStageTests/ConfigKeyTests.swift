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

    @Test("every HERALD_* key the stage sources name is declared", arguments: ["Sources/Stages", "Sources/Runtime"])
    func sourcesUseDeclaredKeys(folder: String) throws {
        let declared = Set(ConfigKey.all.map(\.name))
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
