// herald-registry: herald.registry (device, preference, presence, unread, member updates) and
// herald.token-feedback (dead tokens) -> Redis, in order per user; a mark_read's clear for the user's other devices
// -> herald.deliverable (docs/behaviour.md §6c); and, when configured, the registry HTTP API (API.swift), whose
// writes are herald.registry records.
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import HeraldRedis
import HeraldStage

let setup = await StageSetup.startOrExit(.registry)
let redis = setup.redisOrExit()
let topics = setup.pipeline.kafka.topics
let logger = setup.logger
let metrics = setup.context.metrics
let store = StateStore(connection: redis, logger: logger)
let writer = RedisRegistryWriter(
    store: store,
    presenceTTLMilliseconds: Int64(setup.pipeline.redis.presenceTTLSeconds) * 1000,
    preferenceLimits: setup.valueOrExit { c throws(ConfigurationError) in try RegistryAPIServer.preferenceLimits(c) })
var processor = RegistryProcessor(
    tokenFeedbackTopic: topics.tokenFeedback, writer: writer, apps: setup.pipeline.apps,
    onTransientFailure: { failure in
        metrics.redisError(code: "transient")
        logger.warning("redis unavailable; retrying", metadata: ["error": "\(failure)"])
    })
processor.readSync = RedisReadSyncStore(store: store)
processor.deliverableTopic = topics.deliverable
let api: StageHTTPServer?
do {
    api = try await RegistryAPIServer.make(setup: setup, redis: redis)
} catch {
    FileHandle.standardError.write(Data("herald-registry: \(error)\n".utf8))
    exit(2)
}
StageProcess.exit(
    await setup.run(
        processor: processor, topics: [topics.registry, topics.tokenFeedback], explain: setup.bestEffortExplainSink(),
        before: api.map { [$0] } ?? []))
