// herald-suppress: herald.resolved -> herald.deliverable (keyed by recipient user id). Applies the rules
// of docs/behaviour.md §6; suppressions are counted by reason and written to the explain trail in Redis.
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import HeraldStage

let setup = await StageSetup.startOrExit(.suppress)
let topics = setup.pipeline.kafka.topics
// The apps (multi-device mode, user defaults, ...) are reloaded from the pipeline file on SIGHUP and when it changes.
let apps = LiveAppDirectory(setup.pipeline.apps)
let reloader = PipelineReloader.forStageOrExit(setup) { config in apps.replace(with: config.apps) }
// One loop per lane; each writes to its own lane's herald.deliverable topic.
let lanes = Lane.allCases.map { lane in
    StageLane(
        lane, topics: [topics.resolved(lane)],
        processor: {
            var processor = SuppressProcessor(deliverableTopic: topics.deliverable(lane), apps: setup.pipeline.apps)
            processor.live = apps
            return processor
        }())
}
StageProcess.exit(await setup.run(lanes: lanes, explain: setup.bestEffortExplainSink(), before: [reloader]))
