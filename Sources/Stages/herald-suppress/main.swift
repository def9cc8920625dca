// herald-suppress: herald.resolved -> herald.deliverable (keyed by recipient user id). Applies the rules
// of docs/behaviour.md §6; suppressions are counted by reason and written to the explain trail in Redis. Adds the
// translations an app's translator gives (§7a).
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import HeraldStage

let setup = await StageSetup.startOrExit(.suppress)
let topics = setup.pipeline.kafka.topics
// The apps (multi-device mode, user defaults, ...) are reloaded from the pipeline file on SIGHUP and when it changes.
let apps = LiveAppDirectory(setup.pipeline.apps)
let reloader = PipelineReloader.forStageOrExit(setup) { config in
    StageSetup.warnAboutTranslatorKeys(
        config.apps, environment: ProcessInfo.processInfo.environment, logger: setup.logger)
    apps.replace(with: config.apps)
}
// Burst coalescing (docs/behaviour.md §6a) keeps its small per-conversation state in Redis. Like the explain trail it
// is best effort here: Redis is not a readiness check, and when it fails a batch is delivered without coalescing.
let bursts = setup.bestEffortBurstLedger()
// The digest when Do Not Disturb or a snooze ends (docs/behaviour.md §6d) is counted in the same Redis.
let digests = bursts.map { RedisDigestLedger(store: $0.store) }
let metrics = setup.context.metrics
// Apps with a `translator:` get the texts their events carry no translation of from it (docs/behaviour.md §7a), kept
// in Redis; a failing cache is passed by, a failing translator sends the original text.
let translator = setup.translator { error in
    metrics.redisError(code: "transient")
    setup.logger.warning("translation cache unavailable; asking the translator", metadata: ["error": "\(error)"])
}
// One loop per lane; each writes to its own lane's herald.deliverable topic.
let lanes = Lane.allCases.map { lane in
    StageLane(
        lane, topics: [topics.resolved(lane)],
        processor: {
            var processor = SuppressProcessor(deliverableTopic: topics.deliverable(lane), apps: setup.pipeline.apps)
            processor.live = apps
            processor.bursts = bursts
            processor.lane = lane
            processor.digests = digests
            processor.onDigestFailure = { error in
                metrics.redisError(code: "transient")
                setup.logger.warning("digest state unavailable; not counted", metadata: ["error": "\(error)"])
            }
            processor.translator = translator
            processor.onBurstFailure = { error in
                metrics.redisError(code: "transient")
                setup.logger.warning(
                    "burst state unavailable; delivering without coalescing", metadata: ["error": "\(error)"])
            }
            return processor
        }())
}
let explain = setup.bestEffortExplainSink()
// The flush timer shows the messages a burst held back once its update interval has passed.
let services = setup.withDigests(
    before: setup.withBurstFlush(before: [reloader], ledger: bursts, apps: apps, explain: explain),
    ledger: digests, apps: apps, explain: explain)
StageProcess.exit(await setup.run(lanes: lanes, explain: explain, before: services))
