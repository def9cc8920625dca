// herald-bench: Herald's measuring tools (the fault suite is herald-chaos).
//   decide    decisions + rendered payloads per second on one core (the default)
//   pipeline  the whole local stack under a chosen load: throughput, latency, CPU, memory, exactness
//   stage     one stage fed alone with a backlog of its own input: its CPU per notification, memory, exactness
//   idle      each process's CPU, and the fleet's, while the local stack has no traffic
//   json      HeraldCore's JSON against Foundation's JSONDecoder/JSONEncoder on Herald's records
//   redis     building the per-recipient Redis commands: RedisCommand per command against RedisBatch
//   redis-callers  concurrent callers on one Redis connection across an injected round trip
//   spans     CPU per span of a stage's span exporter, exporting to herald-mock-otlp
import ArgumentParser

@main
struct HeraldBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "herald-bench",
        abstract: "Herald's measuring tools.",
        subcommands: [
            DecideBench.self, PipelineBench.self, StageBench.self, IdleBench.self, JSONBench.self, RedisBench.self,
            RedisCallersBench.self, SpansBench.self,
        ],
        defaultSubcommand: DecideBench.self)
}
