// herald-render: herald.deliverable -> herald.outbound, one rendered APNs request per target device
// (keyed by device token). Render errors -> herald.dlq. Templates, catalogs and payload options are reloaded from
// the pipeline file on SIGHUP and when the file changes (PipelineReloader).
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import HeraldStage

let setup = await StageSetup.startOrExit(.render)
let topics = setup.pipeline.kafka.topics
let apps = LiveAppDirectory(setup.pipeline.apps)
let reloader = PipelineReloader.forStageOrExit(setup) { config in apps.replace(with: config.apps) }
// One loop per lane; each writes to its own lane's herald.outbound topic.
let lanes = Lane.allCases.map { lane in
    StageLane(
        lane, topics: [topics.deliverable(lane)],
        processor: RenderProcessor(outboundTopic: topics.outbound(lane), live: apps))
}
StageProcess.exit(await setup.run(lanes: lanes, explain: setup.bestEffortExplainSink(), before: [reloader]))
