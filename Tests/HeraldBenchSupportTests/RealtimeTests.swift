// `--realtime`: the bench moves every thread of the stack's processes (found by their pid files) to SCHED_RR.
import Foundation
import Glibc
import Testing

@testable import HeraldBenchSupport

@Suite("Real-time scheduling for a bench's stack")
struct RealtimeTests {
    /// A run directory whose pid files name two live processes of two threads each (a stage and the stand-in),
    /// one that has exited (another stage) and none (a third).
    func stack() throws -> (info: StackInfo, live: [Process], dir: String) {
        let dir = NSTemporaryDirectory() + "herald-realtime-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        func start() throws -> Process {
            // A second thread (a background `sleep` job inside bash would be a process): python's threading.
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            p.arguments = [
                "-c", "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); time.sleep(60)",
            ]
            try p.run()
            return p
        }
        let resolve = try start()
        let stand = try start()
        let gone = Process()
        gone.executableURL = URL(fileURLWithPath: "/bin/true")
        try gone.run()
        gone.waitUntilExit()
        try "\(resolve.processIdentifier)\n".write(toFile: dir + "/resolve.pid", atomically: true, encoding: .utf8)
        try "\(stand.processIdentifier)\n".write(toFile: dir + "/mock-apns.pid", atomically: true, encoding: .utf8)
        try "\(gone.processIdentifier)\n".write(toFile: dir + "/send.pid", atomically: true, encoding: .utf8)
        // A pid file that names no process (0 would be the bench's own process group to kill(2)).
        try "0\n".write(toFile: dir + "/render.pid", atomically: true, encoding: .utf8)
        let info = StackInfo(
            run: dir, bin: "", redisPort: 1, kafkaPort: 1, apnsPort: 1, metricsBase: 1, mockMetricsPort: 1,
            apiPort: nil, apiToken: nil, redisAOF: false, kafkaS3: false, broker: "dev", redisCluster: false,
            redisURL: "")
        return (info, [resolve, stand], dir)
    }

    @Test("every thread of each live process gets SCHED_RR 10, or the kernel's refusal is an error that says why")
    func movesEveryThread() throws {
        let (info, live, dir) = try stack()
        defer {
            for p in live { p.terminate() }
            try? FileManager.default.removeItem(atPath: dir)
        }
        // Both python processes have started their second thread (a start that never comes fails the test).
        for p in live {
            var waited = 0
            while threadIDs(of: p.processIdentifier).count < 2 && p.isRunning && waited < 6_000 {
                usleep(10_000)
                waited += 1
            }
            try #require(threadIDs(of: p.processIdentifier).count == 2, "python's second thread never started")
        }
        if geteuid() == 0 {
            let given = try BenchSession.makeRealtime(info)
            #expect(given == ["resolve", "mock-apns"])
            for p in live {
                let tids = threadIDs(of: p.processIdentifier)
                #expect(tids.count == 2)
                for tid in tids {
                    #expect(sched_getscheduler(tid) == SCHED_RR, "thread \(tid)")
                    var param = sched_param()
                    #expect(sched_getparam(tid, &param) == 0)
                    #expect(param.sched_priority == 10)
                }
            }
        } else {
            // Without root or CAP_SYS_NICE the kernel refuses, and the bench must stop rather than measure
            // something else than it says.
            let error = #expect(throws: BenchError.self) { try BenchSession.makeRealtime(info) }
            #expect(error?.description.contains("CAP_SYS_NICE") == true)
            for p in live {
                for tid in threadIDs(of: p.processIdentifier) { #expect(sched_getscheduler(tid) != SCHED_RR) }
            }
        }
    }
}
