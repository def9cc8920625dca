import Foundation
import HeraldPushProviders
import HeraldStage
import HeraldTestSupport
import MetricsTestKit
import Testing

@Suite("Metric declarations")
struct MetricDeclarationTests {
    /// Every metric a stage process exports: HeraldStage's own, herald-send's APNs, FCM and Web Push clients', and the Kafka
    /// consumer's error counter.
    static var all: [MetricDeclaration] {
        var out = StageMetrics.declarations
        for (prefix, labels) in [
            ("herald_apns", "stage, app, bundle_id, environment"), ("herald_fcm", "stage, app, provider_id"),
            ("herald_webpush", "stage, app, origin"),
        ] {
            for family in ClientMetricFamilies.families(prefix: prefix) {
                let extra = family.name.hasSuffix("_answers_total") ? ", status, reason" : ""
                out.append(
                    MetricDeclaration(family.name, family.type, labels: labels + extra, stages: "send", family.meaning))
            }
        }
        out += StageMetrics.kafkaConsumerDeclarations
        out += StageMetrics.processDeclarations
        return out
    }

    static func documentedTable() throws -> String {
        let text = try String(contentsOfFile: Paths.packageRoot + "/docs/operations.md", encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard let start = lines.firstIndex(of: "| metric | type | labels | exported by | meaning |") else { return "" }
        return lines[start...].prefix { $0.hasPrefix("|") }.joined(separator: "\n")
    }

    @Test("docs/operations.md's metrics table is the one the declarations generate")
    func docsTableMatchesDeclarations() throws {
        let expected = MetricDeclaration.markdownTable(Self.all)
        #expect(
            try Self.documentedTable() == expected,
            "replace the table in docs/operations.md, \"Metrics\", with:\n\(expected)")
    }

    @Test("each metric is declared once")
    func unique() {
        let names = Self.all.map(\.name)
        #expect(Set(names).count == names.count)
    }

    @Test(
        "no source of a stage names a herald_* metric that is not declared",
        arguments: ["Sources/Runtime", "Sources/Pipeline", "Sources/Stages"])
    func sourcesNameDeclaredMetrics(folder: String) throws {
        let declared = Set(Self.all.map(\.name))
        let root = Paths.packageRoot + "/" + folder
        let files = try #require(FileManager.default.enumerator(atPath: root)).compactMap { $0 as? String }
            .filter { $0.hasSuffix(".swift") }
        let pattern = try Regex(#""herald_[a-z0-9_]+""#)
        for file in files {
            let text = try String(contentsOfFile: root + "/" + file, encoding: .utf8)
            for match in text.matches(of: pattern) {
                let name = String(text[match.range].dropFirst().dropLast())
                #expect(declared.contains(name), "\(folder)/\(file) names \(name), which no declaration lists")
            }
        }
    }

    @Test("a stage's metrics start with only the series every stage exports (no provider metrics)")
    func noProviderSeriesOutsideSend() throws {
        let metrics = TestMetrics()
        _ = StageMetrics(stage: "resolve", factory: metrics)
        let created =
            metrics.counters.map(\.label) + metrics.meters.map(\.label) + metrics.recorders.map(\.label)
            + metrics.timers.map(\.label)
        #expect(
            created.allSatisfy {
                !$0.hasPrefix("herald_apns") && !$0.hasPrefix("herald_fcm") && !$0.hasPrefix("herald_webpush")
                    && !$0.contains("jwt")
            },
            "\(created)")
        let everyStage = Set(StageMetrics.declarations.filter { $0.stages == "every stage" }.map(\.name))
        #expect(Set(created).isSubset(of: everyStage), "\(created)")
    }
}
