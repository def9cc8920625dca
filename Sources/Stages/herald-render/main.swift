// herald-render: herald.deliverable -> herald.outbound, one rendered APNs request per target device
// (keyed by device token). Render errors -> herald.dlq.
import Foundation
import HeraldConfig
import HeraldCore
import HeraldPipeline
import HeraldStage

let setup = await StageSetup.startOrExit(.render)
let topics = setup.pipeline.kafka.topics
// One loop per lane; each writes to its own lane's herald.outbound topic.
let lanes = Lane.allCases.map { lane in
    StageLane(lane, topics: [topics.deliverable(lane)],
              processor: RenderProcessor(outboundTopic: topics.outbound(lane), apps: setup.pipeline.apps))
}
exit(await setup.run(lanes: lanes, explain: setup.bestEffortExplainSink()))
