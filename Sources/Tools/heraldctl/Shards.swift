import ArgumentParser
import Foundation
import HeraldCore
import HeraldRedis
import HeraldToolSupport

/// `heraldctl shards`: whether the pipeline file's shard counts suit the traffic (docs/capacity.md).
struct Shards: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check that the shard counts of the Redis keys that grow with traffic suit the deployment.",
        discussion: """
            Reads a sample of the shards of send's delivery records (the last whole replay window), the users' \
            latest decisions and the explain trail's logs (the last whole hour): entries per key, and how many \
            sampled hashes Redis keeps as hashtables instead of compact listpacks (past \
            hash-max-listpack-entries, 512 by default). Prints one JSON object per kind with the count to set \
            (idempotency.shards, explain.last_decision_shards, explain.log_shards): the entries over 100 a hash or \
            1,000 lines a log, never fewer than now. Exit status 4 when a sampled key is past its limit. Give the \
            counts and the window the pipeline file sets.
            """)

    @Option(name: .long, help: "App (tenant) id.") var app: String
    @Option(name: .long, help: "Shards read per kind.") var sample = 64
    @OptionGroup var layout: KeyLayoutOptions
    @OptionGroup var redis: RedisOptions

    func validate() throws {
        guard sample >= 1 else { throw ValidationError("--sample must be at least 1") }
    }

    func run() async throws {
        let store = await redis.store(deliveredShards: UInt64(layout.deliveryShards))
        let fills: [ShardFill]
        do {
            fills = try await store.shardFill(
                app: app, now: CLI.nowMillis(), window: layout.windowMilliseconds,
                lastDecisionShards: UInt64(layout.lastDecisionShards), logShards: UInt64(layout.logShards),
                sample: sample)
        } catch {
            CLI.fail("redis: \(error)")
        }
        let settings = [
            "delivered": "idempotency.shards", "last_decision": "explain.last_decision_shards",
            "explain_log": "explain.log_shards",
        ]
        for fill in fills {
            var object: [String: JSONValue] = [
                "kind": .string(fill.kind), "setting": .string(settings[fill.kind] ?? fill.kind),
                "shards": .int(fill.shards), "sampled": .int(fill.sampled),
                "mean_entries": .double((fill.meanEntries * 10).rounded() / 10), "max_entries": .int(fill.maxEntries),
                "limit": .int(fill.ceiling), "estimated_entries": .int(Int(fill.estimatedEntries.rounded())),
                "fits": .bool(fill.fits), "suggested_shards": .int(fill.suggestedShards),
            ]
            if let hashtables = fill.hashtables { object["hashtables"] = .int(hashtables) }
            CLI.out(CLI.json(object))
        }
        if fills.contains(where: { !$0.fits }) { throw ExitCode(4) }
    }
}
